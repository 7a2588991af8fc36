"""Breaking issue 14's ensembles the way users and attackers use them (fourth round).

Real processes throughout: `shoal run` / `shoal status` as subprocesses, real SQLite journals,
real victims for the journal's trust boundary.  Each test failed before its fix (or is a strict
xfail naming the open finding in another owner's file, so it flips when that is fixed).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shoal_cli(*args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


def write_wf(tmp_path, body: str, name: str = "wf.py"):
    path = tmp_path / name
    path.write_text("from shoal.ensemble import Pipeline, Stage, Task\n" + body)
    return path


# -- the journal is a trust boundary -------------------------------------------------------
@pytest.mark.xfail(strict=True, reason="r-ens3 (launcher.kill_leftover / journal.take_over): a crafted "
                   "journal's RUNNING row makes --resume SIGKILL any process whose pid and start time it "
                   "names; /work/wt/notes/r-break3.md F1")
def test_a_crafted_journal_cannot_make_resume_kill_a_stranger(tmp_path):
    wf = write_wf(tmp_path, "workflow = [Pipeline([Stage([Task(executable='/bin/true')])])]\n")
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)  # not started by shoal
    try:
        assert shoal_cli("run", wf, cwd=tmp_path).returncode == 0
        db = sqlite3.connect(tmp_path / "run.db")
        db.execute("UPDATE tasks SET state='running', pid=?, pid_start=?",
                   (victim.pid, psutil.Process(victim.pid).create_time()))
        db.commit()
        db.close()
        r = shoal_cli("run", wf, "--resume", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        time.sleep(0.2)
        assert victim.poll() is None, "the resume SIGKILLed a process shoal never started"
    finally:
        victim.kill()
        victim.wait()


# -- the command line: every bad option is one line and exit status 2 -------------------------
@pytest.mark.parametrize("args, words", [
    (("run", "wf.py", "--workers", "0"), "--workers: expected a whole number >= 1"),
    (("run", "wf.py", "--workers", "-3"), "--workers: expected a whole number >= 1"),
    (("run", "wf.py", "--gpus", "-1"), "--gpus: expected a whole number >= 0"),
    (("status", "run.db", "--watch", "-1"), "--watch: expected a number of seconds"),
    (("status", "run.db", "--watch", "nan"), "--watch: expected a number of seconds"),
    (("status", "run.db", "--watch", "0"), "--watch: expected a number of seconds"),
])
def test_bad_numbers_on_the_command_line_are_usage_errors(tmp_path, args, words):
    """Before: --workers 0/-3 a raw ValueError traceback from the scheduler (exit 1); --gpus -1
    'asks for 0 GPUs but the pilot has -1'; --watch -1/nan a ValueError traceback from
    time.sleep once the run was live, --watch 0 redrew ~8,000 times a second."""
    write_wf(tmp_path, "workflow = [Pipeline([Stage([Task(executable='/bin/true')])])]\n")
    r = shoal_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_run_refuses_a_workers_or_gpus_count_that_is_not_one(tmp_path):
    from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run

    wf = [Pipeline([Stage([Task(executable="/bin/true")])])]
    for kw, words in ((dict(workers=0), "workers must be an integer >= 1"),
                      (dict(workers=True), "workers must be an integer >= 1"),
                      (dict(gpus=-1), "gpus must be an integer >= 0")):
        with pytest.raises(EnsembleError, match=words):
            run(wf, journal=str(tmp_path / "run.db"), **kw)
