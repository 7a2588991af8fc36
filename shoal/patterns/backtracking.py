"""Parallel backtracking: enumerate (``count``, ``solutions``) and decide (``find``).

A search is plain Python: a ``root`` node and ``children(node)``, a lazy node
generator (a function returning an iterable; a generator function is best, it
yields children in heuristic order and is only advanced as far as needed).
Nodes are named by their child-index path from the root, ``()`` for the root.

Data flow (``count``/``find``): the driver submits one task for the root; the
task searches depth-first with an explicit stack of child iterators and, as
the ``coordination`` says, spawns unexplored siblings as new tasks, which idle
workers steal (``shoal.patterns.search`` has the details and the invariants).
Tallies merge up the join tree.  ``find`` sets a shared stop flag on the first
hit; every task reads it every ~0.2 ms and unwinds (``stats.stop_latency_s``:
hit to answer in the driver).

``solutions`` streams: its driver keeps a frontier of unexplored subtrees and
at most ``window`` tasks in flight; each task explores its subtrees for at most
``chunk_nodes`` nodes or ``chunk_solutions`` hits and returns them with what it
left unexplored.  Memory is bounded by the window, the chunk sizes and the
frontier (kept depth-first, so about depth x branching per task), and the
search only runs ahead of the consumer by one window.  Rejected: spawned tasks
returning everything at the end (memory grows with the answer); a queue from
workers to the driver (not in the public API).

Invariant: results do not depend on the worker count or the coordination:
``count`` is exact (each node is visited by exactly one task); ``find``
returns *some* goal node (which one may vary with timing, unless there is one).
"""

from __future__ import annotations

import concurrent.futures as cf
import numbers
from dataclasses import dataclass

from ._portable import portable
from .search.checkpoint import freeze, next_units, thaw
from .search.checkpoint import make as make_checkpoint
from .search.control import StopFlag, make_control, slot, stop_all, stopped
from .search.driver import check_count, drive, validate
from .search.engine import Explorer
from .search.model import (
    Coordination,
    Goal,
    SearchError,
    SearchSpec,
    SearchStats,
    check_picklable,
    listing,
    number,
)

__all__ = ["Coordination", "Count", "Found", "SearchError", "SearchStats", "count", "find",
           "solutions"]


class Count(int):
    """The result of ``count``: an int, with ``.stats`` (a SearchStats)."""

    stats: SearchStats

    def __new__(cls, value: int, stats: SearchStats):
        self = super().__new__(cls, value)
        self.stats = stats
        return self

    def __reduce__(self):
        return (Count, (int(self), self.stats))


@dataclass(frozen=True)
class Found:
    """``find(..., stats=True)``: the goal node (or None), its path, and what the search did."""

    node: object
    path: tuple | None
    stats: SearchStats


