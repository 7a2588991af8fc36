"""Durability: SIGKILL a real driver mid-run, resume in a new process, nothing DONE runs twice."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

from ens_tasks import ROOT

WORKFLOW = '''
import os, sys
sys.path.insert(0, {tests!r})
from ens_tasks import touch_count
from shoal.ensemble import Pipeline, Stage, Task

SIDE = {side!r}

def effect(name):
    return os.path.join(SIDE, name)

def workflow():
    exe = lambda i: Task(executable="/bin/sh", name=f"x{{i}}",
                         arguments=["-c", f"echo 1 >> {{effect('$SHOAL_TASK')}}; sleep 0.15"])
    fn = lambda i, k: Task(function=touch_count, args=(effect(f"p{{k}}.s1.f{{i}}"),), name=f"f{{i}}")
    return [Pipeline([Stage([exe(i) for i in range(12)]), Stage([fn(i, k) for i in range(6)]),
                      Stage([exe(i) for i in range(12)])], name=f"p{{k}}") for k in range(2)]
'''


def _done(db_path):
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
        try:
            return {u for (u,) in db.execute("SELECT uid FROM tasks WHERE state='done'")}
        finally:
            db.close()
    except sqlite3.Error:
        return set()


def test_sigkill_then_resume(tmp_path):
    side = tmp_path / "side"
    side.mkdir()
    wf = tmp_path / "wf.py"
    wf.write_text(WORKFLOW.format(tests=os.path.dirname(__file__), side=str(side)))
    journal = tmp_path / "run.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen([sys.executable, "-m", "shoal", "run", str(wf), "--journal", str(journal)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(_done(journal)) < 20 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.02)
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.wait(30)
        driver.stdout.close()
        driver.stderr.close()
    assert driver.returncode == -signal.SIGKILL
    done_at_kill = _done(journal)
    assert 20 <= len(done_at_kill) < 60, "the kill should land mid-run"

    status = subprocess.run(
        [sys.executable, "-m", "shoal", "status", str(journal)], env=env, capture_output=True, text=True,
        timeout=60)
    assert status.returncode == 0 and "p0.s0" in status.stdout, status.stderr

    resumed = subprocess.run([sys.executable, "-m", "shoal", "run", str(wf), "--journal", str(journal),
                              "--resume"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    head = resumed.stdout.splitlines()[0]  # the resumed session's own share, said apart
    assert f"60 done ({60 - len(done_at_kill)} in this session), 0 failed" in head, head
    assert len(_done(journal)) == 60
    for uid in done_at_kill:  # completed before the kill: ran exactly once
        lines = (side / uid).read_text().split()
        assert len(lines) == 1, (uid, lines)
    assert sorted(os.listdir(side)) == sorted(_done(journal))  # every task ran (at least once)


ORPHAN = '''
from shoal.ensemble import Pipeline, Stage, Task
workflow = Pipeline([Stage([Task(executable="/bin/sleep", arguments=["60"], name="long")])], name="o")
'''


def test_resume_kills_processes_the_dead_driver_left(tmp_path):
    import psutil

    wf = tmp_path / "wf.py"
    wf.write_text(ORPHAN)
    journal = tmp_path / "run.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen([sys.executable, "-m", "shoal", "run", str(wf), "--journal", str(journal)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    pid = None
    try:
        deadline = time.monotonic() + 60
        while pid is None and time.monotonic() < deadline:
            time.sleep(0.02)
            try:
                with contextlib.closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)) as db:
                    row = db.execute("SELECT pid FROM tasks WHERE uid='o.s0.long'").fetchone()
                pid = row[0] if row else None
            except sqlite3.Error:
                pass
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.wait(30)
    assert pid is not None and psutil.pid_exists(pid)  # the orphan outlived its driver
    out = subprocess.run([sys.executable, "-m", "shoal", "run", str(wf), "--journal", str(journal), "--resume",
                          "--walltime", "1"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr  # drained at the walltime
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
