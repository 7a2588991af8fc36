"""Skeleton conformance: the search skeletons give the same answers on the local backend,
on dask with a LocalCluster and on dask with a command-line cluster (two dask workers, one
shoal worker each, so every search spans two machines' worth of node runtimes); the
cross-node protocol (cells kept in step through the driver, a stop reaching every node);
and a dask worker SIGKILLed in the middle of a search."""

from __future__ import annotations

import functools
import os
import pathlib
import signal
import threading

import psutil
import pytest
import search_tasks as st
from dask_cluster import (  # noqa: F401 - clusters, pilot: fixtures
    BACKEND_PARAMS,
    TESTBED,
    clusters,
    local_cluster,
    pilot,
    shoal_workers,
    wait_until,
)

import shoal
from shoal.backends.dask import cells as dask_cells
from shoal.patterns import backtracking as bt
from shoal.patterns import branch_and_bound as bb

DIMACS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "data" / "dimacs"

COORDS = ["sequential", "depth-bounded", "budget", "stack-stealing", "indexed"]

# dask pools connections to the module-scoped clusters; more open under concurrency
pytestmark = pytest.mark.fd_slack(8)


# the dask column again with a worker on each of 3 hosts of scripts/testbed (-m multihost)
@pytest.fixture(scope="module",
                params=[*BACKEND_PARAMS, pytest.param(TESTBED, marks=pytest.mark.multihost)])
def kind(request, clusters):
    clusters.warm(request.param)  # before the per-test leak check looks
    return request.param


def _q(n):
    return functools.partial(st.queens, n), functools.partial(st.placed, n)


@pytest.mark.parametrize("coordination", COORDS)
def test_count_nqueens(pilot, coordination):
    children, leaf = _q(8)
    got = bt.count(pilot, (), children, accept=leaf, coordination=coordination, stats=True,
                   budget=50)
    assert got == st.OEIS_A000170[8]
    if pilot.nodes > 1 and coordination != "sequential":
        assert got.stats.tasks > 1  # the driver split the top of the tree between machines


def test_count_all_nodes_and_per_depth(pilot):
    children, _ = _q(6)
    got = bt.count(pilot, (), children, stats=True)
    seq = bt.count(pilot, (), children, coordination="sequential", stats=True)
    assert got == seq and got.stats.per_depth == seq.stats.per_depth
    assert sum(got.stats.per_depth) == got


def test_find_and_no_solution(pilot):
    children, leaf = _q(10)
    hit = bt.find(pilot, (), children, leaf)
    assert leaf(hit) and list(children(hit)) == []
    assert all(abs(a - b) != j - i for i, a in enumerate(hit) for j, b in enumerate(hit) if i < j)
    children3, leaf3 = _q(3)
    assert bt.find(pilot, (), children3, leaf3) is None


def test_solutions_stream(pilot):
    children, leaf = _q(7)
    got = sorted(bt.solutions(pilot, (), children, leaf, chunk_nodes=50))
    assert len(got) == st.OEIS_A000170[7] and len(set(got)) == len(got)


@pytest.mark.parametrize("coordination", ["depth-bounded", "stack-stealing", "indexed"])
def test_maximise_minimise_knapsack(pilot, coordination):
    items, cap = st.knapsack_instance(seed=3)
    k = st.Knapsack(items, cap)
    want = st.knapsack_dp(items, cap)
    res = bb.maximise(pilot, (0, 0, 0), k.children, k.objective, k.bound,
                      coordination=coordination, stats=True)
    assert res.value == want and k.objective(res.node) == want and res.node[1] <= cap
    low = bb.minimise(pilot, (0, 0, 0), k.children, k.cost, k.cost_bound,
                      coordination=coordination)
    assert low.value == -want


def test_error_names_the_path(pilot):
    with pytest.raises(bt.SearchError, match=r"children\(\) raised ValueError.*path \(\d+, \d+\)"):
        bt.count(pilot, (), st.bad_children)


# -- across nodes --------------------------------------------------------------------------


@pytest.fixture
def dask_kind(kind):
    if kind == "local":
        pytest.skip("a cross-node protocol: dask only")
    return kind


def test_find_stops_every_node(dask_kind, clusters):
    """The other machines are deep in subtrees that never end: only the stop broadcast
    (hit on one node -> driver -> every node) lets find() return."""
    with clusters.pilot(dask_kind) as pilot:
        assert pilot.nodes == (3 if dask_kind == TESTBED else 2)
        got = bt.find(pilot, ("r", 0), st.needle, st.is_needle, stats=True)
        assert got.node == ("g", 6) and got.path == (0,) * 6
        assert got.stats.stop_latency_s is not None
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


