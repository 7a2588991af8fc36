"""The engine's hot loops in-process (no pilot): splits ship true paths and lose no node."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import model as M
from shoal.patterns.search import polling as P
from shoal.patterns.search import shapes as S

pytestmark = pytest.mark.usefixtures("both_count_loops")  # (tests/conftest.py)


def tree(node):  # an irregular tree: node = its path
    return [node + (i,) for i in range((2 + len(node) + sum(node)) % 4 + 1)] if len(node) < 8 else []


def gtree(node):  # the same tree from a generator: counting takes the recursive loop
    yield from tree(node)


def full_count(node) -> int:
    return 1 + sum(full_count(c) for c in tree(node))


class _Cell:  # an incumbent that never improves: every node is explored
    value = -np.inf

    def offer(self, v):
        pass


def record(monkeypatch, shipped: list) -> None:
    """Ship nothing: record each split-off task's units ``[(path, node), ...]``, a
    single subtree's or a bundle's (``Explorer.run_units`` explores them)."""
    monkeypatch.setattr(E.Explorer, "ship", lambda self, node, path: shipped.append([(path, node)]))
    monkeypatch.setattr(E.Explorer, "ship_bundle", lambda self, units: shipped.append(list(units)))


def _optimise_kw(goal) -> dict:
    if goal is not M.Goal.OPTIMISE:
        return {}
    return dict(objective=lambda n: -1, bound=lambda n: 0, cell=_Cell(), prune_level=False)


@pytest.mark.parametrize("children", [tree, gtree], ids=["lists", "generator"])
@pytest.mark.parametrize("rec_depth", [None, 2], ids=["recursive", "deep-fallback"])
@pytest.mark.parametrize("goal", [M.Goal.COUNT, M.Goal.OPTIMISE])
def test_every_poll_splits_true_paths_and_exact_counts(monkeypatch, goal, rec_depth, children):
    """Splits read from the recursive loops' frames (and, below ``rec_depth`` levels, from
    the iterative loop they hand deep subtrees to) ship true paths and lose no node."""
    monkeypatch.setattr(P, "POLL_S", 0.0)  # poll at every tick
    monkeypatch.setattr(P, "TICK", 1)
    if rec_depth is not None:
        monkeypatch.setattr(S, "COUNT_REC_DEPTH", rec_depth)
        monkeypatch.setattr(S, "BNB_REC_DEPTH", rec_depth)
    shipped = []
    record(monkeypatch, shipped)
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)  # row 1 hungry: every poll splits
    spec = M.SearchSpec(root=(), children=children, goal=goal, control=None,
                        **_optimise_kw(goal))
    total = tasks = bundles = 0
    todo = [[((), ())]]
    while todo:
        units = todo.pop()
        for path, node in units:
            assert node == path  # a node is its own path in this tree
            assert M.replay(spec, path) == node
        ex = E.Explorer(spec, units[0][0], ctl, 0, split=True)
        ex.run_units(units)
        total += ex.tally.nodes
        tasks += 1
        bundles += len(units) > 1
        todo.extend(shipped)
        shipped.clear()
    assert total == full_count(())
    assert tasks > 20  # the splits happened
    if goal is M.Goal.COUNT and children is tree:  # lists: a split ships bundles of subtrees
        assert bundles > 5


def test_count_per_depth_in_process():
    spec = M.SearchSpec(root=(), children=tree, goal=M.Goal.COUNT, control=None, per_depth=True,
                  coordination=M.Coordination.SEQUENTIAL)
    ex = E.Explorer(spec, (), np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64), 0, split=False)
    ex.dfs(())
    want: dict = {}
    stack = [()]
    while stack:
        n = stack.pop()
        want[len(n)] = want.get(len(n), 0) + 1
        stack.extend(tree(n))
    assert ex.tally.per_depth == [want[d] for d in range(len(want))]
    assert ex.tally.count == ex.tally.nodes == full_count(()) == sum(want.values())




@pytest.mark.parametrize("goal", [M.Goal.COUNT, M.Goal.OPTIMISE])
@pytest.mark.parametrize("budget", [1, 3])
def test_budget_splits_at_every_backtrack_keep_true_paths(monkeypatch, goal, budget):
    """BUDGET splits the shallowest open level after ``budget`` backtracks, also at a leaf
    (which the count loop does not push): every shipped subtree is named by its true path
    and the counts add up."""
    shipped = []
    monkeypatch.setattr(E.Explorer, "ship", lambda self, node, path: shipped.append((node, path)))
    spec = M.SearchSpec(root=(), children=tree, goal=goal, control=None,
                  coordination=M.Coordination.BUDGET, budget=budget, **_optimise_kw(goal))
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)
    total, todo = 0, [((), ())]
    while todo:
        node, path = todo.pop()
        assert node == path  # a node is its own path in this tree
        ex = E.Explorer(spec, path, ctl, 0, split=True)
        ex.dfs(node)
        total += ex.tally.nodes
        todo.extend(shipped)
        shipped.clear()
    assert total == full_count(())


@pytest.mark.parametrize("goal", [M.Goal.COUNT, M.Goal.OPTIMISE])
def test_errors_below_the_recursion_name_the_node(monkeypatch, goal):
    """A user function failing in the iterative loop under the recursive one names its
    true path (read from the recursion's frames) and node."""
    monkeypatch.setattr(S, "COUNT_REC_DEPTH", 2)
    monkeypatch.setattr(S, "BNB_REC_DEPTH", 2)
    bad = (0, 1, 0, 1)

    def children(node):
        if node == bad:
            raise ValueError("boom")
        yield from tree(node)

    spec = M.SearchSpec(root=(), children=children, goal=goal, control=None,
                        **_optimise_kw(goal))
    ex = E.Explorer(spec, (), np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64), 0, split=False)
    with pytest.raises(M.SearchError, match=r"children\(\) raised ValueError\('boom'\) at "
                                            r"node path \(0, 1, 0, 1\) \(node \(0, 1, 0, 1\)\)"):
        ex.dfs(())


