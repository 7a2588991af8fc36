"""Parallel branch-and-bound: ``maximise`` and ``minimise`` an objective over a search tree.

The user gives a root, ``children(node)`` (a lazy node generator, best first),
``objective(node)`` (the value of the node itself) and ``bound(node)``: an
optimistic bound for the whole subtree under ``node`` (node included): an
upper bound when maximising, a lower bound when minimising.

How the incumbent is shared.  The best value found so far lives in a
``shoal.BestCell`` (one float64 slot per process, each written by its owner
only, the best is the max over the slots: lock-free without CAS).  A task
offers every improvement at once and reads the cell every ~0.2 ms between
nodes (a few us per read, so not at every node); a task's own improvements
prune its own search immediately.  The incumbent *node* stays with the task
that found it and travels back up the join tree with the task's result.

Pruning rule (values negated internally when minimising, so always "max"):
a task prunes a node when ``bound <= held`` -- ``held``: the best value this
task found, or its spawners held when they spawned it (their results carry
that node, and this task's result counts only if theirs do) -- or when
``bound < the global incumbent``, strictly: the cell's value may have been
offered by a task whose attempt died (a SIGKILLed local worker whose stolen
task its owner runs again, a dask machine whose group dask runs again), and
the node that attained it died with it; a re-run that pruned ties against it
lost the optimum silently.  Why it is exact: the cell only
ever holds values of real nodes, rounded *down* to float64
(``model.floor_float``; an int past 2**53 rounded up pruned a better node,
F1), so nothing in it exceeds the optimum v*; the strict test never prunes a
node of value v*, the non-strict one only where a result that must reach the
driver for this one to count already carries v*.  Cost: ties with incumbents
of tasks outside a task's spawner chain are explored; passing the spawners'
values down brings the nodes explored on 2 workers back to about the sequential
run's (``benchmarks/bench_bnb_inflation.py``; docs/benchmarks.md, "Measurements behind design choices").  Rejected: strict pruning on pilots
of several machines only (the local backend re-runs a stolen task whose
worker died: the same loss, tests/attack/test_search_user_idioms.py); strict
pruning in re-run attempts only (a task cannot tell it is one, nor can the
tasks a re-run spawns, which a thief may run anywhere); withdrawing a dead
process's slot from the cell (tasks cached the value and pruned with it
already, and the dask replicas hold it too).

With ``prune_level=True`` (opt-in, as YewPar's PruneLevel) the children of a
node must come in non-increasing bound order (best first), so the first pruned
child ends its level: its later siblings are skipped without calling
``bound``.  Off by default: on children in any other order it would return a
wrong optimum silently.  When on, the order is checked where it costs one
comparison (every bound the search computes against its elder sibling's) and
a misordered level is refused with a SearchError; siblings after a pruned one
are never bounded, so that check cannot see them.

``ordered=True``: a replicable answer.  Among optimal nodes the one first in
sequential depth-first order (smallest child-index path) is returned, the same
node as ``coordination="sequential"`` finds, whatever the worker count and
timing.  For that a task prunes ``bound < global incumbent`` (strictly) but
``bound <= its own best`` (its own best, or its spawners', lies before the node
in depth-first order), as every search now does (the pruning rule above); ties
merge to the smallest path.  Without ``ordered`` the value is
still exact, only the node may differ among ties.

Work inflation: ``stats.work_inflation = stats.nodes / reference_nodes`` when
the caller passes the node count of a sequential run (``coordination=
"sequential"``), since a parallel search may expand nodes a sequential one
would have pruned (or fewer: superlinear cases).

Rejected: broadcasting incumbents through the rings (a message per
improvement per worker, read only between tasks); sharing the incumbent path
for exact tie pruning (a variable-length value per slot, for little gain).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .search.checkpoint import make as make_checkpoint
from .search.driver import check_count, drive, validate
from .search.model import Coordination, Goal, SearchError, SearchStats, number

__all__ = ["Coordination", "Result", "SearchError", "SearchStats", "maximise", "minimise"]


@dataclass(frozen=True)
class Result:
    """The optimum: its value, a node attaining it and that node's path, and the stats.

    ``node``/``path`` are None when no node strictly beats ``initial``; then
    ``value`` is ``initial``, None when no ``initial`` was given.  Without
    ``initial`` that is the case when every objective is -inf (``minimise``:
    +inf), the usual way to mark a node infeasible: a tree with no feasible
    node gives ``Result(None, None, None, stats)``, never a node of value -inf.
    """

    value: float | None
    node: object
    path: tuple | None
    stats: SearchStats


def maximise(pilot, root, children, objective, bound, *, initial=None, prune_level: bool = False,
             ordered: bool = False, coordination=Coordination.STACK_STEALING,
             spawn_depth: int = 2, budget: int = 1_000, stats: bool = False,
             reference_nodes: int | None = None, progress=False, checkpoint=None,
             checkpoint_interval: float = 60.0) -> Result:
    """The node of the tree under ``root`` with the largest ``objective``.

    ``bound(node)``: an upper bound of ``objective`` over the subtree of
    ``node``.  ``initial``: a value known to be reachable (e.g. from a
    heuristic); only nodes strictly better are looked for.  Other options as
    in ``shoal.patterns.backtracking.count``; ``stats=True`` adds per-depth
    counts and steals to ``result.stats``.  ``progress=True`` writes a line a
    second (nodes, nodes/s, incumbent) to stderr when it is a terminal;
    ``"always"`` or a file-like object force it.  ``checkpoint="path"`` (and
    ``checkpoint_interval`` seconds): the frontier and the incumbent are saved
    atomically, and the same call after a crash of the driver resumes from
    them, with the same optimum (with ``ordered=True`` the same node) as an
    uninterrupted run; as in ``backtracking.count``.
    """
    return _optimise(pilot, root, children, objective, bound, False, initial, prune_level,
                     ordered, coordination, spawn_depth, budget, stats, reference_nodes, progress,
                     checkpoint, checkpoint_interval)


def minimise(pilot, root, children, objective, bound, *, initial=None, prune_level: bool = False,
             ordered: bool = False, coordination=Coordination.STACK_STEALING,
             spawn_depth: int = 2, budget: int = 1_000, stats: bool = False,
             reference_nodes: int | None = None, progress=False, checkpoint=None,
             checkpoint_interval: float = 60.0) -> Result:
    """The node with the smallest ``objective``; ``bound(node)`` is a lower bound.

    Everything else as in ``maximise``.
    """
    return _optimise(pilot, root, children, objective, bound, True, initial, prune_level,
                     ordered, coordination, spawn_depth, budget, stats, reference_nodes, progress,
                     checkpoint, checkpoint_interval)


def _optimise(pilot, root, children, objective, bound, negate, initial, prune_level, ordered,
              coordination, spawn_depth, budget, stats, reference_nodes, progress, checkpoint,
              checkpoint_interval) -> Result:
    coord = validate(pilot, children, coordination, spawn_depth, budget)
    for name, fn in (("objective", objective), ("bound", bound)):
        if not callable(fn):
            raise TypeError(f"{name} must be a function node -> number, got {fn!r}")
    if reference_nodes is not None:
        check_count(reference_nodes, "reference_nodes", 1, " (a sequential run's node count)")
    start = -math.inf
    if initial is not None:
        if type(initial) is bool or not isinstance(initial, (int, float)) and not _real(initial):
            raise TypeError(f"initial must be a real number, got {initial!r} "
                            f"({type(initial).__name__})")
        start = number(initial, "initial", ())
        start = -start if negate else start
    ck = make_checkpoint(checkpoint, checkpoint_interval,
                         "branch_and_bound." + ("minimise" if negate else "maximise"), root,
                         children, objective, bound, start, bool(prune_level), bool(ordered))
    tally, st = drive(pilot, root, children, Goal.OPTIMISE, coordination=coord, stats=stats,
                      reference_nodes=reference_nodes, objective=objective, bound=bound,
                      negate=negate, initial=start, prune_level=bool(prune_level),
                      ordered=bool(ordered), spawn_depth=spawn_depth, budget=budget,
                      progress=progress, checkpoint=ck)
    if tally.best_path is None:
        return Result(initial, None, None, st)
    value = -tally.best if negate else tally.best
    return Result(value, tally.best_node, tally.best_path, st)


def _real(x) -> bool:
    import numbers

    return isinstance(x, numbers.Real)
