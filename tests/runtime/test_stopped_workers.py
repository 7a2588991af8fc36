"""Tasks queued on a SIGSTOPped worker go to a live worker (shoal/backends/local/stopped.py).

Before: a stopped worker neither ran nor handed on the tasks queued to it, their
``timeout=`` never started (it counts from STARTED), and placement kept dealing new
tasks to a worker the health check knew was stopped: 96 of 200 ``timeout=2`` tasks
were still pending after 30 s.  Now, once the health check sees the worker stopped,
its queued tasks are taken back through ``cancel()``'s handshake and re-placed; after
SIGCONT the resumed worker runs none of them (a side-effect file written with
O_APPEND, one line per run, is the reference), and it takes new work again.
Real worker processes, real SIGSTOP/SIGCONT; every wait is bounded.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import random
import signal
import time

import pytest
from rt_tasks import mark, ran, until

import shoal


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def wait_for_file(path: str) -> int:
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return os.getpid()


def worker_queue_empty(pilot, ep: int) -> bool:
    """``ep`` answered STATS with an empty deque: every message sent to it before was
    handled (its driver ring is FIFO) and every task it held has run or been dropped."""
    for w in pilot.stats()["workers"]:
        if w.get("worker") == ep and "queued" in w:
            return w["queued"] == 0 and not pilot._backend.out[ep].pending
    return False


@pytest.mark.parametrize("timeout", [2, None])
def test_tasks_queued_on_a_stopped_worker_run_on_the_live_one_exactly_once(tmp_path, timeout):
    path = str(tmp_path / "ran")
    with shoal.Pilot(2) as p:
        p.stats()  # the workers run
        victim = p._backend.procs[1].pid
        os.kill(victim, signal.SIGSTOP)
        try:
            fs = [p.options(timeout=timeout).submit(mark, path, i) for i in range(200)]
            done, not_done = cf.wait(fs, timeout=60)
            assert not not_done, f"{len(not_done)} of 200 still pending with worker 1 stopped"
            assert [f.result() for f in fs] == list(range(200))
            assert p._backend.taken_back > 0  # some had been dealt to the stopped worker
        finally:
            os.kill(victim, signal.SIGCONT)
        # the resumed worker reads what was queued to it before the take-back: it must drop all
        until(lambda: worker_queue_empty(p, 1), what="the resumed worker's queue empties")
        counts = ran(path)
        assert sorted(counts) == list(range(200))
        assert [i for i, n in counts.items() if n != 1] == []


def test_new_tasks_are_not_placed_on_a_known_stopped_worker(tmp_path):
    gate = str(tmp_path / "gate")
    with shoal.Pilot(2) as p:
        backend = p._backend
        victim = backend.procs[1].pid
        os.kill(victim, signal.SIGSTOP)
        try:
            blocker = p.submit(wait_for_file, gate)  # work outstanding: the health check runs
            until(lambda: 1 in backend.health.stopped, what="worker 1 seen stopped")
            until(lambda: backend._running_on(blocker.task_id) == 2, what="blocker runs on worker 2")
            before = backend.taken_back
            fs = [p.options(timeout=2).submit(os.getpid) for _ in range(200)]
            assert backend.placement.load(0) == 0  # none dealt to the stopped worker
            open(gate, "w").close()
            done, not_done = cf.wait(fs + [blocker], timeout=60)
            assert not not_done
            live = blocker.result()
            assert live != victim and {f.result() for f in fs} == {live}
            assert backend.taken_back == before
        finally:
            os.kill(victim, signal.SIGCONT)


def test_a_stopped_then_resumed_worker_takes_work_again(tmp_path):
    with shoal.Pilot(2) as p:
        backend = p._backend
        victim = backend.procs[1].pid
        os.kill(victim, signal.SIGSTOP)
        try:
            fs = [p.submit(pid_after, 0.01) for _ in range(100)]
            until(lambda: 1 in backend.health.stopped, what="worker 1 seen stopped")
            assert not cf.wait(fs, timeout=60).not_done
        finally:
            os.kill(victim, signal.SIGCONT)
        deadline = time.monotonic() + 60  # the health check sees it run again (work outstanding)
        while 1 in backend.health.stopped and time.monotonic() < deadline:
            cf.wait([p.submit(pid_after, 0.01) for _ in range(20)], timeout=60)
        assert 1 not in backend.health.stopped
        seen: set[int] = set()
        while victim not in seen and time.monotonic() < deadline:
            seen |= {f.result(60) for f in [p.submit(pid_after, 0.01) for _ in range(20)]}
        assert victim in seen, "the resumed worker never ran a task again"


def test_cancel_racing_the_take_back_keeps_its_contract(tmp_path):
    """A user's cancel() while the pump takes tasks back (the future gets a new id):
    True still means the task never runs, anywhere, also after SIGCONT."""
    path = str(tmp_path / "ran")
    n = 3000
    with shoal.Pilot(2) as p:
        backend = p._backend
        victim = backend.procs[1].pid
        os.kill(victim, signal.SIGSTOP)
        try:
            fs = [p.submit(mark, path, i) for i in range(n)]
            cancelled = set()
            order = list(range(0, n, 2))
            random.Random(0).shuffle(order)
            for k, i in enumerate(order):  # spread over the next health checks
                if fs[i].cancel():
                    cancelled.add(i)
                if k % 50 == 0:
                    time.sleep(0.02)
            assert not cf.wait(fs, timeout=60).not_done
            assert backend.taken_back > 0 and cancelled
        finally:
            os.kill(victim, signal.SIGCONT)
        until(lambda: worker_queue_empty(p, 1), what="the resumed worker's queue empties")
        counts = ran(path)
        for i, f in enumerate(fs):
            if i in cancelled:
                assert f.cancelled() and counts[i] == 0, (i, counts[i])
            else:
                assert f.result() == i and counts[i] == 1, (i, counts[i])
