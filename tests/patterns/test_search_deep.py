"""Trees deeper than the recursive loops go: the hand-over to the iterative loops.

The recursive loops (shapes.py) check their depth only when their poll countdown
runs out, and hand a level found past ``cap`` (``REC_DEPTH``: 128 for branch and
bound, 64 for counting) to the iterative loop, with its path read from the
frames.  Here trees of 600 levels, at the default depths and poll rates, with a
split at every poll: every node is visited once, every shipped subtree is named
by its true path (``replay``), and the optimum and its path are the true ones;
then the same trees on a real pilot.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import shoal
from shoal.patterns import backtracking, branch_and_bound
from shoal.patterns.search import bnb as B
from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import loops as L
from shoal.patterns.search import model as M
from shoal.patterns.search import polling as P
from shoal.patterns.search import shapes as S

DEPTH = 600
FORKS = frozenset(range(40, DEPTH, 70))  # depths with two children: 2^8 spines of ~600 nodes


pytestmark = pytest.mark.usefixtures("both_count_loops")  # (tests/conftest.py)


def kids(node):
    """node = (depth, spine): one child, or two at a depth in FORKS; none at DEPTH."""
    d, s = node
    if d == DEPTH:
        return []
    if d in FORKS:
        return [(d + 1, 2 * s), (d + 1, 2 * s + 1)]
    return [(d + 1, s)]


def gkids(node):
    yield from kids(node)


def total() -> int:
    n, width = 0, 1
    for d in range(DEPTH + 1):
        n += width
        if d in FORKS:
            width *= 2
    return n


def value(node) -> int:  # the best leaf: spine 0b10110101 (a unique optimum, BEST)
    d, s = node
    return d * 1000 - abs(s - 0b10110101) if d == DEPTH else 0


def bound(node) -> int:  # above every value: nothing is pruned, every node is visited
    return DEPTH * 1000 + 1


BEST = (DEPTH, 0b10110101)
BEST_PATH = tuple((BEST[1] >> (len(FORKS) - 1 - sorted(FORKS).index(d))) & 1 if d in FORKS else 0
                  for d in range(DEPTH))


class _Cell:
    value = -np.inf

    def offer(self, v):
        self.value = max(self.value, v)


@pytest.mark.parametrize("goal", [M.Goal.COUNT, M.Goal.OPTIMISE])
def test_deep_trees_split_at_every_poll_in_process(monkeypatch, goal):
    monkeypatch.setattr(P, "POLL_S", 0.0)  # a poll at every countdown (TICK nodes) ...
    split_at, polls = E.Explorer.split_at, itertools.count()

    def rarely(self, *args, **kw):  # ... and a split at every 20th: tasks run past the recursion
        if next(polls) % 20 == 3:
            split_at(self, *args, **kw)

    monkeypatch.setattr(E.Explorer, "split_at", rarely)
    deep = {"count": 0, "bnb": 0}  # hand-overs to the iterative loops
    for name, cls, meth in (("count", L.CountLoops, "_deep_level"),
                            ("bnb", B.BnBLoop, "_deep_bnb_level")):
        def handed(self, it, _name=name, _orig=getattr(cls, meth)):
            deep[_name] += 1
            return _orig(self, it)
        monkeypatch.setattr(cls, meth, handed)
    shipped = []  # each split-off task's units [(path, node), ...] (a bundle: several)
    monkeypatch.setattr(E.Explorer, "ship", lambda self, node, path: shipped.append([(path, node)]))
    monkeypatch.setattr(E.Explorer, "ship_bundle", lambda self, units: shipped.append(list(units)))
    kw = {} if goal is M.Goal.COUNT else dict(objective=value, bound=bound, cell=_Cell())
    spec = M.SearchSpec(root=(0, 0), children=gkids if goal is M.Goal.COUNT else kids,
                        goal=goal, control=None, **kw)
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)  # row 1 hungry: every poll splits
    nodes = tasks = 0
    best = (-np.inf, None, None)
    todo = [[((), (0, 0))]]
    while todo:
        units = todo.pop()
        for path, node in units:
            assert M.replay(spec, path) == node  # the path is the node's true path
        ex = E.Explorer(spec, units[0][0], ctl, 0, split=True)
        ex.run_units(units)
        nodes += ex.tally.nodes
        if ex.tally.best_path is not None and ex.tally.best > best[0]:
            best = (ex.tally.best, ex.tally.best_path, ex.tally.best_node)
        tasks += 1
        todo.extend(shipped)
        shipped.clear()
    assert nodes == total()
    assert tasks > 50  # the splits happened, also below the recursion
    assert deep["count" if goal is M.Goal.COUNT else "bnb"] > 10
    if goal is M.Goal.OPTIMISE:
        assert best == (value(BEST), BEST_PATH, BEST)
        assert M.replay(spec, BEST_PATH) == BEST


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def test_deep_trees_on_a_pilot(pilot2):
    r = backtracking.count(pilot2, (0, 0), gkids, stats=True)
    assert int(r) == r.stats.nodes == total()
    r = branch_and_bound.maximise(pilot2, (0, 0), kids, value, bound, stats=True)
    assert (r.value, r.path, r.node) == (value(BEST), BEST_PATH, BEST)
    assert r.stats.nodes == total()  # nothing pruned: the bound never cuts


def _count_stack_builds(monkeypatch) -> tuple[list, list]:
    """A poll at every countdown, the iterative loops from depth 2 on, and two lists that
    grow by one per poll and per build of the loop's (iters, idx) stack."""
    monkeypatch.setattr(P, "POLL_S", 0.0)
    monkeypatch.setattr(S, "COUNT_REC_DEPTH", 2)  # hand the chain to the iterative loop at once
    polls, built = [], []
    real = E.Explorer.poll

    def poll(self, frontier):
        polls.append(1)

        def counted():
            built.append(1)
            return frontier()

        return real(self, None if frontier is None else counted)

    monkeypatch.setattr(E.Explorer, "poll", poll)
    return polls, built


