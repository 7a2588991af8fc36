"""Attacks on the cancel contract on the local backend, the way users break it.

``cancel()`` True means the call never runs (the stdlib's promise).  Each task appends
its number to a side-effect file with ``O_APPEND`` (one whole line per run): that file,
not shoal's own bookkeeping, is the reference for "it ran".  Real worker processes and
rings; the attacks: many threads cancelling the *same* futures, cancel() from
done-callbacks (the result pump's thread), workers SIGSTOPped and SIGKILLed under a
cancel storm, force cancel of a task that has just finished, fork while cancels are in
flight.  Every wait is bounded.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import signal
import sys
import threading
import time
import traceback

import pytest
from rt_tasks import mark, ran, until

import shoal


def mark_sleep(path: str, i: int, s: float) -> int:
    time.sleep(s)
    return mark(path, i)


def mark_gated(path: str, i: int, gate: str) -> int:
    """``mark`` once ``gate`` exists (bounded): the test acts while the tasks are still queued."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.001)
    return mark(path, i)


def settle_all(futs) -> None:
    _, not_done = cf.wait(futs, timeout=120)
    assert not not_done, f"{len(not_done)} futures never settled"


def check(futs, path, lost_ok: int = 0) -> None:
    settle_all(futs)
    runs = ran(path)
    bad = [f.arg for f in futs if f.cancelled() and f.arg in runs]
    assert not bad, f"cancelled but ran: {len(bad)} e.g. {bad[:5]}"
    lost = [f.arg for f in futs if not f.cancelled() and f.arg not in runs
            and not isinstance(f.exception(), shoal.WorkerLost)]
    assert not lost, f"neither cancelled nor ran: {lost[:5]}"
    for f in futs:
        if not f.cancelled() and f.exception() is None:
            assert f.result() == f.arg


