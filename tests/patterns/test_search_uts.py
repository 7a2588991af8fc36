"""UTS through backtracking.count: trees of published (or sequentially confirmed) size,
every coordination, 1 and 2 workers.

The DEFAULT tree is the UTS reference code's default (geometric, b0 = 4, depth 6):
1732 nodes, 1050 leaves, deepest node at height 6, as published (uts.PUBLISHED).
T3XS is T3's binomial distribution with a 500-child root; its size is a
regression value that ``uts.count_sequential`` confirms here first.  The
published T1 and T3 through the skeleton are ``-m slow`` tests in
test_search_backtracking.py.
"""

from __future__ import annotations

import functools

import pytest
import search_apps as apps

import shoal
from shoal.patterns import backtracking
from shoal.workloads import uts

DEFAULT = uts.UTSParams.preset("DEFAULT")


def is_leaf(params, node) -> bool:
    return uts.num_children(params, node) == 0


def uts_count(pilot, params, **options):
    return backtracking.count(pilot, uts.root(params),
                              functools.partial(apps.uts_children, params), **options)


@pytest.fixture(scope="module")
def pilots():
    with shoal.Pilot(workers=1) as p1, shoal.Pilot(workers=2) as p2:
        yield {1: p1, 2: p2}


def test_default_tree_sequentially():
    """The published sizes hold for this module's RNG, without shoal's runtime."""
    got = uts.search_sequential(DEFAULT)
    assert got == uts.PUBLISHED["DEFAULT"]
    assert got.nodes == 1732 and got.leaves == 1050 and got.max_depth == 6


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
@pytest.mark.parametrize("workers", [1, 2])
def test_default_tree_every_coordination(pilots, coordination, workers):
    want = uts.PUBLISHED["DEFAULT"]
    got = uts_count(pilots[workers], DEFAULT, coordination=coordination, budget=20,
                    spawn_depth=3, stats=True)
    assert got == want.nodes
    assert got.stats.nodes == want.nodes
    # per-depth counts: one entry per height 0..max_depth, summing to the tree
    assert len(got.stats.per_depth) == want.max_depth + 1
    assert sum(got.stats.per_depth) == want.nodes and got.stats.per_depth[0] == 1
    if coordination in ("depth-bounded", "budget"):  # these split whoever is idle
        assert got.stats.tasks > 1


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_default_tree_leaves(pilots, coordination):
    """count(accept=leaf) is the published leaf count."""
    got = uts_count(pilots[2], DEFAULT, accept=functools.partial(is_leaf, DEFAULT),
                    coordination=coordination, budget=20, spawn_depth=3)
    assert got == uts.PUBLISHED["DEFAULT"].leaves


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
@pytest.mark.parametrize("workers", [1, 2])
def test_binomial_tree_every_coordination(pilots, coordination, workers):
    """T3XS: 101,045 nodes, 265 levels deep, most of them under one root child."""
    params = uts.UTSParams.preset("T3XS")
    want = uts.DERIVED["T3XS"].nodes
    assert uts.count_sequential(params) == want
    got = uts_count(pilots[workers], params, coordination=coordination, budget=2000)
    assert got == want
    assert got.stats.nodes == want