@pytest.mark.parametrize("goal", [M.Goal.COUNT, M.Goal.OPTIMISE])
def test_a_poll_without_a_split_does_not_copy_the_stack(monkeypatch, goal):
    """Every poll of the iterative loops copied the whole stack (O(depth)),
    which made a 100,000-level chain quadratic (7 s instead of 0.2 s) with no thief at
    all.  The stack is built only when the poll splits: here polls come every TICK nodes
    and no worker is hungry, so it is never built."""
    polls, built = _count_stack_builds(monkeypatch)
    kw = {} if goal is M.Goal.COUNT else dict(objective=value, bound=bound, cell=_Cell())
    spec = M.SearchSpec(root=(0, 0), children=kids, goal=goal, control=None, **kw)
    ex = E.Explorer(spec, (), np.zeros((1, C.CONTROL_COLUMNS), dtype=np.int64), 0, split=True)
    ex.dfs((0, 0))  # Control has one row, this task's: nobody is hungry, no poll splits
    assert ex.tally.nodes == total()
    assert len(polls) > 100 and built == []


def _chain(n):
    return [n + 1] if n < 5000 else []


def test_a_hungry_worker_does_not_rescan_a_deep_barren_stack_at_every_poll(monkeypatch):
    """F2 with a thief: on a chain every split finds nothing, and each scanned the whole
    stack, O(depth), at every poll (a 200,000-level chain on 2 workers took 40 s instead
    of 0.3 s).  After a split that shipped nothing, a deep stack waits depth // 256 polls."""
    polls, built = _count_stack_builds(monkeypatch)
    spec = M.SearchSpec(root=0, children=_chain, goal=M.Goal.COUNT, control=None)
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)  # row 1 idle: hungry at every poll
    ex = E.Explorer(spec, (), ctl, 0, split=True)
    ex.dfs(0)
    assert ex.tally.nodes == 5001 and ex.tally.splits == 0
    assert len(polls) > 200 and len(built) < len(polls) // 4