class Opaque:
    """A node that compares by identity (no __eq__): a path can only be found by position."""

    __slots__ = ("path",)

    def __init__(self, path):
        self.path = path


def otree(node):  # gtree over Opaque nodes: a new object per listing
    for p in tree(node.path):
        yield Opaque(p)


def _run_tasks(spec, ctl, shipped) -> tuple[int, int, int]:
    """Every task of ``spec`` in this process (the shipped ones too): (nodes, tasks,
    pending units explored)."""
    total = tasks = pending = 0
    todo = [[((), spec.root)]]
    while todo:
        given = todo.pop()
        for path, node in given:
            assert node.path == path
        ex = E.Explorer(spec, given[0][0], ctl, 0, split=True)
        orig, units = ex._count_gen_unit, []
        ex._count_gen_unit = lambda nd, run, _o=orig, _u=units: (_u.append(nd), _o(nd, run))[1]
        ex.run_units(given)
        pending += len(units) - len(given)
        total += ex.tally.nodes
        assert ex.tally.count == ex.tally.nodes
        tasks += 1
        todo.extend(shipped)
        shipped.clear()
    return total, tasks, pending


@pytest.mark.parametrize("rec_depth", [None, 2], ids=["recursive", "deep-fallback"])
def test_lazy_count_loop_names_nodes_it_cannot_compare(monkeypatch, rec_depth):
    """The count loop over generator children keeps no child index: a split drains the
    level and recounts its parent's children to name what it ships, keeping the rest as
    pending units of the task.  With nodes that compare by identity only and a split at
    every 7th poll (two wanted), every shipped node's path is its true one and the count
    is exact; an error deep inside the tree names the true path."""
    monkeypatch.setattr(P, "POLL_S", 0.0)
    monkeypatch.setattr(P, "TICK", 1)
    if rec_depth is not None:
        monkeypatch.setattr(S, "COUNT_REC_DEPTH", rec_depth)
    split_at, polls = E.Explorer.split_at, itertools.count()

    def sometimes(self, *args, **kw):
        if next(polls) % 7 == 3:
            split_at(self, *args, **kw)

    monkeypatch.setattr(E.Explorer, "split_at", sometimes)
    shipped = []
    record(monkeypatch, shipped)
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)  # row 1 hungry: 2 wanted
    spec = M.SearchSpec(root=Opaque(()), children=otree, goal=M.Goal.COUNT, control=None)
    total, tasks, pending = _run_tasks(spec, ctl, shipped)
    assert total == full_count(())
    assert tasks > 20 and pending > 20  # splits shipped subtrees and kept pending units

    def broken(node):
        if node.path == (2, 1, 2):
            raise ValueError("bad node")
        return otree(node)

    spec = M.SearchSpec(root=Opaque(()), children=broken, goal=M.Goal.COUNT, control=None)
    with pytest.raises(M.SearchError, match=r"children\(\) raised ValueError\('bad node'\) at "
                                            r"node path \(2, 1, 2\)"):
        _run_tasks(spec, ctl, shipped)
