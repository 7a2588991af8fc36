"""Attacks on the node replicas of pilot-level shared objects on a dask pilot (cells.py):
``BestCell.for_pilot`` / ``SharedArray.per_node`` replicas that a running task holds,
that travel with lent tasks, and that the driver stops.  Real dask scheduler/worker
processes (LocalCluster); every wait bounded."""

from __future__ import annotations

import os

import attack_tasks as at
import pytest
from dask_cluster import local_cluster, shoal_workers, two_workers, wait_until

import shoal

pytestmark = pytest.mark.fd_slack(8)
cluster = pytest.fixture(scope="module", name="cluster")(two_workers)  # 2 dask workers


def test_a_running_task_still_hears_its_flag_after_many_other_replicas(cluster):
    """A task waits for a ``BestCell.for_pilot`` flag; meanwhile the same node makes more
    replicas than the old LRU bound of 256 (300 ``per_node`` arrays arrive on every
    dask worker with a ``client.run``, 150 at a time).  Before: the flag's replica was evicted and closed under the running waiter,
    the driver's offer reached no replica, and the waiter never stopped ("timeout")."""
    from distributed import Client

    with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot, \
            Client(cluster, set_as_default=False) as client:
        flag = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
        arrays = [shoal.SharedArray.per_node(pilot, (2,), "int64", fill=0) for _ in range(300)]
        try:
            waiter = pilot.submit(at.wait_flag, flag, 20.0)
            wait_until(waiter.running, 60, "the waiter started")
            for part in (arrays[:150], arrays[150:]):
                assert set(client.run(at.touch_all, part).values()) == {150}
            flag.offer(1.0)
            assert waiter.result(60) == "stopped"
        finally:
            flag.close()
            for a in arrays:
                a.close()
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


def test_a_task_carrying_300_pilot_level_arrays(cluster):
    """Before: dask unpickling the task's arguments made 300 replicas and the LRU closed
    the first 44 while it did: "a closed SharedArray cannot be sent to a task"."""
    with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
        arrays = [shoal.SharedArray.per_node(pilot, (2,), "int64", fill=0) for _ in range(300)]
        try:
            assert pilot.submit(at.touch_all, arrays).result(60) == 300
        finally:
            for a in arrays:
                a.close()


def _marks(path: str) -> list[str]:
    """The lines ``at.improvers``' leaves wrote: ``value machine``, one per offer."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def _improve_then_stop(pilot, n: int, path: str, timeout: float, meanwhile=lambda: None):
    """Run ``at.improvers`` (``n`` leaves offer 10..10+n-1 to a pilot-wide best, then wait
    for a stop flag) until leaves wait on both machines and work was lent; call
    ``meanwhile()``, then raise the flag.  Every leaf must stop and the driver's best end
    exactly at the maximum; returns the values offered (one per offer)."""
    best = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
    flag = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
    try:
        fut = pilot.submit(at.improvers, best, flag, n, path)
        try:
            wait_until(lambda: pilot.stats()["driver"]["moved"] >= 1
                       and len({ln.split()[1] for ln in _marks(path)}) == 2, 60,
                       "leaves waiting on both machines")
            meanwhile()
        finally:
            flag.offer(1.0)
        got = fut.result(timeout)
        assert [g[0] for g in got] == ["stopped"] * n
        wait_until(lambda: best.value == 10.0 + n - 1, 30,
                   f"the driver's best to reach {10 + n - 1} (it is {best.value})")
        return [float(ln.split()[0]) for ln in _marks(path)]
    finally:
        best.close()
        flag.close()


def test_lent_leaves_improve_the_best_while_the_driver_stops(cluster, tmp_path):
    """A spawn program's leaves offer 10..10+n-1 to a pilot-wide best and wait for a stop
    flag; the balancer lends some to the other machine.  The driver raises the flag once
    work was lent and leaves run on both machines, *while* later leaves still improve the
    best (some on the borrower, after the stop): every leaf stops, and the driver's best
    ends exactly at the maximum, whichever machine offered it and when."""
    n = 8
    with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
        offered = _improve_then_stop(pilot, n, str(tmp_path / "marks"), 60)
        assert sorted(offered) == [10.0 + i for i in range(n)]
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


def test_the_borrower_dies_holding_moved_replicas(tmp_path):
    """Leaves carrying a pilot-wide best and a stop flag were lent to the other machine
    and wait there; that machine is SIGKILLed (its replicas die with it), then the
    driver raises the flag.  The lent leaves run again elsewhere, hear the flag (the
    replicas they meet there, or a new one that asks the driver), and the program ends:
    every leaf "stopped", each value offered at least once, the best exact."""
    import signal

    from distributed import Client

    n = 6
    cluster = local_cluster(2)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot, \
                Client(cluster, set_as_default=False) as client:

            def kill_the_borrower():
                pids = client.run(os.getpid)
                lender = {a for a, keys in client.processing().items() if keys}
                borrower = [pid for a, pid in pids.items() if a not in lender]
                assert len(borrower) == 1, (pids, lender)
                os.kill(borrower[0], signal.SIGKILL)

            offered = _improve_then_stop(pilot, n, str(tmp_path / "marks"), 90, kill_the_borrower)
            assert set(offered) == {10.0 + i for i in range(n)}
    finally:
        cluster.close()
    # a killed dask worker's shoal workers exit at their lifeline's end once their task is
    # over; 10 s was too short on a loaded 2-core machine (the heavy run beside the test bed)
    wait_until(lambda: not shoal_workers(), 30, "the pilot's shoal workers to exit")
