"""Issue 11, items 5 and 9: forks, dropped pilots and interpreter exit, with real processes.

* A driver that forks: the child gets a clear error from the inherited pilot instead of
  sharing its parent's rings (before, the parent received the child's results: up to
  1,929 of 3,000 futures wrong).
* A task that forks and whose child returns into the worker loop: the child exits at
  once instead of becoming a second consumer of the worker's rings (5-100 tasks lost).
* Pilots dropped without close() are collected and closed after their pending work
  (``context.pilots`` held them: 5 dropped pilots = 10 live workers).
* Interpreter exit: pending work finishes, submit during exit raises RuntimeError (the
  stdlib executors' semantics; before, the work was dropped and submit accepted).
"""

from __future__ import annotations

import gc
import os
import time

import psutil
import rt_tasks as t
from conftest import ROOT, run_script

import shoal

TESTS = os.path.join(ROOT, "tests")  # rt_tasks.py


def _script_env():
    return {"PYTHONPATH": os.pathsep.join([ROOT, TESTS])}


FORKED_DRIVER = """
import os, sys
import shoal
import rt_tasks as t

with shoal.Pilot(2) as p:
    assert p.submit(t.inc, 1).result(30) == 2
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the inherited pilot must refuse, not share the rings
        os.close(r)
        try:
            p.submit(t.inc, 1)
            msg = "accepted"
        except shoal.PilotClosed as exc:
            msg = "refused: " + str(exc)
        try:
            p.close()  # must not touch the parent's workers
            msg += " | close ok"
        except BaseException as exc:
            msg += f" | close raised {exc!r}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    futs = [p.submit(t.add, i, b=1000) for i in range(3000)]
    wrong = sum(f.result(60) != i + 1000 for i, f in enumerate(futs))
    child = b""
    while chunk := os.read(r, 4096):
        child += chunk
    os.waitpid(pid, 0)
    print("wrong", wrong)
    print("child", child.decode())
print("closed")
"""


def test_forked_driver_gets_a_clear_error_and_the_parent_is_unharmed():
    out = run_script(FORKED_DRIVER, timeout=110, env=_script_env())
    assert "wrong 0" in out.stdout, out.stdout + out.stderr
    assert "child refused: this pilot belongs to process" in out.stdout
    assert "is a fork of it" in out.stdout and "close ok" in out.stdout
    assert "closed" in out.stdout


def test_task_that_forks_does_not_become_a_second_consumer():
    with shoal.Pilot(2) as p:
        children = [p.submit(t.fork_and_return).result(timeout=30) for _ in range(3)]
        assert all(isinstance(c, int) for c in children), children  # not the child's "child"
        futs = [p.submit(t.add, i, b=7) for i in range(10_000)]
        assert [f.result(timeout=60) for f in futs] == [i + 7 for i in range(10_000)]
        assert p.stats()["driver"]["worker_deaths"] == 0
        for c in children:  # each child exited when it came back into the loop
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    if psutil.Process(c).status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"forked child {c} still runs")


def _shoal_workers() -> set[int]:
    out = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "shoal.runtime.worker" in " ".join(proc.cmdline()):
                out.add(proc.pid)
        except psutil.Error:
            pass
    return out


def test_dropped_pilots_are_collected_and_closed():
    before = _shoal_workers()
    for _ in range(5):
        shoal.Pilot(2).submit(t.inc, 1).result(30)
    gc.collect()
    deadline = time.monotonic() + 30
    while _shoal_workers() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _shoal_workers() - before, "dropped pilots kept their workers"


def test_dropped_pilot_finishes_its_pending_work_first():
    before = _shoal_workers()
    fut = shoal.Pilot(1).submit(t.sleep_then, 0.3, "done")  # the pilot is dropped at once
    gc.collect()
    assert fut.result(timeout=30) == "done"
    dep = shoal.Pilot(1).submit(t.inc, shoal.Pilot(1).submit(t.sleep_then, 0.2, 1))
    gc.collect()
    assert dep.result(timeout=30) == 2
    deadline = time.monotonic() + 30
    while _shoal_workers() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _shoal_workers() - before, "the dropped pilots' workers outlived their work"


def test_spawn_after_the_pilot_is_gone_says_so():
    p = shoal.Pilot(1)
    p.close()
    del p
    gc.collect()
    try:
        shoal.spawn(t.inc, 1)
    except RuntimeError as exc:
        assert "no shoal.Pilot is open" in str(exc)
    else:  # another test's pilot may be open in this process
        pass


EXIT_SEMANTICS = """
import os, sys, threading, time
import shoal
import rt_tasks as t

out = sys.argv[1] if len(sys.argv) > 1 else {out!r}
p = shoal.Pilot(2)
slow = p.submit(t.sleep_then, 0.5, "slow")
def write(value):
    with open(out, "a") as f:
        f.write(str(value) + "\\n")
slow.add_done_callback(lambda f: write(f.result()))
dep = p.submit(t.inc, p.submit(t.sleep_then, 0.3, 41))
dep.add_done_callback(lambda f: write(f.result()))
cancelled = p.submit(t.sleep_then, 0.3, "cancelled")
cancelled.cancel()

def late():  # a non-daemon thread that submits while the interpreter exits
    from shoal.runtime import context  # (waits for the exit to begin: a fixed 0.2 s sleep
    deadline = time.monotonic() + 30   # raced a main thread that a loaded machine held back)
    while not context.exiting and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        p.submit(t.inc, 1)
        write("late accepted")
    except RuntimeError as exc:
        write("late refused: " + str(exc))
threading.Thread(target=late).start()
print("main done")
"""


def test_interpreter_exit_finishes_pending_work_and_refuses_new(tmp_path):
    out = tmp_path / "out.txt"
    res = run_script(EXIT_SEMANTICS.format(out=str(out)), timeout=60, env=_script_env())
    assert res.returncode == 0, res.stderr
    lines = out.read_text().splitlines()
    assert "slow" in lines and "42" in lines
    assert "cancelled" not in lines
    assert any(line.startswith("late refused: cannot schedule new futures after interpreter "
                               "shutdown") for line in lines), lines
