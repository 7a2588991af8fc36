"""Issue 11, items 3 and 4: a message that kills a worker, and the driver's pump thread.

Real worker processes throughout; the faults are injected where they happen in the wild:
a function whose module only the driver has, a module whose import kills the process,
results that raise SystemExit while being pickled or unpickled, a replacement worker that
cannot be started (Popen raising, as with no free fds), a done-callback raising
SystemExit, and a pilot inside a multiprocessing "spawn" child.  Before the fixes each of
these hung every future of the pilot (or looped killing and restarting workers).
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import rt_tasks as t
from conftest import run_script

import shoal
from shoal.backends.local import lifecycle as local  # where the workers are started


def _deaths(p) -> int:
    return p.stats()["driver"]["worker_deaths"]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_function_whose_module_only_the_driver_has(tmp_path):
    """A module loaded from a file that is not on the workers' path: the workers cannot
    import it; the task fails with a SerializationError naming function and module."""
    path = tmp_path / "driver_only_mod.py"
    path.write_text("def triple(x):\n    return 3 * x\n")
    mod = _load("driver_only_mod", path)
    try:
        with shoal.Pilot(2) as p:
            futs = [p.submit(mod.triple, i) for i in range(4)]
            for f in futs:
                err = f.exception(timeout=30)
                assert isinstance(err, shoal.SerializationError)
                assert "driver_only_mod.triple" in str(err) and "'driver_only_mod'" in str(err)
            assert p.submit(abs, -3).result(timeout=30) == 3  # the pilot goes on
            assert _deaths(p) == 0
    finally:
        del sys.modules["driver_only_mod"]


def test_function_whose_import_kills_the_worker_is_quarantined(tmp_path, monkeypatch, caplog):
    """Importing the module kills any shoal worker (os._exit): one death per worker, then
    the function is quarantined; before, every replacement died of it again (~200 deaths
    in 15 s) and every task hung."""
    (tmp_path / "killer_mod.py").write_text(textwrap.dedent("""
        import os, sys
        main = sys.modules.get("__main__")
        if getattr(getattr(main, "__spec__", None), "name", "") == "shoal.runtime.worker":
            os._exit(9)
        def ident(x):
            return x
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import killer_mod

    try:
        with caplog.at_level(logging.ERROR, logger="shoal.runtime"), shoal.Pilot(2) as p:
            err = p.submit(killer_mod.ident, 1).exception(timeout=60)
            assert isinstance(err, shoal.SerializationError), err
            assert "killer_mod.ident" in str(err) and "quarantined" in str(err)
            assert p.submit(abs, -5).result(timeout=60) == 5
            assert [f.result(60) for f in [p.submit(t.inc, i) for i in range(20)]] == list(range(1, 21))
            again = p.submit(killer_mod.ident, 2).exception(timeout=30)  # refused at once now
            assert isinstance(again, shoal.SerializationError)
            assert _deaths(p) <= 2
        assert "quarantined" in caplog.text
    finally:
        sys.modules.pop("killer_mod", None)


SPAWN_CHILD = """
import multiprocessing as mp
import shoal

def square(x):
    return x * x

def child(q):
    with shoal.Pilot(2) as p:
        q.put((p.submit(square, 7).result(timeout=30), p.submit(abs, -2).result(timeout=30),
               [f.result(30) for f in [p.submit(square, i) for i in range(5)]]))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=child, args=(q,))
    proc.start()
    print("got", q.get(timeout=90))
    proc.join(30)
    print("exit", proc.exitcode)
"""


def test_pilot_inside_a_multiprocessing_spawn_child(tmp_path):
    script = tmp_path / "spawn_child.py"
    script.write_text(SPAWN_CHILD)
    out = run_script(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                     timeout=110)
    assert "got (49, 2, [0, 1, 4, 9, 16])" in out.stdout, out.stdout + out.stderr
    assert "exit 0" in out.stdout


def test_systemexit_while_unpickling_a_result_does_not_kill_the_pump():
    with shoal.Pilot(2) as p:
        err = p.submit(t.exit_on_unpickle).exception(timeout=30)
        assert isinstance(err, shoal.SerializationError) and "SystemExit" in str(err)
        assert p._backend.pump_thread.is_alive()
        assert p.submit(t.inc, 1).result(timeout=30) == 2


