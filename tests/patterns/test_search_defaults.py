"""Every default of the search skeletons gives the right answer on children in any order.

YewPar-style random graphs G(n, p) whose children come in a scrambled vertex
order (not best bound first), against a brute-force clique enumeration written
here (no bound, nothing shared with the skeleton).  ``prune_level`` is opt-in;
when asked for on children that visibly break its promise it is refused.
"""

from __future__ import annotations

import functools

import pytest
import search_apps as apps

import shoal
from shoal.patterns import SearchError, backtracking, branch_and_bound

# (n, p, seed): YewPar's random-graph sizes, small enough for the brute force
GRAPHS = [(36, 0.5, 1), (36, 0.5, 2), (30, 0.7, 3), (30, 0.7, 4), (40, 0.4, 5), (28, 0.8, 6)]


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def _maximise(pilot, adj, **options):
    return branch_and_bound.maximise(pilot, apps.clique_root(adj),
                                     functools.partial(apps.clique_children_unordered, adj),
                                     apps.clique_size, apps.clique_bound, **options)


@pytest.mark.parametrize("n,p,seed", GRAPHS)
def test_defaults_exact_on_unordered_children(pilot2, n, p, seed):
    adj = apps.random_graph(n, p, seed)
    want = apps.brute_force_clique(adj)
    r = _maximise(pilot2, adj)  # every option at its default
    assert r.value == want
    assert r.node[1].bit_count() == want
    vs = [v for v in range(n) if r.node[1] >> v & 1]
    assert all(adj[u] >> v & 1 for i, u in enumerate(vs) for v in vs[i + 1:])


@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_every_coordination_exact_on_unordered_children(pilot2, coordination):
    adj = apps.random_graph(36, 0.5, 2)
    want = apps.brute_force_clique(adj)
    assert _maximise(pilot2, adj, coordination=coordination).value == want
    low = branch_and_bound.minimise(  # the same search, minimising the negated size
        pilot2, apps.clique_root(adj), functools.partial(apps.clique_children_unordered, adj),
        lambda nd: -nd[0], lambda nd: -apps.clique_bound(nd), coordination=coordination)
    assert low.value == -want


def test_find_and_count_defaults_on_unordered_children(pilot2):
    adj = apps.random_graph(30, 0.7, 3)
    want = apps.brute_force_clique(adj)
    kids = functools.partial(apps.clique_children_unordered, adj)
    hit = backtracking.find(pilot2, apps.clique_root(adj), kids, lambda nd: nd[0] == want)
    assert hit is not None and hit[0] == want
    assert backtracking.find(pilot2, apps.clique_root(adj), kids,
                             lambda nd: nd[0] > want) is None
    # every clique once (the root is the empty one), as the brute force enumerates them
    n_cliques = backtracking.count(pilot2, apps.clique_root(adj), kids)
    assert n_cliques == _count_cliques(adj)


def _count_cliques(adj) -> int:
    total, stack = 0, [(1 << len(adj)) - 1]
    while stack:
        cand = stack.pop()
        total += 1
        while cand:
            bit = cand & -cand
            cand &= ~bit
            stack.append(cand & adj[bit.bit_length() - 1])
    return total


@pytest.mark.parametrize("coordination", ["sequential", "stack-stealing"])
def test_prune_level_refuses_misordered_children(pilot2, coordination):
    with pytest.raises(SearchError, match=r"prune_level=True needs children in non-increasing "
                                          r"upper bound order.*child 1 of node path \(0,\)"):
        branch_and_bound.maximise(pilot2, (), apps.rising_children, apps.rising_objective,
                                  apps.rising_bound, prune_level=True, coordination=coordination)
    with pytest.raises(SearchError, match="non-decreasing lower bound order"):
        branch_and_bound.minimise(pilot2, (), apps.rising_children,
                                  lambda nd: -apps.rising_objective(nd),
                                  lambda nd: -apps.rising_bound(nd), prune_level=True,
                                  coordination=coordination)


def test_prune_level_off_by_default_is_exact(pilot2):
    r = branch_and_bound.maximise(pilot2, (), apps.rising_children, apps.rising_objective,
                                  apps.rising_bound)
    assert r.value == 6 and r.node == (2, 2, 2)