def test_many_threads_cancel_the_same_futures(tmp_path):
    """8 threads cancel the same 3,000 futures, each in its own order, while the two
    workers run them.  No cancel() may raise; all callers of one future agree; a future
    that any of them saw cancelled never ran."""
    path = str(tmp_path / "marks")
    errors: list = []
    with shoal.Pilot(2) as pilot:
        pilot.submit(mark, path, -1).result(60)
        futs = []
        for i in range(3000):
            f = pilot.submit(mark, path, i)
            f.arg = i
            futs.append(f)
        answers: dict = collections.defaultdict(list)
        lock = threading.Lock()
        start = threading.Barrier(8)

        def storm(k: int) -> None:
            order = futs[k::8] + futs[:k:1] + futs  # overlapping orders: same futures, racing
            start.wait(30)
            for f in order:
                try:
                    said = f.cancel()
                except BaseException as exc:  # noqa: BLE001 - the finding
                    errors.append(repr(exc))
                    continue
                with lock:
                    answers[f].append(said)

        ts = [threading.Thread(target=storm, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not any(t.is_alive() for t in ts), "a cancel() hung"
        check(futs, path)
    assert not errors, f"cancel() raised {len(errors)} times: {errors[:3]}"
    for f, said in answers.items():
        if any(said):
            assert f.cancelled()


def test_cancel_from_done_callbacks(tmp_path):
    """Each future's done-callback (run on the result pump's thread) cancels the next
    three futures; True from it still means never ran, and nothing hangs.  The tasks wait
    for a gate until every callback is attached (else, on a fast machine, all could finish
    first and the storm cancel nothing).  A cancelled future's callback does nothing: as
    with the stdlib, cancel() runs the callbacks inline, and a chain of 2,000 cancels
    would exceed the recursion limit in the test's own callback."""
    path = str(tmp_path / "marks")
    gate = str(tmp_path / "gate")
    errors: list = []
    with shoal.Pilot(2) as pilot:
        pilot.submit(mark, path, -1).result(60)
        futs = []
        for i in range(2000):
            f = pilot.submit(mark_gated, path, i, gate)
            f.arg = i
            futs.append(f)

        depths = []

        def cb(f, k):
            if f.cancelled():
                return
            depths.append(len(traceback.extract_stack()))
            try:
                for g in futs[k + 1:k + 4]:
                    g.cancel()
                pilot.cancel(futs[(k + 500) % len(futs)])  # often finished, its result not yet read
            except BaseException as exc:  # noqa: BLE001
                errors.append(repr(exc))

        for k, f in enumerate(futs):
            f.add_done_callback(lambda f, k=k: cb(f, k))
        open(gate, "w").close()
        check(futs, path)
        # (how many cancels win depends on how far the workers are ahead of the pump: on a
        # fast machine none may; the contract and the nesting are checked either way)
        # each cancel() drains the rings; the callbacks of what it settles must not run
        # nested inside it (a chain of nested drains hit RecursionError in the pump, whose
        # bookkeeping it broke: then the pilot hung)
        assert max(depths) < min(depths) + 40, (min(depths), max(depths))
        assert pilot.submit(mark, path, -2).result(60) == -2
    assert not errors, errors[:3]


@pytest.mark.parametrize("sig", ["SIGSTOP", "SIGKILL"])
def test_cancel_storm_while_workers_are_stopped_or_killed(tmp_path, sig):
    """4 threads cancel half of 4,000 tasks while a worker is SIGSTOPped (then resumed)
    or SIGKILLed (then replaced).  A True still means never ran; every other task ran
    once or was lost with its worker (WorkerLost)."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        # Both workers have loaded mark_sleep (a STATS is answered after the DEFINE before
        # it): this test is about the cancel storm, not about a kill while a function loads
        # (tests/runtime/test_worker_death.py has those).
        pilot.submit(mark_sleep, path, -1, 0).result(60)
        pilot.stats()
        backend = pilot._backend
        futs = []
        for i in range(4000):
            f = pilot.submit(mark_sleep, path, i, 0.0002)
            f.arg = i
            futs.append(f)
        victim = backend.procs[backend.endpoints[0]]
        go = threading.Event()

        def storm(k: int) -> None:
            go.wait(30)
            for f in futs[k::4][::2]:
                f.cancel()

        ts = [threading.Thread(target=storm, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        os.kill(victim.pid, getattr(signal, sig))
        go.set()
        time.sleep(0.2)
        if sig == "SIGSTOP":
            os.kill(victim.pid, signal.SIGCONT)
        for t in ts:
            t.join(120)
        assert not any(t.is_alive() for t in ts), "a cancel() hung"
        check(futs, path)
        runs = ran(path)
        assert all(n == 1 for n in runs.values()), "a task ran twice"
        assert pilot.submit(mark, path, -2).result(60) == -2


def test_force_cancel_of_a_task_that_just_finished(tmp_path):
    """A task has run (its mark is in the file) and its worker is idle, but the result is
    still unread (the pump is held off).  force cancel must say False: there is nothing
    running to stop; True would throw away a finished result and kill a worker."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        backend = pilot._backend
        pilot.submit(mark, path, -1).result(60)
        before = set(p.pid for p in backend.procs.values())
        for i in range(20):
            with backend.consume_lock:
                fut = pilot.submit(mark, path, i)
                until(lambda i=i: i in ran(path), what="the task ran")
                time.sleep(0.01)
                said = pilot.cancel(fut, force=True)
            assert not said, "force cancel True for a finished task"
            assert fut.result(60) == i
        assert set(p.pid for p in backend.procs.values()) == before, "a worker was killed"


def test_force_cancel_races_the_end_of_the_task(tmp_path):
    """force cancel of tasks that end at about the moment it is called: when it says
    True the future is cancelled; every other task has its result (a forced kill takes
    no other task: the worker is frozen and looked at again before it is killed); the
    pilot still works."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        pilot.submit(mark, path, -1).result(60)
        futs, forced = [], 0
        for i in range(40):
            f = pilot.submit(mark_sleep, path, i, 0.005)
            f.arg = i
            futs.append(f)
            g = pilot.submit(mark, path, 1000 + i)
            g.arg = 1000 + i
            futs.append(g)
            until(lambda f=f: f.running() or f.done(), what="started")
            time.sleep(0.004)
            if pilot.cancel(f, force=True):
                forced += 1
                assert f.cancelled()
        settle_all(futs)
        lost = [f for f in futs if not f.cancelled() and f.exception() is not None]
        assert not lost, [repr(f.exception()) for f in lost[:3]]  # no collateral: nothing nests here
        runs = ran(path)
        for f in futs:
            if not f.cancelled() and f.exception() is None:
                assert f.result() == f.arg and runs[f.arg] == 1
        assert pilot.submit(mark, path, -2).result(60) == -2


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_fork_while_cancels_are_in_flight(tmp_path):
    """A thread forks while others cancel: the child must not hang (it exits within a
    bound), the parent's contract holds and its pilot keeps working."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        pilot.submit(mark, path, -1).result(60)
        futs = []
        for i in range(3000):
            f = pilot.submit(mark, path, i)
            f.arg = i
            futs.append(f)

        def storm(k):
            for f in futs[k::3]:
                f.cancel()

        ts = [threading.Thread(target=storm, args=(k,)) for k in range(3)]
        for t in ts:
            t.start()
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:  # the child: using the pilot must fail or work, never hang
                code = 0
                try:
                    try:
                        pilot.submit(mark, path, -9).result(5)
                    except Exception:  # noqa: BLE001 - refused is fine
                        pass
                    futs[-1].cancel()
                except BaseException:  # noqa: BLE001
                    code = 3
                os._exit(code)
            pids.append(pid)
            time.sleep(0.01)
        for t in ts:
            t.join(120)
        deadline = time.monotonic() + 30
        codes = {}
        while len(codes) < len(pids) and time.monotonic() < deadline:
            for pid in pids:
                if pid not in codes:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes[pid] = status
            time.sleep(0.01)
        hung = [p for p in pids if p not in codes]
        for p in hung:
            os.kill(p, signal.SIGKILL)
            os.waitpid(p, 0)
        assert not hung, "a forked child hung using the parent's pilot"
        check(futs, path)
        assert -9 not in ran(path), "a forked child's submit ran on the parent's workers"
        assert pilot.submit(mark, path, -2).result(60) == -2


def _sleep_then(s: float, x: int) -> int:
    time.sleep(s)
    return x


@pytest.fixture
def fast_switch():
    """Threads switch every microsecond: narrow interleavings become common (the same
    bugs happen at the default interval, just rarely)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_same_future_cancelled_from_many_threads_never_raises(fast_switch):
    """6 threads cancel the same queued future at once, 300 times: every call answers
    True (it is queued behind a long task, never run) and none raises."""
    errors: list = []
    with shoal.Pilot(1) as pilot:
        pilot.submit(abs, -1).result(60)
        blocker = pilot.submit(_sleep_then, 30.0, 0)
        until(blocker.running, what="the blocker started")
        for _ in range(300):
            fut = pilot.submit(abs, -1)
            barrier = threading.Barrier(6)
            said: list = []

            def go(fut=fut, barrier=barrier, said=said):
                barrier.wait(30)
                try:
                    said.append(fut.cancel())
                except BaseException as exc:  # noqa: BLE001 - the finding
                    errors.append(repr(exc))

            ts = [threading.Thread(target=go) for _ in range(6)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            assert all(said) and fut.cancelled()
        pilot.cancel(blocker, force=True)
    assert not errors, f"cancel() raised {len(errors)} times: {errors[:2]}"


def test_running_polled_from_many_threads_never_raises(fast_switch):
    """3 threads poll running() on 20 short tasks until all are done, 60 rounds."""
    errors: list = []
    with shoal.Pilot(2) as pilot:
        for _ in range(60):
            futs = [pilot.submit(_sleep_then, 0.0005, i) for i in range(20)]

            def poll(futs=futs):
                deadline = time.monotonic() + 60
                while not all(f.done() for f in futs) and time.monotonic() < deadline:
                    for f in futs:
                        try:
                            f.running()
                        except BaseException as exc:  # noqa: BLE001 - the finding
                            errors.append(repr(exc))

            ts = [threading.Thread(target=poll) for _ in range(3)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(90)
            assert [f.result(60) for f in futs] == list(range(20))
    assert not errors, f"running() raised {len(errors)} times: {errors[:2]}"


def cancel_children_inside(path: str, n: int, base: int) -> list:
    """A task spawns ``n`` children that mark the file, cancels every other one at once
    and reports what each cancel() said (inside a worker: the worker-side future)."""
    futs = [shoal.spawn(mark_sleep, path, base + i, 0.001) for i in range(n)]
    said = {}
    for i in range(0, n, 2):
        said[i] = futs[i].cancel()
    out = []
    for i, f in enumerate(futs):
        try:
            f.result()
            out.append((i, said.get(i), "ran"))
        except cf.CancelledError:
            out.append((i, said.get(i), "cancelled"))
    return out


def test_cancel_inside_tasks(tmp_path):
    """Tasks cancel their own spawned children (two parents at once, so thieves hold
    some): a True never ran, a False ran once, every child accounted for."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        parents = [pilot.submit(cancel_children_inside, path, 100, 1000 * (k + 1)) for k in range(4)]
        reports = [p.result(120) for p in parents]
    runs = ran(path)
    for k, rep in enumerate(reports):
        for i, said, fate in rep:
            tid = 1000 * (k + 1) + i
            if said:
                assert fate == "cancelled" and tid not in runs, (k, i, said, fate)
            else:
                assert fate == "ran" and runs[tid] == 1, (k, i, said, fate, runs[tid])
