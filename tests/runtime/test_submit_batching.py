"""Submit batching (shoal/backends/local/submit.py): once every worker has a backlog, new tasks are
staged in the driver and pushed in batches.  Staging must never change what a user sees:
a staged task still runs (nobody has to submit more to push it), and ``cancel()`` that
says True means the task never ran, whether it was staged, in a ring or in a deque."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time

import pytest

import shoal


def wait_for(path: str, limit: float = 60.0) -> str:
    """Block until ``path`` exists (bounded), so tests decide when work may proceed."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.001)
    return path


def touch(path: str) -> str:
    with open(path, "w"):
        pass
    return path


@pytest.fixture
def pilot():
    with shoal.Pilot(2) as p:
        yield p


def test_staged_tasks_run_and_cancel_true_means_never_ran(pilot, tmp_path):
    gate = str(tmp_path / "go")
    blockers = [pilot.submit(wait_for, gate) for _ in range(2)]  # both workers busy
    backend = pilot._backend
    futs = []
    i = 0
    while i < 300 or not backend.staged:  # a backlog: later tasks wait in the driver
        path = str(tmp_path / f"t{i}")
        futs.append((pilot.submit(touch, path), path))
        i += 1
        assert i < 5000, "submits never got staged"
    staged = {id(task.future) for task in backend.staged}
    assert staged, "the last tasks should be staged while both workers are blocked"
    said = [(fut, path, fut.cancel() if n % 3 == 0 else False) for n, (fut, path) in enumerate(futs)]
    assert any(ok and id(fut) in staged for fut, _, ok in said), "no staged task was cancelled"
    touch(gate)
    for b in blockers:
        assert b.result(60) == gate
    for fut, path, cancelled in said:
        if cancelled:
            assert fut.cancelled()
        else:
            assert fut.result(60) == path  # staged ones too: nobody submitted after them
    pilot.submit(touch, str(tmp_path / "last")).result(60)  # all earlier work taken or dropped
    ran_anyway = [path for _, path, cancelled in said if cancelled and os.path.exists(path)]
    assert not ran_anyway, f"cancel() returned True but the task ran: {ran_anyway[:5]}"
    assert not backend.tasks and not backend.staged


def test_staged_futures_complete_for_wait_and_as_completed(pilot, tmp_path):
    """``concurrent.futures.wait``/``as_completed`` never call into shoal: staged tasks
    must reach the workers without a ``result()`` call pushing them."""
    gate = str(tmp_path / "go")
    blockers = [pilot.submit(wait_for, gate) for _ in range(2)]
    futs = [pilot.submit(pow, i, 2) for i in range(1000)]
    touch(gate)
    done, not_done = cf.wait(futs + blockers, timeout=60)
    assert not not_done
    assert sorted(f.result() for f in cf.as_completed(futs, timeout=60)) == [i * i for i in range(1000)]


def test_futures_work_in_a_fork_while_the_parent_holds_their_shared_lock():
    """Driver futures share one lock; a fork taken while another thread holds it must not
    leave the child's futures locked forever (the child gets a fresh lock)."""
    import threading

    from shoal.runtime.future import Future

    held, release = threading.Event(), threading.Event()

    def hold():
        with Future._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(30)
        pid = os.fork()
        if pid == 0:  # child: exit 0 only if a future works; a hang is killed by the parent
            code = 1
            try:
                f = Future()
                f.set_result(7)
                code = 0 if f.result(5) == 7 and f.done() else 1
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("a future in the forked child hung on the parent's held lock")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        t.join()


def test_a_forked_child_gets_pilotclosed_from_the_parents_outstanding_futures(pilot, tmp_path):
    """The child of a fork cannot get results of its parent's pilot (the at-fork hook closes it
    there); its outstanding futures, staged ones included, waited forever in the child
    (result() without a timeout hung).  The parent's futures are unharmed."""
    gate = str(tmp_path / "go")
    blockers = [pilot.submit(wait_for, gate) for _ in range(2)]
    futs = [pilot.submit(pow, i, 2) for i in range(2000)]
    pending = [f for f in blockers + futs if not f.done()]  # the blockers at least
    pid = os.fork()
    if pid == 0:  # child: exit 0 only if every outstanding future raises PilotClosed at once
        code = 1
        try:
            errors = {type(f.exception(5)).__name__ for f in pending}
            code = 0 if pending and errors == {"PilotClosed"} else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    touch(gate)
    assert [f.result(60) for f in futs] == [i * i for i in range(2000)]
    assert all(f.result(60) == gate for f in blockers)
    assert os.waitstatus_to_exitcode(status) == 0


def test_cancel_while_the_pump_settles_the_result_says_false(pilot, monkeypatch):
    """The pump took a finished task out of ``tasks`` under the backend lock and set its
    future after releasing it: a cancel() from another thread in between found no task,
    cancelled the PENDING future and said True for a task that had run (its result was
    dropped).  Here a thread cancels exactly in that window."""
    import threading

    from shoal.backends.local import pump as local  # where results are settled

    said, threads = [], []
    real = local.settle_many

    def settle_with_a_cancel_in_between(items, log, *rest):
        items = list(items)
        mine = [fut for fut, _, _ in items if getattr(fut, "probe_me", False)]
        if mine:
            t = threading.Thread(target=lambda: said.append(mine[0].cancel()))
            threads.append(t)
            t.start()
            t.join(0.5)  # with the fix it waits for the backend lock this thread holds
            real(items, log, *rest)
            return
        real(items, log, *rest)

    monkeypatch.setattr(local, "settle_many", settle_with_a_cancel_in_between)
    fut = pilot.submit(pow, 3, 2)
    fut.probe_me = True
    assert fut.result(30) == 9
    deadline = time.monotonic() + 30
    while not threads and time.monotonic() < deadline:
        time.sleep(0.01)
    threads[0].join(30)
    assert said == [False] and not fut.cancelled()
