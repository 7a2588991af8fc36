"""The engine's hot loops in-process (no pilot): splits ship true paths and lose no node."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import loops as L
from shoal.patterns.search import model as M


def tree(node):  # an irregular tree: node = its path
    return [node + (i,) for i in range((2 + len(node) + sum(node)) % 4 + 1)] if len(node) < 8 else []


def full_count(node) -> int:
    return 1 + sum(full_count(c) for c in tree(node))


class _Cell:  # an incumbent that never improves: every node is explored
    value = -np.inf

    def offer(self, v):
        pass


def _optimise_kw(goal) -> dict:
    if goal is not M.Goal.OPTIMISE:
        return {}
    return dict(objective=lambda n: -1, bound=lambda n: 0, cell=_Cell(), prune_level=False)


@pytest.mark.parametrize("goal", [M.Goal.COUNT, M.Goal.OPTIMISE])
def test_every_poll_splits_true_paths_and_exact_counts(monkeypatch, goal):
    monkeypatch.setattr(E, "POLL_S", 0.0)  # poll at every tick
    monkeypatch.setattr(L, "TICK", 1)
    shipped = []
    monkeypatch.setattr(E.Explorer, "ship", lambda self, node, path: shipped.append((node, path)))
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)  # row 1 hungry: every poll splits
    spec = M.SearchSpec(root=(), children=tree, goal=goal, control=None, **_optimise_kw(goal))
    total = tasks = 0
    todo = [((), ())]
    while todo:
        node, path = todo.pop()
        assert node == path  # a node is its own path in this tree
        assert M.replay(spec, path) == node
        ex = E.Explorer(spec, path, ctl, 0, split=True)
        ex.dfs(node)
        total += ex.tally.nodes
        tasks += 1
        todo.extend(shipped)
        shipped.clear()
    assert total == full_count(())
    assert tasks > 20  # the splits happened


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
