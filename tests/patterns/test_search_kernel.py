"""count(kernel=, kernel_depth=): the user's sequential function counts whole subtrees
below a depth, the skeleton splits above it; exact (OEIS) on every coordination."""

from __future__ import annotations

import functools

import pytest
import search_apps as apps

import shoal
from shoal.patterns import SearchError, backtracking
from shoal.workloads.nqueens import OEIS_A000170

nq = apps.search_nqueens


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
@pytest.mark.parametrize("depth", [0, 1, 3, 9])
def test_kernel_counts_exactly(pilot2, coordination, depth):
    n = 9
    r = backtracking.count(pilot2, nq.ROOT, functools.partial(nq.children, n),
                           accept=functools.partial(nq.is_solution, n),
                           kernel=functools.partial(apps.queens_kernel, n), kernel_depth=depth,
                           coordination=coordination, stats=True)
    assert r == OEIS_A000170[n]
    full = backtracking.count(pilot2, nq.ROOT, functools.partial(nq.children, n), stats=True)
    assert r.stats.nodes < full.stats.nodes or depth == 9  # the kernels' nodes are not counted


def _tree3_kernel(node):
    """The nodes of a complete ternary subtree of depth 4 - len(node)."""
    return sum(3 ** i for i in range(5 - len(node)))


@pytest.mark.parametrize("depth", [0, 2, 4, 7])
def test_kernel_without_accept_counts_nodes(pilot2, depth):
    assert backtracking.count(pilot2, (), apps.tree3, kernel=_tree3_kernel,
                              kernel_depth=depth) == 121


def test_kernel_errors(pilot2):
    kids = functools.partial(nq.children, 6)
    with pytest.raises(SearchError, match=r"kernel\(\) raised RuntimeError\('kernel boom'\) at "
                                          r"node path \(\d+, \d+\) \(node "):
        backtracking.count(pilot2, nq.ROOT, kids, kernel=apps.kernel_boom, kernel_depth=2)
    with pytest.raises(TypeError, match=r"kernel\(\) returned 'many' \(str\)"):
        backtracking.count(pilot2, nq.ROOT, kids, kernel=apps.kernel_str, kernel_depth=1)
    with pytest.raises(ValueError, match="kernel_depth"):
        backtracking.count(pilot2, nq.ROOT, kids, kernel=apps.kernel_str)
    with pytest.raises(TypeError, match="kernel_depth= without kernel="):
        backtracking.count(pilot2, nq.ROOT, kids, kernel_depth=2)
    with pytest.raises(ValueError, match="exclude each other"):
        backtracking.count(pilot2, nq.ROOT, kids, kernel=apps.kernel_str, kernel_depth=1,
                           checkpoint="/nonexistent/x")
