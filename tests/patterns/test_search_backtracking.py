"""backtracking.count/find/solutions against OEIS A000170 and the UTS published sizes."""

from __future__ import annotations

import functools
import signal
import threading
import time

import pytest
import search_apps as apps

import shoal
from shoal.patterns import Coordination, SearchError, backtracking
from shoal.workloads import uts
from shoal.workloads.nqueens import OEIS_A000170


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


@pytest.fixture(scope="module")
def pilot1():
    with shoal.Pilot(workers=1) as p:
        yield p


@pytest.mark.no_leak_check
@pytest.mark.parametrize("n", range(1, 11))
def test_nqueens_oeis(pilot2, n):
    assert apps.queens(pilot2, n) == OEIS_A000170[n]


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS + list(Coordination))
@pytest.mark.parametrize("workers", [1, 2])
def test_nqueens_every_coordination(pilot1, pilot2, coordination, workers):
    pilot = pilot1 if workers == 1 else pilot2
    got = apps.queens(pilot, 8, coordination=coordination, budget=50, spawn_depth=3, stats=True)
    assert got == 92
    assert got.stats.nodes == 2057  # nodes of the 8-queens tree, root included


@pytest.mark.no_leak_check
def test_count_all_nodes_and_per_depth(pilot2):
    got = backtracking.count(pilot2, (), apps.tree3, stats=True)
    assert got == 121 and got.stats.per_depth == (1, 3, 9, 27, 81)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("name", ["T1XS", "T3XS"])
@pytest.mark.parametrize("coordination", ["stack-stealing", "budget", "indexed"])
def test_uts_small(pilot2, name, coordination):
    params = uts.UTSParams.preset(name)
    got = backtracking.count(pilot2, uts.root(params), functools.partial(apps.uts_children, params),
                             coordination=coordination, budget=2000)
    assert got == uts.DERIVED[name].nodes


@pytest.mark.slow
@pytest.mark.no_leak_check
@pytest.mark.parametrize("name", ["T1", "T3"])
def test_uts_published(pilot2, name):
    params = uts.UTSParams.preset(name)
    got = backtracking.count(pilot2, uts.root(params), functools.partial(apps.uts_children, params))
    assert got == uts.PUBLISHED[name].nodes


@pytest.mark.slow
@pytest.mark.no_leak_check
@pytest.mark.parametrize("n", [11, 12, 13])
def test_nqueens_oeis_large(pilot2, n):
    assert apps.queens(pilot2, n) == OEIS_A000170[n]


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_find(pilot2, coordination):
    n = 10
    got = backtracking.find(pilot2, search_nqueens_root(), functools.partial(apps.queens_children, n),
                            functools.partial(apps.search_nqueens.is_solution, n),
                            coordination=coordination, stats=True)
    assert got.node[0] == n and got.stats.stop_latency_s is not None
    board = got.node
    assert board[1] == (1 << n) - 1  # every column taken
    assert backtracking.find(pilot2, (), apps.tree3, lambda node: len(node) > 4) is None


def search_nqueens_root():
    return apps.search_nqueens.ROOT


@pytest.mark.no_leak_check
def test_find_stops_promptly(pilot2):
    """A hit early in depth-first order of a big tree (4**12 nodes, 1 ms each) ends the search."""
    t = time.monotonic()
    got = backtracking.find(pilot2, (), apps.slow_children,
                            lambda node: len(node) == 12 and node[-1] == 1, stats=True)
    assert len(got.node) == 12 and got.node[-1] == 1
    assert time.monotonic() - t < 60  # a hang guard, not a speed claim
    assert got.stats.nodes < 10_000


@pytest.mark.no_leak_check
def test_solutions_stream(pilot2):
    n = 8
    it = backtracking.solutions(pilot2, apps.search_nqueens.ROOT,
                                functools.partial(apps.queens_children, n),
                                functools.partial(apps.search_nqueens.is_solution, n),
                                chunk_nodes=100, chunk_solutions=5)
    boards = list(it)
    assert len(boards) == 92 and all(b[0] == n for b in boards)
    leaves = list(backtracking.solutions(pilot2, (), apps.tree3, apps.is_leaf, chunk_nodes=7,
                                         chunk_solutions=4))
    assert sorted(leaves) == sorted(leaf for leaf in _all_tuples(4))


def _all_tuples(depth):
    import itertools

    return itertools.product(range(3), repeat=depth)


@pytest.mark.no_leak_check
def test_solutions_close_early(pilot2):
    n = 10
    it = backtracking.solutions(pilot2, apps.search_nqueens.ROOT,
                                functools.partial(apps.queens_children, n),
                                functools.partial(apps.search_nqueens.is_solution, n))
    first = next(it)
    assert first[0] == n
    it.close()
    assert pilot2.submit(int, 7).result(timeout=30) == 7


# -- bad input --------------------------------------------------------------------------


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_children_raises_names_path(pilot2, coordination):
    with pytest.raises(SearchError, match=r"children\(\) raised RuntimeError\('boom'\) at node path \(\d, \d\)"):
        backtracking.count(pilot2, (), apps.boom_at_depth2, coordination=coordination)
    assert pilot2.submit(int, 3).result(timeout=30) == 3  # the pilot goes on


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_children_not_iterable(pilot2, coordination):
    with pytest.raises(SearchError, match=r"non-iterable int at node path \(1, 2\)"):
        backtracking.count(pilot2, (), apps.not_iterable_at_12, coordination=coordination)


@pytest.mark.no_leak_check
def test_unpicklable_nodes(pilot2):
    with pytest.raises(SearchError, match=r"node at path \(\d, \d, \d\) cannot be pickled"):
        backtracking.count(pilot2, (), apps.unpicklable_kids, coordination="depth-bounded",
                           spawn_depth=3)
    # indexed ships paths, never nodes: fine
    assert backtracking.count(pilot2, (), apps.unpicklable_kids, coordination="indexed") == 40
    with pytest.raises(SearchError, match="root.*cannot be pickled|path \\(\\) cannot be pickled"):
        backtracking.count(pilot2, threading.Lock(), apps.tree3)


def test_bad_options():
    with shoal.Pilot(workers=1) as pilot:
        with pytest.raises(ValueError, match="unknown coordination='greedy'"):
            backtracking.count(pilot, (), apps.tree3, coordination="greedy")
        with pytest.raises(ValueError, match="budget"):
            backtracking.count(pilot, (), apps.tree3, budget=0)
        with pytest.raises(TypeError, match="children must be a function"):
            backtracking.count(pilot, (), [1, 2])
        with pytest.raises(TypeError, match="goal must be a function"):
            backtracking.find(pilot, (), apps.tree3, None)


@pytest.mark.no_leak_check
def test_keyboard_interrupt_stops_cleanly(pilot2):
    main = threading.main_thread().ident
    timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))  # a real Ctrl-C
    timer.start()
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        backtracking.count(pilot2, (), apps.slow_children)  # 4**12 nodes of 1 ms: hours
    assert time.monotonic() - t < 60
    # the workers are free again: a new task runs at once
    assert pilot2.submit(int, 5).result(timeout=30) == 5