def test_systemexit_while_pickling_a_result_fails_only_that_task():
    with shoal.Pilot(2) as p:
        err = p.submit(t.exit_on_pickle).exception(timeout=30)
        # delivered as the task's error, as concurrent.futures.process does (CPython's
        # test_exit_during_result_pickle_on_worker), not a worker death
        assert isinstance(err, SystemExit)
        assert p.submit(t.inc, 1).result(timeout=30) == 2
        assert _deaths(p) == 0


def test_a_done_callback_raising_systemexit_does_not_kill_the_pump():
    with shoal.Pilot(1) as p:
        slow = p.submit(t.sleep, 0.3)
        slow.add_done_callback(lambda f: sys.exit(1))
        assert slow.result(timeout=30) == 0.3
        assert p.submit(t.inc, 1).result(timeout=30) == 2
        assert p._backend.pump_thread.is_alive()


def test_replacement_that_cannot_start_is_retried_and_reported(monkeypatch, caplog):
    """Popen raising in the pump (EMFILE, ENOMEM, the pids limit) killed the pump thread;
    now the endpoint is down, its work goes to the others, and the pump retries."""
    real = subprocess.Popen
    fails = {"left": 3}

    def flaky(*args, **kwargs):
        if fails["left"]:
            fails["left"] -= 1
            raise OSError(errno.EMFILE, "Too many open files (injected)")
        return real(*args, **kwargs)

    with caplog.at_level(logging.WARNING, logger="shoal.runtime"), shoal.Pilot(2) as p:
        assert p.submit(t.inc, 0).result(30) == 1
        monkeypatch.setattr(local.subprocess, "Popen", flaky)
        victim = p._backend.procs[1].pid
        os.kill(victim, signal.SIGKILL)
        futs = [p.submit(t.inc, i) for i in range(50)]
        assert [f.result(timeout=60) for f in futs] == list(range(1, 51))
        deadline = 200
        while p.stats()["driver"]["workers_down"] and deadline:
            deadline -= 1
            shoal_sleep(0.05)
        stats = p.stats()["driver"]
        assert stats["restart_failures"] == 3 and stats["workers_down"] == []
        assert p._backend.procs[1].pid != victim and p._backend.pump_thread.is_alive()
        assert [f.result(60) for f in [p.submit(t.pid) for _ in range(20)]]
    assert "could not start a replacement for worker 1" in caplog.text


def shoal_sleep(s):
    import time

    time.sleep(s)


@pytest.mark.parametrize("flavour", ["unpickle-args"])
def test_arguments_that_cannot_be_unpickled_in_the_worker(tmp_path, flavour):
    """Arguments of a class only the driver has: a SerializationError naming the task."""
    path = tmp_path / "driver_only_cls.py"
    path.write_text("class Box:\n    def __init__(self, v):\n        self.v = v\n")
    mod = _load("driver_only_cls", path)
    try:
        with shoal.Pilot(1) as p:
            err = p.submit(t.ident, mod.Box(1)).exception(timeout=30)
            assert isinstance(err, shoal.SerializationError)
            assert "ident" in str(err) and "'driver_only_cls'" in str(err)
            assert _deaths(p) == 0
    finally:
        del sys.modules["driver_only_cls"]


@pytest.mark.parametrize("timeout", [1e10, float("inf")])
def test_a_far_task_timeout_does_not_make_the_pump_fail(timeout):
    """timeout=1e10 or inf passes check_options; the pump parked until that deadline and
    poll() raised OverflowError every round (logged, then backed off up to 1 s a round)."""
    with shoal.Pilot(1) as p:
        assert p.options(timeout=timeout).submit(t.sleep, 0.3).result(timeout=30) == 0.3
        assert p.submit(t.inc, 1).result(timeout=30) == 2
        assert p.stats()["driver"]["pump_errors"] == 0


def test_waiting_on_a_pending_future_inside_a_done_callback_raises_instead_of_hanging():
    """Done-callbacks run on the pump thread, the only one that settles futures: a callback
    calling result() on another pending future waited forever (until its timeout)."""
    got = []
    with shoal.Pilot(1) as p:

        def callback(fut):
            try:
                got.append(p.submit(t.inc, fut.result()).result(timeout=30))
            except RuntimeError as exc:
                got.append(str(exc))

        first = p.submit(t.inc, 1)
        first.add_done_callback(callback)
        assert first.result(timeout=30) == 2
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got and "inside a done-callback would wait forever" in got[0], got
        assert p.submit(t.inc, 5).result(timeout=30) == 6  # the pump goes on
