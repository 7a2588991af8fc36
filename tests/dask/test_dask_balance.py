"""Spawned work moving between machines on a dask pilot: the balancer's pure policy, and
with real clusters (two dask workers, one shoal worker each): a spawn tree that starts on
one machine ends up run on both, exactly; tasks that hold this machine's shared memory
stay where they are."""

from __future__ import annotations

import pytest
import rt_tasks as t
from dask_cluster import (  # noqa: F401 - clusters, pilot: fixtures
    clusters,
    pilot,
    shoal_workers,
    wait_until,
)

import shoal
from shoal.backends.dask.balance import plan
from shoal.workloads import uts

pytestmark = pytest.mark.fd_slack(8)

KINDS = ["dask-localcluster", "dask-cli"]


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    """multiprocessing's resource tracker (started by the first LocalCluster) lives as long
    as this process: start it before the per-test leak check looks, it is no leak."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


# -- the policy (pure) ------------------------------------------------------------------


def test_plan_moves_from_the_busiest_to_the_idle():
    load = {"a": (4, 0), "b": (4, 4), "c": (4, 2), "d": (0, 0)}
    assert plan(load, 0, {}, 0.0) == ("a", ["b", "d"])


def test_plan_waits_for_dask_and_for_quiet_nodes():
    load = {"a": (2, 0), "b": (2, 2)}
    assert plan(load, 1, {}, 0.0) is None  # a task of ours is queued: dask will place it
    assert plan(load, 0, {"a": 5.0}, 1.0) is None  # a gave nothing lately: not before 5.0
    assert plan(load, 0, {"a": 5.0}, 6.0) == ("a", ["b"])
    assert plan({"a": (2, 1), "b": (2, 0)}, 0, {}, 0.0) is None  # nobody idle
    assert plan({"a": (2, 2), "b": (0, 0)}, 0, {}, 0.0) is None  # nobody busy


def test_replica_leaves_as_its_pilot_level_handle():
    """The rule under the balancer (runtime/shared.py): plain shared memory never leaves
    its machine; a backend's registered replica -- and a copy attached from it, which is
    what a task taken from a worker's deque brings back -- pickles as its handle."""
    import pickle

    from shoal.runtime import shared

    arr = shoal.SharedArray((3,), "int64", fill=7)
    cell = shoal.BestCell(4, "max", initial=2.0)
    try:
        assert shared.portable_dumps(arr) is None and shared.portable_dumps([1, cell]) is None
        shared.portable_as(arr, lambda: (str, ("the pilot's array",)))
        shared.portable_as(cell, lambda: (str, (f"the pilot's cell at {cell.value}",)))
        arr2, cell2 = pickle.loads(pickle.dumps((arr, cell)))  # attached copies
        assert arr2 is arr  # a replica of this process is itself, not a second mapping
        got = pickle.loads(shared.portable_dumps({"a": [arr2], "c": (cell2,)}))
        assert got == {"a": ["the pilot's array"], "c": ("the pilot's cell at 2.0",)}
        assert shared.portable_dumps(cell._slots) is None  # a cell's memory alone is no array
        cell.offer(5.0)
        assert pickle.loads(shared.portable_dumps(cell)) == "the pilot's cell at 5.0"
        shared.forget_portable(cell)
        assert shared.portable_dumps(cell) is None  # closed by the backend: plain memory again
        assert pickle.loads(pickle.dumps(cell)).value == 5.0  # within the machine as before
    finally:
        shared.forget_portable(arr)
        shared.forget_portable(cell)
        arr.close()
        cell.close()


# -- real clusters ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=KINDS)
def kind(request, clusters):
    clusters.warm(request.param)
    return request.param


def test_spawn_tree_spreads_over_both_machines(kind, clusters):
    params = uts.UTSParams.preset("T3S")
    with clusters.pilot(kind) as pilot:
        assert uts.count_parallel(pilot, params) == uts.DERIVED["T3S"].nodes
        stats = pilot.stats()
        assert stats["driver"]["moved"] >= 1  # spawned tasks ran on the other machine
        assert all(n["workers"][0]["tasks_run"] > 0 for n in stats["nodes"].values())
        assert pilot.submit(t.fib, 20, 10).result(60) == t.sfib(20)
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


def test_tasks_holding_shared_memory_stay(kind, clusters):
    with clusters.pilot(kind) as pilot:
        arr = shoal.SharedArray((4000,), "int64", fill=-1)
        try:
            assert pilot.submit(t.fill_slices, arr, 40).result(60) == 4000
            assert arr.array.tolist() == list(range(4000))
            assert pilot.stats()["driver"]["moved"] == 0
        finally:
            arr.close()
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


def test_borrower_killed_mid_tree():
    """SIGKILL the machine that borrowed spawned work while the tree runs: the driver
    lends it again (to the lender at worst) and the count stays exact."""
    import os
    import signal
    import threading

    from dask_cluster import local_cluster
    from distributed import Client

    params = uts.UTSParams.preset("T3")
    cluster = local_cluster(2)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot, \
                Client(cluster, set_as_default=False) as client:
            box = {}
            th = threading.Thread(target=lambda: box.update(n=uts.count_parallel(pilot, params)))
            th.start()
            wait_until(lambda: pilot.stats()["driver"]["moved"] >= 1, 60, "work lent")
            idle = [a for a, keys in client.processing().items() if not keys]  # the borrower
            if idle:
                pid = client.run(os.getpid, workers=idle[:1])[idle[0]]
                os.kill(pid, signal.SIGKILL)
            th.join(110)
            assert box.get("n") == uts.PUBLISHED["T3"].nodes
    finally:
        cluster.close()


def test_tasks_carrying_pilot_cells_move(kind, clusters):
    """A user's spawn program passes a ``BestCell.for_pilot`` (a stop flag) and a
    ``SharedArray.per_node`` to its tasks: the balancer still lends them (each machine's
    replicas go as the pilot-level objects and re-attach to the destination's), a moved
    task sees the flag the driver raises, and it counts itself in the array of the
    machine it ran on.  (Before: such tasks refused to leave, NodeBound, and all ran on
    the first machine.)"""
    import search_tasks as st

    n = 8
    with clusters.pilot(kind) as pilot, clusters.client(kind) as client:
        flag = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
        rows = shoal.SharedArray.per_node(pilot, (pilot.workers + 1, 1), "int64", fill=0)
        try:
            fut = pilot.submit(st.spinners, flag, rows, n)
            try:
                wait_until(lambda: pilot.stats()["driver"]["moved"] >= 1, 60,
                           "the balancer to lend a task that carries the pilot's cell")
            finally:
                flag.offer(1.0)  # every leaf, wherever it runs, stops on this
            assert fut.result(60) == ["stopped"] * n
            per_machine = client.run(st.node_rows, rows)
            assert sum(per_machine.values()) == n
            assert all(v > 0 for v in per_machine.values()), per_machine  # both ran leaves
        finally:
            flag.close()
            rows.close()
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")