def count(pilot, root, children, *, accept=None, coordination=Coordination.STACK_STEALING,
          spawn_depth: int = 2, budget: int = 10_000, stats: bool = False,
          progress=False, checkpoint=None, checkpoint_interval: float = 60.0,
          kernel=None, kernel_depth: int | None = None) -> Count:
    """The number of nodes of the tree under ``root`` (root included), or of those for
    which ``accept(node)`` is true.

    ``coordination``: a ``Coordination`` or its value ("sequential",
    "depth-bounded" with ``spawn_depth``, "budget" with ``budget`` backtracks
    per split, "stack-stealing", "indexed").  ``stats=True`` adds per-depth
    counts and the steals of the search to ``result.stats``.  ``progress=True``
    writes a line a second (nodes, nodes/s) to stderr when it is a terminal;
    ``"always"`` or a file-like object force it.

    ``checkpoint="path"``: the search's open frontier, counts so far (and
    incumbent) are written to that file atomically every
    ``checkpoint_interval`` seconds and when the driver is interrupted; the
    same call with the same path after a crash (even a SIGKILL of the driver)
    goes on from there and returns exactly what an uninterrupted run returns.
    The file is deleted when the search ends.  A checkpointed search runs as
    driver-side chunks (``coordination`` is not used); see docs/search.md.

    ``kernel=fn, kernel_depth=d``: for nodes at depth ``d`` (the root is 0),
    ``fn(node)`` returns the count of the node's subtree (node included, with
    ``accept`` as this call counts) -- a plain sequential function, e.g. a
    recursion at hand-written speed.  The skeleton splits and balances the
    tree above depth ``d`` only; ``stats.nodes`` counts the nodes it visited
    itself (not the kernels').  Not with ``checkpoint``.
    """
    coord = validate(pilot, children, coordination, spawn_depth, budget)
    if accept is not None and not callable(accept):
        raise TypeError(f"accept must be a function node -> bool or None, got {accept!r}")
    if kernel is not None:
        if not callable(kernel):
            raise TypeError(f"kernel must be a function node -> int (its subtree's count), "
                            f"got {kernel!r}")
        if type(kernel_depth) is not int or kernel_depth < 0:
            raise ValueError(f"kernel= needs kernel_depth, an int >= 0 (the depth from which "
                             f"kernel counts whole subtrees), got {kernel_depth!r}")
        if checkpoint is not None:
            raise ValueError("kernel= and checkpoint= exclude each other: a checkpoint needs "
                             "every open subtree, and a kernel's are inside the user's function")
        kernel = _Counted(kernel)
    elif kernel_depth is not None:
        raise TypeError("kernel_depth= without kernel=")
    ck = make_checkpoint(checkpoint, checkpoint_interval, "backtracking.count", root, children,
                         accept)
    tally, st = drive(pilot, root, children, Goal.COUNT, coordination=coord, stats=stats,
                      accept=accept, spawn_depth=spawn_depth, budget=budget, progress=progress,
                      checkpoint=ck, kernel=kernel, kernel_depth=kernel_depth or 0)
    return Count(tally.count, st)


