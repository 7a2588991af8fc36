"""shoal.Pilot as a concurrent.futures.Executor: the stdlib's semantics, on real worker processes.

CPython's own suite runs against the pilot in tests/cpython (opt-in); these are
the behaviours that suite does not reach (options, force-cancel, RUNNING,
initializer state, max_tasks_per_child, exit with shutdown(wait=False)).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import pickle
import time

import pytest
import rt_tasks as t
from conftest import run_script

import shoal


def capture(*args, **kwargs):
    return args, kwargs


def wait_running(fut, timeout=60):
    deadline = time.monotonic() + timeout
    while not fut.running():
        assert not fut.done(), f"{fut} finished before the test saw it RUNNING (machine overloaded?)"
        assert time.monotonic() < deadline, f"{fut} never went RUNNING"
        time.sleep(0.005)


_STATE = "unset"


def set_state(value):
    global _STATE
    _STATE = value


def get_state():
    return _STATE, os.getpid()


def failing_init():
    raise ValueError("error in initializer")


@pytest.fixture(scope="module")
def pilot():
    with shoal.Pilot(max_workers=2) as p:
        yield p


@pytest.fixture(autouse=True)
def leak_check():  # a module-scoped pilot outlives single tests; tests that make pilots close them
    yield


def test_is_an_executor_and_passes_every_keyword(pilot):
    assert isinstance(pilot, cf.Executor)
    out = pilot.submit(capture, 1, timeout=3, retries=2, fn=4, self=5).result(30)
    assert out == ((1,), {"timeout": 3, "retries": 2, "fn": 4, "self": 5})
    with pytest.raises(TypeError):
        pilot.submit(fn=capture)


def test_options_carry_retries_and_timeout(pilot, tmp_path):
    marker = str(tmp_path / "count")
    assert pilot.options(retries=2).submit(t.fail_until, marker, 3).result(30) == 3
    with pytest.raises(shoal.TaskTimeout):
        pilot.options(timeout=0.3).submit(t.sleep, 30).result(30)
    assert list(pilot.options(retries=1).map(t.inc, range(5))) == [1, 2, 3, 4, 5]
    assert "retries=2" in repr(pilot.options(retries=2))


def test_running_and_cancel_follow_the_stdlib(pilot, tmp_path):
    # the blockers wait for a file, not 2 s: a loaded machine once took longer than that
    # to see both RUNNING, and the queued task then started before its cancel()
    gate = str(tmp_path / "gate")
    blockers = [pilot.submit(t.wait_for, gate, value=2) for _ in range(2)]
    for b in blockers:
        wait_running(b)
    queued = pilot.submit(t.touch, str(tmp_path / "ran"))
    assert not queued.running()
    assert queued.cancel() and queued.cancelled()  # not started: cancelled, never runs
    assert not blockers[0].cancel()  # running: False, and its result still arrives
    t.release(gate)
    assert [b.result(30) for b in blockers] == [2, 2]
    pilot.submit(t.inc, 1).result(30)  # the queue behind them is drained
    assert not (tmp_path / "ran").exists()


def test_force_cancel_replaces_the_worker(pilot):
    fut = pilot.submit(t.sleep, 60)
    wait_running(fut)
    before = pilot.stats()["driver"]["worker_deaths"]
    chained = []
    fut.add_done_callback(lambda f: chained.append(pilot.submit(t.inc, 41)))  # submits from the callback
    assert pilot.cancel(fut, force=True)
    assert chained[0].result(30) == 42
    assert fut.cancelled()
    with pytest.raises(cf.CancelledError):
        fut.result(5)
    assert [f.result(30) for f in [pilot.submit(t.inc, i) for i in range(20)]] == list(range(1, 21))
    assert pilot.stats()["driver"]["worker_deaths"] == before + 1
    done = pilot.submit(t.inc, 1)
    done.result(30)
    assert not pilot.cancel(done, force=True)  # finished: nothing to cancel
    with pytest.raises(TypeError, match="shoal.Future"):
        pilot.cancel(cf.Future())


def test_map_starts_at_call_time_and_times_out(pilot, tmp_path):
    pilot.map(t.touch, [str(tmp_path / f"m{i}") for i in range(4)])  # never iterated
    deadline = time.monotonic() + 30
    while len(list(tmp_path.iterdir())) < 4:
        assert time.monotonic() < deadline, "map() did not start its work at call time"
        time.sleep(0.01)
    got = []
    gate = str(tmp_path / "gate")
    try:
        with pytest.raises(cf.TimeoutError):
            for x in pilot.map(t.wait_for, [os.devnull, os.devnull, gate], timeout=1.5):
                got.append(x)
    finally:
        t.release(gate)
    # the two quick items are yielded when done by the deadline: on a loaded machine maybe
    # not (a fixed [0, 0] raced); never anything out of order or past the blocked item
    assert got == [os.devnull, os.devnull][:len(got)]
    with pytest.raises(TypeError, match="timeout"):
        pilot.map(t.inc, [1], timeout="soon")


def test_shutdown_semantics(tmp_path):
    p = shoal.Pilot(max_workers=2)
    blockers = [p.submit(t.sleep, 30) for _ in range(2)]
    for b in blockers:
        wait_running(b)
    queued = [p.submit(t.touch, str(tmp_path / f"q{i}")) for i in range(10)]
    p.shutdown(wait=False, cancel_futures=True)
    assert not any(b.done() for b in blockers)  # returned without waiting for the running tasks
    with pytest.raises(RuntimeError, match="cannot schedule new futures"):
        p.submit(t.inc, 1)
    assert all(f.cancelled() for f in queued)
    assert all(p.cancel(b, force=True) for b in blockers)  # (instead of waiting 30 s)
    p.shutdown(wait=True)  # waits for the background close
    assert all(b.cancelled() for b in blockers)
    assert not list(tmp_path.iterdir())


def test_max_workers_validation():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_workers must be greater than 0"):
            shoal.Pilot(max_workers=bad)
    with pytest.raises(TypeError, match="not both"):
        shoal.Pilot(2, max_workers=3)
    with pytest.raises(ValueError, match="max_tasks_per_child"):
        shoal.Pilot(1, max_tasks_per_child=0)
    with pytest.raises(TypeError, match="initializer"):
        shoal.Pilot(1, initializer=42)


def test_initializer_and_max_tasks_per_child():
    with shoal.Pilot(max_workers=1, initializer=set_state, initargs=("ready",), max_tasks_per_child=3) as p:
        seen = [p.submit(get_state).result(30) for _ in range(7)]
    assert {state for state, _ in seen} == {"ready"}  # replacements run the initializer too
    pids = [pid for _, pid in seen]
    assert len(set(pids[:3])) == 1 and len(set(pids)) == 3, pids  # a fresh worker every 3 tasks


def test_failing_initializer_breaks_the_pilot(caplog):
    with caplog.at_level(logging.CRITICAL, logger="concurrent.futures"):
        p = shoal.Pilot(max_workers=2, initializer=failing_init)
        try:
            deadline = time.monotonic() + 30
            while not p._broken:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with pytest.raises(cf.BrokenExecutor, match="initializer"):
                p.submit(t.inc, 1)
            with pytest.raises(shoal.BrokenPilot):
                p.map(t.inc, [1])
        finally:
            p.shutdown()
    assert "ValueError: error in initializer" in caplog.text


def test_errors_interoperate(pilot):
    with pytest.raises(cf.BrokenExecutor):  # a crashed worker
        pilot.submit(t.die, "segfault").result(30)
    with pytest.raises(pickle.PicklingError):  # an argument that cannot be pickled
        pilot.submit(t.inc, t.Unpicklable()).result(30)
    with pytest.raises(pickle.PicklingError):  # a result that cannot be pickled
        pilot.submit(t.unpicklable_result).result(30)
    with pytest.raises(pickle.UnpicklingError):  # a result the driver cannot load
        pilot.submit(_BadLoad).result(30)
    assert pilot.submit(t.inc, 1).result(30) == 2


def _explode():
    raise pickle.UnpicklingError("cannot load me")


class _BadLoad:
    def __reduce__(self):
        return _explode, ()


def test_exit_with_shutdown_nowait_finishes_running_work():
    """CPython's test_hang_gh83386, for shoal: shutdown(wait=False) at exit does not hang
    and the running task still prints."""
    res = run_script(
        "import shoal, sys, time\n"
        "def say(msg):\n"
        "    time.sleep(0.5); print(msg, flush=True)\n"
        "if __name__ == '__main__':\n"
        "    p = shoal.Pilot(max_workers=2)\n"
        "    p.submit(say, 'apple')\n"
        "    p.shutdown(wait=False)\n", timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "apple"
    assert not res.stderr


def test_remote_traceback_names_main_file(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import shoal\n"
        "def bad(x):\n"
        "    y = x + 1\n"
        "    raise ValueError(y)  # the line to see\n"
        "if __name__ == '__main__':\n"
        "    with shoal.Pilot(1) as p:\n"
        "        try:\n"
        "            p.submit(bad, 1).result(30)\n"
        "        except ValueError as e:\n"
        "            print(e.__cause__)\n")
    res = run_script(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert res.returncode == 0, res.stderr
    assert f'File "{script}", line 4, in bad' in res.stdout
    assert "the line to see" in res.stdout


def test_cancel_true_means_never_ran(pilot, tmp_path):
    """Race cancel() against workers starting tasks: whenever cancel() says True the task
    must not have run (its file absent); when it says False the task ran to the end."""
    import random

    rng = random.Random(13)
    outcomes = []
    for i in range(400):
        path = tmp_path / f"t{i}"
        fut = pilot.submit(t.touch, str(path))
        if rng.random() < 0.5:
            time.sleep(rng.random() * 0.003)  # cancel at a random moment around the start
        outcomes.append((fut, fut.cancel(), path))
    for fut, said, path in outcomes:
        if said:
            assert fut.cancelled()
        else:
            assert fut.result(30) == str(path)
    pilot.submit(t.inc, 1).result(30)  # everything queued before has been taken or dropped
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
            said and path.exists() for _, said, path in outcomes):
        time.sleep(0.05)
    ran_anyway = [str(path) for _, said, path in outcomes if said and path.exists()]
    assert not ran_anyway, f"cancel() returned True but the task ran: {ran_anyway[:5]}"
