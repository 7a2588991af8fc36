"""Trying to break the ensemble (issue 14, bullet 8): each test failed before the fix.

Symlinks left in a sandbox, a second live driver, a NaN timeout, journal I/O errors
(a directory, a corrupt file, a full disk), and a crafted journal that would run code.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from ens_tasks import ROOT, square

from shoal.cli import main as cli_main
from shoal.ensemble import EnsembleError, Input, Pipeline, Stage, Task, TaskState, run
from shoal.patterns.ensemble.yamlfile import load_yaml


def shoal_cli(*args, cwd, timeout=120, preexec_fn=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd, preexec_fn=preexec_fn)


def test_staging_does_not_follow_a_symlink_left_by_an_earlier_attempt(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "in.txt").write_text("precious")
    src = tmp_path / "data.txt"
    src.write_text("input")
    # attempt 1 replaces its staging directory by a link to `outside` and fails; attempt 2 stages again
    t = Task(executable="/bin/sh", name="t", retries=1, inputs=[Input(str(src), "sub/in.txt")],
             arguments=["-c", f'if [ -e marker ]; then cat sub/in.txt; else touch marker; rm -rf sub; '
                              f'ln -s {outside} sub; exit 1; fi'])
    report = run(Pipeline([Stage([t])], name="p"), journal=str(tmp_path / "run.db"))
    assert report.ok, report
    assert (outside / "in.txt").read_text() == "precious"  # was: deleted and overwritten
    assert (tmp_path / "run.sandbox/p/s0/t/stdout").read_text() == "input"


def test_second_live_driver_is_refused_with_the_first_ones_pid(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text('from shoal.ensemble import *\nworkflow = Pipeline([Stage([Task(executable="/bin/sh", '
                  'arguments=["-c", "echo 1 >> ../../../../runs; while [ ! -e ../../../../go ]; do sleep 0.05; '
                  'done"]) for _ in range(6)])])\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.Popen([sys.executable, "-m", "shoal", "run", str(wf), "--workers", "2"], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "runs").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        second = shoal_cli("run", wf, "--resume", cwd=tmp_path)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"in use by another live driver (pid {first.pid} host" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        (tmp_path / "go").write_text("")  # the first driver's tasks wait for this
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, out + err
    assert len((tmp_path / "runs").read_text().split()) == 6  # nothing ran twice
    # once the first driver is gone (even by SIGKILL: the kernel drops its flock) a resume works
    again = shoal_cli("run", wf, "--resume", cwd=tmp_path)
    assert again.returncode == 0


def test_nan_and_infinite_timeouts_are_refused(tmp_path):
    for bad in (float("nan"), float("inf"), True):
        with pytest.raises(EnsembleError, match="timeout must be a finite number"):
            Task(executable="/bin/true", timeout=bad).validate()
    wf = tmp_path / "wf.yaml"
    wf.write_text("pipelines:\n  - stages:\n      - tasks:\n          - executable: /bin/true\n"
                  "            timeout: .nan\n")
    with pytest.raises(EnsembleError, match=r"wf.yaml:5: .*timeout: must be a finite number"):
        load_yaml(str(wf))


WF = 'from shoal.ensemble import *\nworkflow = Pipeline([Stage([Task(executable="/bin/true")])])\n'


@pytest.mark.parametrize("case", ["directory", "garbage", "damaged_sqlite", "missing_parent", "fifo"])
def test_journal_errors_exit_2_with_a_clear_message(tmp_path, case, capsys):
    wf = tmp_path / "wf.py"
    wf.write_text(WF)
    journal = tmp_path / "run.db"
    expect = {"directory": "is a directory", "garbage": "not a shoal journal",
              "damaged_sqlite": "not a shoal journal (not SQLite, or damaged)",
              "missing_parent": "does not exist; create it first",
              "fifo": "is not a regular file"}[case]  # a FIFO blocked open() for good
    if case == "directory":
        journal.mkdir()
    elif case == "garbage":
        journal.write_bytes(os.urandom(4096))
    elif case == "damaged_sqlite":
        journal.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    elif case == "fifo":
        os.mkfifo(journal)
    else:
        journal = tmp_path / "nope" / "run.db"
    for cmd in (["run", wf, "--journal", journal], ["run", wf, "--journal", journal, "--resume"],
                ["status", journal]):
        rc = cli_main([str(c) for c in cmd])  # in-process: the same handler and error path as `shoal`
        err = capsys.readouterr().err
        assert rc == 2, (cmd, err)
        want = "no journal at" if case == "missing_parent" and cmd[0] == "status" else expect
        assert err.startswith("shoal: error: ") and want in err, (cmd, err)
    # and once through a real `shoal` process: one line on stderr, exit status 2, no traceback
    out = shoal_cli("run", wf, "--journal", journal, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and expect in out.stderr


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (96 * 1024, 96 * 1024))


def test_disk_full_mid_run_exits_2_and_leaves_a_resumable_journal(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text('from shoal.ensemble import *\nworkflow = Pipeline([Stage([Task(executable="/bin/sh", '
                  'arguments=["-c", "head -c 1500 /dev/zero | tr \\"\\\\\\\\0\\" x >&2; exit 1"]) '
                  'for _ in range(300)])])\n')
    out = shoal_cli("run", wf, "--workers", 2, cwd=tmp_path, preexec_fn=_limit_file_size)
    assert out.returncode == 2, out.stdout + out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "shoal: error: journal" in out.stderr and "full" in out.stderr, out.stderr[-2000:]
    # with room again, the run resumes from what was committed
    again = shoal_cli("run", wf, "--workers", 2, "--resume", cwd=tmp_path)
    assert again.returncode == 1 and "300 failed" in again.stdout, again.stdout[-500:] + again.stderr[-2000:]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories; run as a normal user")
def test_read_only_directory_exits_2(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text(WF)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    out = shoal_cli("run", wf, "--journal", ro / "run.db", cwd=tmp_path)
    assert out.returncode == 2 and "cannot be written" in out.stderr or "Permission denied" in out.stderr


class _Bomb:
    def __reduce__(self):
        return (os.system, (f"touch {_Bomb.marker}",))


def test_a_crafted_journal_does_not_run_code_on_resume(tmp_path):
    j = str(tmp_path / "run.db")
    seen = []

    def check(ctx):
        seen.append(ctx.results["p.s0.t0"])

    def wf():
        return Pipeline([Stage([Task(function=square, args=(3,))], post_exec=check), Stage([])], name="p")

    assert run(wf, journal=j).ok and seen == [9]
    _Bomb.marker = str(tmp_path / "pwned")
    db = sqlite3.connect(j)
    db.execute("UPDATE tasks SET result=? WHERE uid='p.s0.t0'", (b"P" + pickle.dumps(_Bomb()),))
    db.commit()
    db.close()
    with pytest.raises(EnsembleError, match=r"stored with pickle .*values='pickle'"):
        run(wf, journal=j, resume=True)
    assert not os.path.exists(_Bomb.marker)  # was: pickle.loads ran os.system
    db = sqlite3.connect(j)
    db.execute("UPDATE tasks SET result=? WHERE uid='p.s0.t0'", (pickle.dumps(_Bomb()),))  # untagged
    db.commit()
    db.close()
    with pytest.raises(EnsembleError, match="not in a format"):
        run(wf, journal=j, resume=True)
    assert not os.path.exists(_Bomb.marker)


def test_results_round_trip_as_data_and_pickle_is_an_explicit_opt_in(tmp_path):
    import numpy as np
    from ens_tasks import make_object, make_value

    j = str(tmp_path / "run.db")
    wf = Pipeline([Stage([Task(function=make_value, name="v"), Task(function=make_object, name="o")])], name="p")
    report = run(wf, journal=j)
    v = report.result("p.s0.v")
    assert v["t"] == (1, 2) and v["s"] == {3} and v[7] == 2 ** 80 and isinstance(v["a"], np.ndarray)
    assert v["a"].tolist() == [[0, 1], [2, 3]]
    with pytest.raises(EnsembleError, match="cannot store; return plain data"):
        report.result("p.s0.o")
    pj = str(tmp_path / "pickled.db")
    report = run(wf, journal=pj, values="pickle")
    assert report.result("p.s0.o", values="pickle").x == 5
    with pytest.raises(EnsembleError, match="pickle"):
        run(wf, journal=pj, resume=True)  # reading it back needs the same opt-in
    assert run(wf, journal=pj, resume=True, values="pickle").ok
    assert report.counts[TaskState.DONE] == 2
