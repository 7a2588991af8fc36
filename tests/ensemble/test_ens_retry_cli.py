"""``shoal run --retries N --retry-delay SPEC``: the run's default for tasks that give none
(a task's own, then its stage's, come first), counted from side-effect files and spaced as
the journal's timestamps show; the resume command carries the flags; bad specs are usage
errors naming the text."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

import shoal
from shoal.cli import build_parser, main
from shoal.patterns.ensemble.commands import resume_command


def _flaky(count, fail_times: int) -> str:
    """A shell line that fails ``fail_times`` times, then succeeds (runs counted in ``count``)."""
    return (f'n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; '
            f'[ "$n" -gt {fail_times} ]')


def _workflow(tmp_path, stage_extra="", task_extra="") -> str:
    wf = tmp_path / "wf.yaml"
    wf.write_text(f"""
pipelines:
  - name: p
    stages:
      - name: s
{stage_extra}
        tasks:
          - {{executable: /bin/sh, name: f, arguments: ['-c', '{_flaky(tmp_path / "count", 2)}']{task_extra}}}
""")
    return str(wf)


def _spacing(db, uid) -> list[float]:
    """Seconds between each attempt's end and the next one's start, from the journal."""
    with contextlib.closing(sqlite3.connect(db)) as c:
        rows = c.execute("SELECT started, finished FROM failed_attempts WHERE uid=? ORDER BY attempt",
                         (uid,)).fetchall()
        rows.append(c.execute("SELECT started, finished FROM tasks WHERE uid=?", (uid,)).fetchone())
    return [b[0] - a[1] for a, b in zip(rows, rows[1:], strict=False)]


def _runs(tmp_path) -> int:
    return int((tmp_path / "count").read_text())


def test_retries_and_a_fixed_delay_from_the_command_line(tmp_path):
    db = str(tmp_path / "run.db")
    assert main(["run", _workflow(tmp_path), "--journal", db, "--retries", "2", "--retry-delay", "0.3"]) == 0
    assert _runs(tmp_path) == 3  # failed twice, then succeeded
    gaps = _spacing(db, "p.s.f")
    assert len(gaps) == 2 and all(g >= 0.3 - 0.005 for g in gaps), gaps


def test_backoff_spec_doubles_the_delay(tmp_path):
    db = str(tmp_path / "run.db")
    assert main(["run", _workflow(tmp_path), "--journal", db, "--retries", "2",
                 "--retry-delay", "base=0.2,factor=2,cap=5"]) == 0
    first, second = _spacing(db, "p.s.f")
    assert first >= 0.2 - 0.005 and second >= 0.4 - 0.005, (first, second)


def test_too_few_retries_fail_and_the_stage_and_task_come_first(tmp_path):
    db = str(tmp_path / "run.db")
    assert main(["run", _workflow(tmp_path), "--journal", db, "--retries", "1"]) == 1
    assert _runs(tmp_path) == 2
    # the stage's retries: 0 wins over --retries 5
    (tmp_path / "count").unlink()
    assert main(["run", _workflow(tmp_path, stage_extra="        retries: 0"), "--journal", db, "--new",
                 "--retries", "5"]) == 1
    assert _runs(tmp_path) == 1
    # the task's own retries and retry_delay win over the stage's and the run's
    (tmp_path / "count").unlink()
    wf = _workflow(tmp_path, stage_extra="        retries: 0\n        retry_delay: 5",
                   task_extra=", retries: 2, retry_delay: 0.2")
    assert main(["run", wf, "--journal", db, "--new", "--retries", "0", "--retry-delay", "9"]) == 0
    assert _runs(tmp_path) == 3
    assert all(0.2 - 0.005 <= g < 5 for g in _spacing(db, "p.s.f"))  # not the stage's 5 s, nor 9 s


def test_the_resume_command_carries_the_flags():
    parser = build_parser()
    args = parser.parse_args(["run", "wf.yaml", "--retries", "3", "--retry-delay", "base=1,cap=30,jitter=0.1"])
    line = resume_command(args)
    assert "--retries 3" in line and "--retry-delay base=1,factor=2,cap=30,jitter=0.1" in line
    again = parser.parse_args(line.split()[1:])  # what it says parses back to the same policy
    assert again.retry_delay == shoal.Backoff(base=1, factor=2, cap=30, jitter=0.1) and again.retries == 3
    assert "--retry" not in resume_command(parser.parse_args(["run", "wf.yaml"]))
    assert "--retry-delay 2.5" in resume_command(parser.parse_args(["run", "wf.yaml", "--retry-delay", "2.5"]))
    exact = resume_command(parser.parse_args(["run", "wf.yaml", "--retry-delay", "0.123456789"]))
    assert parser.parse_args(exact.split()[1:]).retry_delay == 0.123456789  # not rounded to 0.123457


@pytest.mark.parametrize("spec, words", [
    ("-1", "seconds >= 0"), ("2s", "expected seconds (5) or backoff fields"),
    ("base=1,spread=2", "expected seconds (5) or backoff fields"), ("base=x", "base='x'"),
    ("base=5,cap=1", "the cap must be >= the base"), ("jitter=1.5", "jitter is a fraction")])
def test_bad_retry_delay_specs_are_usage_errors(tmp_path, capsys, spec, words):
    assert main(["run", str(tmp_path / "wf.yaml"), "--retry-delay", spec]) == 2
    err = capsys.readouterr().err
    assert "--retry-delay" in err and words in err, err


def test_negative_retries_is_a_usage_error(tmp_path, capsys):
    assert main(["run", str(tmp_path / "wf.yaml"), "--retries", "-1"]) == 2
    assert "--retries" in capsys.readouterr().err
