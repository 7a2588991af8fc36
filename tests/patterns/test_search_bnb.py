"""branch_and_bound against DIMACS clique numbers and brute-forced flowshop optima."""

from __future__ import annotations

import functools

import pytest
import search_apps as apps

import shoal
from shoal.patterns import SearchError, branch_and_bound

mc = apps.search_maxclique
fs = apps.search_flowshop

FAST = {"MANN_a9": 16, "hamming6-4": 4, "c-fat200-1": 12, "johnson16-2-4": 8}
MEDIUM = {"brock200_2": 12, "keller4": 11, "p_hat300-1": 8}  # ~0.1-0.5 s each on 2 workers
SLOW = {"C125.9": 34, "hamming8-4": 16}


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


@pytest.fixture(scope="module")
def pilot1():
    with shoal.Pilot(workers=1) as p:
        yield p


@pytest.mark.no_leak_check
@pytest.mark.parametrize("name", [n for n in FAST if n != "johnson16-2-4"])
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
@pytest.mark.parametrize("workers", [1, 2])
def test_max_clique_small(pilot1, pilot2, name, coordination, workers):
    g = apps.dimacs(name)
    r = mc.max_clique(pilot1 if workers == 1 else pilot2, g, coordination=coordination,
                      stats=True)
    assert r.value == FAST[name] == r.node.size
    assert mc.is_clique(g, r.node)  # the witness is checked too, not only its size
    assert r.stats.nodes > 0 and r.stats.final_incumbent_s is not None


@pytest.mark.no_leak_check
def test_max_clique_johnson(pilot2):
    g = apps.dimacs("johnson16-2-4")
    r = mc.max_clique(pilot2, g, stats=True)
    assert r.value == 8 and mc.is_clique(g, r.node)
    assert r.stats.per_depth[0] == 1 and sum(r.stats.per_depth) == r.stats.nodes


@pytest.mark.no_leak_check
@pytest.mark.parametrize("name", list(MEDIUM))
def test_max_clique_medium(pilot2, name):
    g = apps.dimacs(name)
    r = mc.max_clique(pilot2, g)
    assert r.value == MEDIUM[name] and mc.is_clique(g, r.node)


@pytest.mark.slow
@pytest.mark.no_leak_check
@pytest.mark.parametrize("name", list(SLOW))
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_max_clique_hard(pilot2, name, coordination):
    g = apps.dimacs(name)
    r = mc.max_clique(pilot2, g, coordination=coordination)
    assert r.value == SLOW[name] and mc.is_clique(g, r.node)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("workers", [1, 2])
def test_ordered_is_replicable(pilot1, pilot2, workers):
    """ordered=True returns the sequential search's node (first optimum in DFS order)."""
    g = apps.dimacs("MANN_a9")
    seq = mc.max_clique(pilot1, g, coordination="sequential", ordered=True)
    for coordination in apps.COORDINATIONS:
        r = mc.max_clique(pilot1 if workers == 1 else pilot2, g, coordination=coordination,
                          ordered=True)
        assert (r.value, r.path, r.node) == (seq.value, seq.path, seq.node)


@pytest.mark.no_leak_check
def test_prune_level_off_same_value(pilot2):
    g = apps.dimacs("hamming6-4")
    a = mc.max_clique(pilot2, g, prune_level=False, stats=True)
    b = mc.max_clique(pilot2, g, prune_level=True, stats=True)
    assert a.value == b.value == 4 and a.stats.nodes >= b.stats.nodes


@pytest.mark.no_leak_check
def test_work_inflation(pilot1, pilot2):
    g = apps.dimacs("MANN_a9")
    ref = mc.max_clique(pilot1, g, coordination="sequential")
    r = mc.max_clique(pilot2, g, reference_nodes=ref.stats.nodes)
    assert r.stats.work_inflation == pytest.approx(r.stats.nodes / ref.stats.nodes)


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_flowshop_small_vs_brute_force(pilot2, coordination):
    p = tuple(row[:7] for row in fs.taillard(fs.TA20x5_SEEDS[0], 20, 5))
    best = fs.brute_force(p)
    pr = fs.problem(p)
    r = branch_and_bound.minimise(pilot2, fs.root(pr), functools.partial(fs.children, pr),
                                  fs.objective, fs.bound, coordination=coordination)
    assert r.value == best == fs.makespan(p, r.node.seq)


def test_taillard_generator():
    p = fs.taillard(fs.TA20x5_SEEDS[0], 20, 5)
    assert p[0][:5] == (54, 83, 15, 71, 77)  # published first row of ta001


@pytest.mark.no_leak_check
def test_flowshop_neh_initial(pilot2):
    p = tuple(row[:8] for row in fs.taillard(fs.TA20x5_SEEDS[0], 20, 5))
    r = fs.solve(pilot2, p)
    assert r.value == fs.brute_force(p) == 704


@pytest.mark.slow
@pytest.mark.no_leak_check
def test_flowshop_10_jobs(pilot2):
    p = tuple(row[:10] for row in fs.taillard(fs.TA20x5_SEEDS[0], 20, 5))
    assert fs.solve(pilot2, p).value == 769  # this B&B's answer; brute force: 10! orders


# -- contract details and bad input ----------------------------------------------------------


@pytest.mark.no_leak_check
def test_initial_not_beaten(pilot2):
    r = branch_and_bound.maximise(pilot2, (), apps.tree3, apps.depth_objective, apps.depth_bound,
                                  initial=4)
    assert (r.value, r.node, r.path) == (4, None, None)
    r = branch_and_bound.maximise(pilot2, (), apps.tree3, apps.depth_objective, apps.depth_bound,
                                  initial=3)
    assert r.value == 4 and len(r.node) == 4


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_non_numeric_bound(pilot2, coordination):
    with pytest.raises(TypeError, match=r"bound\(\) returned 'ten' \(str\) at node path"):
        branch_and_bound.maximise(pilot2, (), apps.tree3, apps.depth_objective, apps.str_bound,
                                  coordination=coordination)


@pytest.mark.no_leak_check
def test_non_numeric_objective_and_initial(pilot2):
    with pytest.raises(TypeError, match=r"objective\(\) returned None"):
        branch_and_bound.minimise(pilot2, (), apps.tree3, apps.no_objective, apps.depth_bound)
    with pytest.raises(TypeError, match="initial must be a real number"):
        branch_and_bound.maximise(pilot2, (), apps.tree3, apps.depth_objective, apps.depth_bound,
                                  initial="3")


@pytest.mark.no_leak_check
@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_bnb_children_errors(pilot2, coordination):
    with pytest.raises(SearchError, match=r"children\(\) raised RuntimeError\('boom'\) at node path \(\d, \d\)"):
        branch_and_bound.maximise(pilot2, (), apps.boom_at_depth2, apps.depth_objective,
                                  apps.loose_bound, coordination=coordination)
    with pytest.raises(SearchError, match=r"non-iterable int at node path \(1, 2\)"):
        branch_and_bound.maximise(pilot2, (), apps.not_iterable_at_12, apps.depth_objective,
                                  apps.loose_bound, coordination=coordination)


def test_malformed_dimacs(tmp_path):
    bad = tmp_path / "bad.clq"
    bad.write_text("c hello\np edge 3 2\ne 1 2\ne 2 x\n")
    with pytest.raises(ValueError, match=r"bad.clq:4: malformed DIMACS line 'e 2 x'"):
        mc.read_dimacs(bad)
    bad.write_text("p edge 3 1\ne 1 4\n")
    with pytest.raises(ValueError, match=r":2: .*out of range"):
        mc.read_dimacs(bad)