def find(pilot, root, children, goal=None, *, objective=None, target=None, bound=None,
         coordination=Coordination.STACK_STEALING, spawn_depth: int = 2, budget: int = 10_000,
         stats: bool = False, progress=False, checkpoint=None,
         checkpoint_interval: float = 60.0):
    """A node for which ``goal(node)`` is true, or None; the first hit stops all tasks.

    YewPar's Decision skeleton: with ``objective`` and ``target`` instead of
    ``goal``, a goal node is one with ``objective(node) >= target``; with
    ``bound`` (an upper bound of ``objective`` over a node's subtree, as in
    ``branch_and_bound.maximise``) subtrees with ``bound(node) < target`` are
    pruned (``bound`` and ``target`` also prune a search for ``goal``).

    With ``stats=True`` a ``Found(node, path, stats)`` instead of the bare node.
    ``progress``, ``checkpoint`` and ``checkpoint_interval`` as in ``count``.
    """
    coord = validate(pilot, children, coordination, spawn_depth, budget)
    if goal is not None and objective is not None:
        raise TypeError("give find() a goal or an objective with a target, not both")
    if goal is None and objective is None:
        raise TypeError("find(): goal must be a function node -> bool, or give objective= "
                        "and target=")
    for name, fn in (("goal", goal), ("objective", objective), ("bound", bound)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function of a node, got {fn!r}")
    if (objective is not None or bound is not None) and target is None:
        raise TypeError("find(): objective= and bound= are measured against target=; give one")
    if target is not None:
        target = number(target, "target", ())
    ck = make_checkpoint(checkpoint, checkpoint_interval, "backtracking.find", root, children,
                         goal, objective, bound, target)
    tally, st = drive(pilot, root, children, Goal.FIND, coordination=coord, stats=stats,
                      accept=goal, objective=objective, bound=bound, target=target,
                      spawn_depth=spawn_depth, budget=budget, progress=progress,
                      checkpoint=ck)
    path, node = tally.found if tally.found is not None else (None, None)
    return Found(node, path, st) if stats else node


def solutions(pilot, root, children, accept, *, window: int | None = None,
              chunk_nodes: int = 20_000, chunk_solutions: int = 256):
    """Iterate over the nodes for which ``accept(node)`` is true, as they are found.

    Order is unspecified (it depends on timing); the set is exact.  At most
    ``window`` tasks (default 2 per worker) run ahead of the consumer, each
    returning at most ``chunk_solutions`` nodes; closing the iterator (or
    breaking out of a for loop) cancels the outstanding tasks.
    """
    validate(pilot, children, Coordination.STACK_STEALING, 0, 1)
    if not callable(accept):
        raise TypeError(f"accept must be a function node -> bool, got {accept!r}")
    window = 2 * pilot.workers if window is None else window
    window = check_count(window, "window", 1, " (chunk tasks in flight) or None")
    chunk_nodes = check_count(chunk_nodes, "chunk_nodes", 1)
    chunk_solutions = check_count(chunk_solutions, "chunk_solutions", 1)
    return _stream(pilot, root, children, accept, max_nodes=chunk_nodes,
                  max_found=chunk_solutions, window=window)


class _Counted:
    """``kernel=``: the user's kernel, its counts checked: a negative one is refused (it
    was added in, ``kernel=lambda n: -5`` counted -17).  The engine names the node and its
    path around the ValueError.  ``func``: the kernel (``portable`` looks there for a
    function of ``__main__``, which must travel by value)."""

    __slots__ = ("func",)

    def __init__(self, func):
        self.func = func

    def __call__(self, node):
        k = self.func(node)
        if isinstance(k, numbers.Integral) and not isinstance(k, bool) and k < 0:
            raise ValueError(f"kernel() returned {k!r}, a negative count; it must return the "
                             "number of nodes of the subtree that count (>= 0)")
        return k


# -- solutions(): driver-side chunks --------------------------------------------------


def _stream(pilot, root, children, accept, *, max_nodes: int, max_found: int, window: int):
    """solutions(): a generator of accepted nodes; see backtracking.solutions."""
    check_picklable(root, (), "the root is sent to a worker")
    ctl = make_control(pilot)
    stop = StopFlag.for_pilot(pilot)
    spec = SearchSpec(root=root, children=portable(children), goal=Goal.COUNT, control=ctl,
                stop=stop, accept=portable(accept),
                coordination=Coordination.STACK_STEALING, collect=True)
    frontier: list = [[(root, ())]]  # lists of units, LIFO: depth-first, so it stays small
    pending: set = set()
    try:
        while frontier or pending:
            while frontier and len(pending) < window:
                units = next_units(frontier, window, len(pending))
                # as bytes: nodes linked to their parent nest as deep as the search, past
                # the driver's recursion limit (checkpoint.dumps pickles them on a deep stack)
                pending.add(pilot.submit(_chunk_task, spec, freeze(units), max_nodes, max_found))
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for f in done:
                found, left, _ = f.result()
                if left:
                    frontier.append(left)
                yield from found
    finally:
        stop_all(ctl, stop, pending)  # running chunks return at their next node
        ctl.close()
        stop.close()


def _chunk_task(spec: SearchSpec, units, max_nodes: int, max_found: int):
    """solutions(): explore ``units`` [(node, path)] (or their ``Frozen`` pickle) sequentially
    until ``max_nodes`` nodes or ``max_found`` accepted nodes; return (found nodes, units left,
    tally)."""
    units = thaw(units)
    ctl = spec.control.array
    ex = Explorer(spec, (), ctl, slot(ctl), split=False)
    ex.tally.found_nodes = []
    t = ex.tally
    left: list = []
    stack = list(reversed(units))  # next unit last
    while stack:
        if t.nodes >= max_nodes or len(t.found_nodes) >= max_found or stopped(spec.stop, ctl):
            left.extend(reversed(stack))
            break
        node, path = stack.pop()
        if not ex.visit(node, len(path), path):
            continue
        kids = [(child, path + (i,)) for i, child in enumerate(listing(ex.children, node, path))]
        stack.extend(reversed(kids))
    return t.found_nodes, left, t
