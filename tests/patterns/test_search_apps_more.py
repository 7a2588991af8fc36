"""branch_and_bound on 0/1 knapsack (against dynamic programming) and minimum vertex
cover (against brute force), on generated instances."""

from __future__ import annotations

import sys

import pytest
import search_apps as apps

import shoal

if str(apps.ROOT / "examples") not in sys.path:
    sys.path.append(str(apps.ROOT / "examples"))
import search_knapsack as ks  # noqa: E402
import search_vertexcover as vc  # noqa: E402


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def test_dantzig_bound_is_an_upper_bound_and_non_increasing():
    pr = ks.problem(*ks.generate(12, 3, "weak"))
    stack = [ks.root(pr)]
    while stack:
        node = stack.pop()
        kids = ks.children(pr, node)
        assert [c.bound for c in kids] == sorted((c.bound for c in kids), reverse=True)
        rest = ks.problem(pr.values[node.i:], pr.weights[node.i:], pr.capacity - node.weight)
        assert node.value + ks.dp(rest.values, rest.weights, rest.capacity) <= node.bound
        stack.extend(kids)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("kind", ["uncorrelated", "weak", "strong"])
def test_knapsack_against_dp(pilot2, kind):
    for seed in range(6):
        vs, ws, cap = ks.generate(30 + 5 * seed, seed, kind)
        pr = ks.problem(vs, ws, cap)
        r = ks.solve(pilot2, pr)
        assert r.value == ks.dp(vs, ws, cap), (kind, seed)
        packed = ks.items(pr, r.node)
        assert sum(ws[j] for j in packed) <= cap and sum(vs[j] for j in packed) == r.value


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_knapsack_every_coordination(pilot2, coordination):
    vs, ws, cap = ks.generate(50, 7, "strong")
    r = ks.solve(pilot2, ks.problem(vs, ws, cap), coordination=coordination)
    assert r.value == ks.dp(vs, ws, cap)


def test_knapsack_bad_instance():
    with pytest.raises(ValueError, match="weights"):
        ks.problem((1, 2), (1, 0), 5)


@pytest.mark.no_leak_check
def test_vertex_cover_against_brute_force(pilot2):
    for seed in range(12):
        for n, p in ((9, 0.3), (12, 0.5), (13, 0.2)):
            adj = vc.random_graph(n, p, seed)
            r = vc.solve(pilot2, adj)
            assert r.value == vc.brute_force(adj), (seed, n, p)
            assert vc.is_cover(adj, r.node.cover) and r.node.cover.bit_count() == r.value


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_vertex_cover_every_coordination(pilot2, coordination):
    adj = vc.random_graph(80, 0.15, 2)
    want = vc.sequential_reference(adj)
    r = vc.solve(pilot2, adj, coordination=coordination)
    assert r.value == want and vc.is_cover(adj, r.node.cover)


@pytest.mark.no_leak_check
def test_vertex_cover_no_edges(pilot2):
    r = vc.solve(pilot2, (0, 0, 0))
    assert r.value == 0 and r.node.cover == 0


# -- permutation flowshop: Taillard's 20x5 instances --------------------------------------

fs = apps.search_flowshop


def test_flowshop_bounds_are_lower_bounds():
    import itertools
    import random

    rng = random.Random(0)
    for trial in range(40):
        p = tuple(row[:7] for row in fs.taillard(fs.TA20x5_SEEDS[trial % 10], 20, 5))
        pr = fs.problem(p)
        seq = tuple(rng.sample(range(7), rng.randint(0, 5)))
        rest = [j for j in range(7) if j not in seq]
        done = [0] * 5
        for j in seq:
            prev = 0
            for k in range(5):
                prev = done[k] = max(done[k], prev) + p[k][j]
        lb = fs.lower_bound(pr, tuple(done), sum(1 << j for j in rest))
        best = min(fs.makespan(p, seq + tail) for tail in itertools.permutations(rest))
        assert fs.lower_bound(fs.problem(p, False), tuple(done), sum(1 << j for j in rest)) <= lb
        assert lb <= best


def test_johnson_order():
    assert fs.johnson_order([3, 5, 1, 6, 7], [6, 2, 2, 6, 5]) == (2, 0, 3, 4, 1)


@pytest.mark.no_leak_check
def test_ta002_with_neh(pilot2):
    p = fs.taillard(fs.TA20x5_SEEDS[1], 20, 5)
    r = fs.solve(pilot2, p)
    assert r.value == fs.TA20x5_OPTIMA[1] == fs.makespan(p, r.node.seq)


@pytest.mark.slow
@pytest.mark.no_leak_check
@pytest.mark.parametrize("instance, prove", [(7, False), (3, True), (9, True)])
def test_taillard_optima(pilot2, instance, prove):
    """ta007 from NEH; ta003 and ta009 as a proof (searching from the published optimum)."""
    p = fs.taillard(fs.TA20x5_SEEDS[instance - 1], 20, 5)
    want = fs.TA20x5_OPTIMA[instance - 1]
    r = fs.solve(pilot2, p, upper=want if prove else None)
    assert r.value == want == fs.makespan(p, r.node.seq)