@pytest.mark.parametrize("coordination", ["stack-stealing", "indexed"])
def test_subtrees_move_to_an_idle_machine(dask_kind, clusters, coordination):
    """One group holds nearly the whole tree: once the others are done, the runtime's
    balancer lends the busy machine's spawned subtrees (the reserve its running task
    keeps) to the idle one -- search tasks carry the search's cells and Control, which
    travel as pilot-level objects -- and the count stays exact.  ``stats.exported`` is
    the balancer's count of tasks moved (the search has no export path of its own)."""
    exported = []
    with clusters.pilot(dask_kind) as pilot:
        # Whether the idle machine asks before the busy one finishes on its own depends
        # on scheduling: every count must be exact, and within three runs a subtree must
        # move.
        for _ in range(3):
            got = bt.count(pilot, (), st.lopsided, coordination=coordination, stats=True)
            assert got == st.LOPSIDED_NODES
            exported.append(got.stats.exported)
            if got.stats.exported >= 1:
                break
    assert max(exported) >= 1, f"no subtree moved in {len(exported)} runs"
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


CLIQUE_NUMBERS = {"brock200_2": 12, "keller4": 11}  # DIMACS, published


@pytest.mark.parametrize("app", ["queens-10", "brock200_2", "keller4"])
def test_exact_answers_with_the_balancer_moving_work(dask_kind, clusters, app):
    """N-Queens counts (OEIS A000170) and clique numbers (DIMACS) on two machines, where
    only the runtime's balancer moves subtrees between them: exact, whatever moved."""
    with clusters.pilot(dask_kind) as pilot:
        if app.startswith("queens-"):
            n = int(app.split("-")[1])
            children, leaf = _q(n)
            got = bt.count(pilot, (), children, accept=leaf, stats=True)
            assert got == st.OEIS_A000170[n]
        else:
            adj = st.read_dimacs(DIMACS / f"{app}.clq")
            got = bb.maximise(pilot, st.clique_root(adj), functools.partial(st.clique_children, adj),
                              st.clique_size, st.clique_bound, prune_level=True, stats=True)
            assert got.value == CLIQUE_NUMBERS[app] == bin(got.node[1]).count("1")
            assert st.is_clique(adj, got.node[1])
        assert got.stats.exported >= 0


def test_cells_kept_in_step_across_nodes(dask_kind, clusters):
    with clusters.pilot(dask_kind) as pilot, clusters.client(dask_kind) as client:
        a, b = sorted(client.scheduler_info()["workers"])[:2]
        cell = shoal.BestCell.for_pilot(pilot, "max")
        assert client.run(st.replica_value, cell, workers=[b])[b] == float("-inf")
        client.run(st.write_worker_slot, cell, 5.0, workers=[a])
        wait_until(lambda: cell.value == 5.0, 10, "node a's improvement to reach the driver")
        wait_until(lambda: client.run(st.replica_value, cell, workers=[b])[b] == 5.0, 10,
                   "the driver to relay it to node b")
        assert cell.offer(9.0)  # the driver's own offers go to every node too
        wait_until(lambda: set(client.run(st.replica_value, cell).values()) == {9.0}, 10,
                   "the driver's offer to reach every node")
        client.run(st.write_worker_slot, cell, 7.0, workers=[b])  # worse: changes nothing
        assert cell.value == 9.0
        cell.close()
        assert dask_cells.topic(pilot._backend.token).startswith("shoal-cells-")


def test_new_replica_hears_what_was_broadcast_before_it(dask_kind, clusters):
    """A stop raised while a machine has no replica of the flag yet is broadcast past it;
    a task lent from a machine that had not heard it yet brings a stale value.  The new
    replica asks the driver (``join``), which answers with its best: the stop arrives.
    (Before: the replica kept the stale 0.0 until the next improvement, i.e. for ever.)"""
    with clusters.pilot(dask_kind) as pilot, clusters.client(dask_kind) as client:
        b = sorted(client.scheduler_info()["workers"])[1]
        flag = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
        try:
            flag.offer(1.0)  # no machine has a replica: the broadcast changes nothing there
            assert client.run(st.replica_by_token, flag.token, workers=[b])[b] is None
            client.run(st.stale_replica, pilot._backend.token, flag.token, workers=[b])
            wait_until(lambda: client.run(st.replica_by_token, flag.token, workers=[b])[b] == 1.0,
                       10, "the driver to answer the new replica with the raised flag")
        finally:
            flag.close()


def test_sigkill_dask_worker_mid_search():
    """A dask worker dies with part of the tree: dask re-runs its group elsewhere, from
    scratch (a group's count reaches the driver only whole), so the count stays exact."""
    cluster = local_cluster(2)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
            children, leaf = _q(10)
            box = {}
            th = threading.Thread(target=lambda: box.update(n=bt.count(
                pilot, (), children, accept=leaf, coordination="indexed")))
            th.start()
            wait_until(lambda: len(shoal_workers()) == 2, 30, "both node runtimes")
            victim = psutil.Process(shoal_workers()[0]).ppid()  # a dask worker process
            os.kill(victim, signal.SIGKILL)
            th.join(100)
            assert box.get("n") == st.OEIS_A000170[10]
    finally:
        cluster.close()
