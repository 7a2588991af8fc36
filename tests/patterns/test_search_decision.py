"""find() as YewPar's Decision skeleton (objective/target/bound), progress lines, and
errors that name the node as well as its path."""

from __future__ import annotations

import functools
import io

import pytest
import search_apps as apps

import shoal
from shoal.patterns import SearchError, backtracking, branch_and_bound


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def _graph():
    adj = apps.random_graph(36, 0.5, 1)
    return adj, functools.partial(apps.clique_children_unordered, adj)


@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_decision_finds_a_node_reaching_the_target(pilot2, coordination):
    adj, kids = _graph()
    omega = apps.brute_force_clique(adj)
    f = backtracking.find(pilot2, apps.clique_root(adj), kids, objective=apps.clique_size,
                          target=omega, bound=apps.clique_bound, coordination=coordination,
                          stats=True)
    assert f.node[0] == omega and f.node[1].bit_count() == omega
    assert backtracking.find(pilot2, apps.clique_root(adj), kids, objective=apps.clique_size,
                             target=omega + 1, bound=apps.clique_bound,
                             coordination=coordination) is None


def test_decision_bound_prunes(pilot2):
    adj, kids = _graph()
    omega = apps.brute_force_clique(adj)
    plain = backtracking.find(pilot2, apps.clique_root(adj), kids, objective=apps.clique_size,
                              target=omega + 1, coordination="sequential", stats=True)
    bounded = backtracking.find(pilot2, apps.clique_root(adj), kids, objective=apps.clique_size,
                                target=omega + 1, bound=apps.clique_bound,
                                coordination="sequential", stats=True)
    assert plain.node is None and bounded.node is None
    assert bounded.stats.pruned > 0 and bounded.stats.nodes * 2 < plain.stats.nodes
    # a goal with a bound: the bound prunes against the target, the goal decides
    hit = backtracking.find(pilot2, apps.clique_root(adj), kids,
                            lambda nd: nd[0] == omega and nd[1] & 1 == 0,
                            target=omega, bound=apps.clique_bound)
    assert hit is None or (hit[0] == omega and hit[1] & 1 == 0)


def test_decision_errors(pilot2):
    adj, kids = _graph()
    root = apps.clique_root(adj)
    with pytest.raises(TypeError, match="goal must be a function"):
        backtracking.find(pilot2, root, kids)
    with pytest.raises(TypeError, match="not both"):
        backtracking.find(pilot2, root, kids, apps.is_leaf, objective=apps.clique_size, target=3)
    with pytest.raises(TypeError, match="target="):
        backtracking.find(pilot2, root, kids, objective=apps.clique_size)
    with pytest.raises(TypeError, match="target="):
        backtracking.find(pilot2, root, kids, apps.is_leaf, bound=apps.clique_bound)
    with pytest.raises(TypeError, match="target returned 'x'"):
        backtracking.find(pilot2, root, kids, objective=apps.clique_size, target="x")
    with pytest.raises(TypeError, match=r"bound\(\) returned 'ten'.*node path \(\) "
                                          r"\(node \(\)\)"):
        backtracking.find(pilot2, (), apps.tree3, objective=apps.depth_objective, target=9,
                          bound=apps.str_bound)


def test_progress_lines(pilot2):
    out = io.StringIO()
    n = backtracking.count(pilot2, apps.search_nqueens.ROOT,
                           functools.partial(apps.queens_children, 9),
                           progress=out)
    lines = out.getvalue().splitlines()
    assert lines and lines[-1].endswith("(done)")
    final_nodes = int(lines[-1].split(" nodes")[0].split()[-1].replace(",", ""))
    assert final_nodes == n  # every node reported: the final line is exact
    adj, kids = _graph()
    out = io.StringIO()
    r = branch_and_bound.maximise(pilot2, apps.clique_root(adj), kids, apps.clique_size,
                                  apps.clique_bound, progress=out)
    assert f"incumbent {r.value}" in out.getvalue().splitlines()[-1]


def test_progress_off_when_not_a_tty(pilot2, capsys):
    backtracking.count(pilot2, (), apps.tree3, progress=True)
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="progress must be"):
        backtracking.count(pilot2, (), apps.tree3, progress="sometimes")


@pytest.mark.parametrize("coordination", apps.COORDINATIONS)
def test_errors_name_the_node(pilot2, coordination):
    with pytest.raises(SearchError, match=r"children\(\) raised RuntimeError\('boom'\) at node "
                                          r"path \(\d, \d\) \(node \(\d, \d\)\)"):
        backtracking.count(pilot2, (), apps.boom_at_depth2, coordination=coordination)
    # raised inside a generator while listing: the node is re-derived from its path
    with pytest.raises(SearchError, match=r"gen boom.*node path \(1, 2\) \(node \(1, 2\)\)"):
        backtracking.count(pilot2, (), apps.gen_boom_at_12, coordination=coordination)
    with pytest.raises(SearchError, match=r"non-iterable int at node path \(1, 2\) "
                                          r"\(node \(1, 2\)\)"):
        backtracking.count(pilot2, (), apps.not_iterable_at_12, coordination=coordination)
