"""Taillard's flowshop with bidirectional branching: every bound is a true lower bound
(against brute force over all completions), small instances match brute force, and the
20 x 5 instances are proved optimal against the published optima (Taillard 1993)."""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import search_apps as apps

import shoal
from shoal.patterns import branch_and_bound

fs = apps.search_flowshop
QUICK = [1, 2, 3, 4, 6, 7, 8, 9, 10]  # 100-1,000 nodes each; ta005 takes ~20,000 (20-40 s)


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def _heads_tails(p, prefix, suffix):
    """Completion times of ``prefix`` per machine, and the times ``suffix`` needs from its
    start on each machine to its end (the reversed shop): written here, not imported."""
    m = len(p)
    c = [0] * m
    for j in prefix:
        prev = 0
        for k in range(m):
            prev = c[k] = max(c[k], prev) + p[k][j]
    t = [0] * m
    for j in reversed(suffix):
        prev = 0
        for k in reversed(range(m)):
            prev = t[k] = max(t[k], prev) + p[k][j]
    return tuple(c), tuple(t)


def test_bidirectional_bound_is_a_lower_bound():
    """For random prefix/suffix pairs of 7-job instances: the bound never exceeds the best
    makespan of any completion (all orders of the jobs in between, brute force)."""
    rng = random.Random(15)
    for trial in range(80):
        p = tuple(row[:7] for row in fs.taillard(fs.TA20x5_SEEDS[trial % 10], 20, 5))
        bp = fs.bi_problem(p, 1 << 40)
        jobs = list(range(7))
        rng.shuffle(jobs)
        a, b = rng.randint(0, 4), rng.randint(0, 3)
        prefix, suffix, mid = tuple(jobs[:a]), tuple(jobs[a:a + b]), jobs[a + b:]
        front, back = _heads_tails(p, prefix, suffix)
        lb = fs.bi_bound(bp, front, back, sum(1 << j for j in mid), 1 << 62)
        best = min(fs.makespan(p, prefix + m + suffix) for m in itertools.permutations(mid))
        assert lb <= best, (trial, prefix, suffix)
        if not mid:
            assert lb == best


def test_bidirectional_children_keep_true_heads_and_tails():
    """Random walks down the tree: every child's heads and tails are those of its prefix
    and suffix, its jobs partition the instance, and a leaf's bound is its makespan."""
    rng = random.Random(5)
    for trial in range(20):
        p = tuple(row[:8] for row in fs.taillard(fs.TA20x5_SEEDS[trial % 10], 20, 5))
        bp = fs.bi_problem(p, fs.neh(p)[0] + 1)
        node = fs.bi_root(bp)
        while node.left:
            kids = fs.bi_children(bp, node)
            assert [c.lb for c in kids] == sorted(c.lb for c in kids)
            node = rng.choice(kids)
            assert (node.front, node.back) == _heads_tails(p, node.prefix, node.suffix)
            left = [j for j in range(8) if node.left >> j & 1]
            assert sorted(node.prefix + node.suffix + tuple(left)) == list(range(8))
        assert node.lb == fs.makespan(p, node.seq) == fs.bi_objective(node)


@pytest.mark.parametrize("instance", [1, 4, 7])
def test_bidirectional_small_vs_brute_force(pilot2, instance):
    p = tuple(row[:7] for row in fs.taillard(fs.TA20x5_SEEDS[instance - 1], 20, 5))
    r = fs.solve_bidirectional(pilot2, p)
    assert r.value == fs.brute_force(p) == fs.makespan(p, r.node.seq)
    assert sorted(r.node.seq) == list(range(7))


@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_bidirectional_every_coordination(pilot2, coordination):
    p = tuple(row[:8] for row in fs.taillard(fs.TA20x5_SEEDS[2], 20, 5))
    bp = fs.bi_problem(p, 1 << 40)  # no upper bound known: branching by bound sums only
    r = branch_and_bound.minimise(pilot2, fs.bi_root(bp), functools.partial(fs.bi_children, bp),
                                  fs.bi_objective, fs.bi_bound_of, coordination=coordination)
    assert r.value == fs.brute_force(p) == fs.makespan(p, r.node.seq)


@pytest.mark.parametrize("instance", QUICK)
def test_taillard_20x5_proved_optimal(pilot2, instance):
    """From NEH's makespan, not from the published optimum: the search finds the optimum
    and closes the tree."""
    p = fs.taillard(fs.TA20x5_SEEDS[instance - 1], 20, 5)
    r = fs.solve_bidirectional(pilot2, p)
    assert r.value == fs.TA20x5_OPTIMA[instance - 1] == fs.makespan(p, r.node.seq)
    assert sorted(r.node.seq) == list(range(20))


@pytest.mark.slow
def test_taillard_ta005_proved_optimal(pilot2):
    p = fs.taillard(fs.TA20x5_SEEDS[4], 20, 5)
    r = fs.solve_bidirectional(pilot2, p)
    assert r.value == fs.TA20x5_OPTIMA[4] == 1235 == fs.makespan(p, r.node.seq)


@pytest.mark.parametrize("seed", range(8))
def test_random_shops_full_of_ties_vs_brute_force(pilot2, seed):
    """Random shops (1-5 machines, 2-7 jobs, times 1..3: ties everywhere, where a bound order
    that prune_level relies on is easiest to get wrong), both branchings, from NEH and as a
    proof that nothing beats the optimum minus one."""
    rng = random.Random(seed)
    n, m = rng.randint(2, 7), rng.randint(1, 5)
    p = tuple(tuple(rng.randint(1, 3) for _ in range(n)) for _ in range(m))
    want = fs.brute_force(p)
    for solve in (fs.solve, fs.solve_bidirectional):
        r = solve(pilot2, p)
        assert r.value == want == fs.makespan(p, r.node.seq) and sorted(r.node.seq) == list(range(n))
        if want > 1:
            assert solve(pilot2, p, upper=want - 1).node is None
