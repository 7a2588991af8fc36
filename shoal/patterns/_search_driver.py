"""Driving one search from the driver: validate, submit the root task, wait, report.

The engine (``_search``) runs inside workers; this module is the driver's
side: it makes the Control array (stop flag, counters) and the incumbent cell,
submits the root task, turns an interruption into the stop flag, and builds
``SearchStats`` from the merged ``Tally``.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import shoal

from ._portable import Pinned, portable
from ._search import (
    STOP,
    Coordination,
    Explorer,
    Goal,
    SearchStats,
    Spec,
    Tally,
    _Stopped,
    check_picklable,
    coordination_of,
    task,
    units_task,
)

STOP_WAIT_S = 10.0  # how long an interrupted search waits for its tasks to unwind
UNITS_PER_NODE = 16  # a pilot of several machines: subtrees the driver opens per machine ...
GROUPS_PER_NODE = 4  # ... dealt into this many tasks per machine (dask spreads the tasks)
MAX_SPLIT_DEPTH = 8  # the driver expands at most this many levels


def validate(pilot, children, coordination, spawn_depth: int, budget: int) -> Coordination:
    coord = coordination_of(coordination)
    if not callable(children):
        raise TypeError(f"children must be a function node -> iterable of nodes, got {children!r}")
    if not isinstance(spawn_depth, int) or spawn_depth < 0:
        raise ValueError(f"spawn_depth must be an int >= 0, got {spawn_depth!r}")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an int >= 1 (backtracks before a split), got {budget!r}")
    if not hasattr(pilot, "submit") or not hasattr(pilot, "workers"):
        raise TypeError(f"the first argument must be a shoal.Pilot, got {pilot!r}")
    return coord


def _steals(pilot) -> tuple[int, int]:
    ws = pilot.stats().get("workers", [])
    return (sum(w.get("stolen_local", 0) for w in ws), sum(w.get("stolen_remote", 0) for w in ws))


def drive(pilot, root, children, goal: Goal, *, coordination, stats: bool,
          reference_nodes: int | None = None, **spec_kw) -> tuple[Tally, SearchStats]:
    """Run one search to the end on ``pilot``; (merged Tally, SearchStats).

    An exception in the driver while waiting (KeyboardInterrupt) or in a task
    sets the stop flag, so every task unwinds at its next poll; the driver
    waits up to ``STOP_WAIT_S`` for that before re-raising.
    """
    check_picklable(root, (), "the root is sent to a worker")
    # Control is per node (who is hungry *here*); the incumbent and the stop flag are
    # cells, which on a pilot of several machines are kept in step across them
    ctl = shoal.SharedArray.per_node(pilot, (pilot.workers + 1, 4), "int64", fill=0)
    cells = []
    try:
        stop = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
        cells.append(stop)
        cell = None
        if goal is Goal.OPTIMISE:
            cell = shoal.BestCell.for_pilot(pilot, "max", initial=spec_kw.get("initial"))
            cells.append(cell)
        for key in ("accept", "objective", "bound"):
            if spec_kw.get(key) is not None:
                spec_kw[key] = portable(spec_kw[key])
        spec = Spec(root=root, children=portable(children), goal=goal, control=Pinned(ctl),
                    cell=None if cell is None else Pinned(cell), stop=Pinned(stop),
                    coordination=coordination, per_depth=stats, **spec_kw)
        before = _steals(pilot) if stats else (0, 0)
        t0 = time.monotonic()
        tally = _run(pilot, spec, ctl, stop)
        t_end = time.monotonic()
        after = _steals(pilot) if stats else (0, 0)
    finally:
        ctl.close()
        for c in cells:
            c.close()

    def rel(t):
        return None if t is None else max(0.0, t - t0)

    st = SearchStats(
        coordination=coordination, workers=pilot.workers, nodes=tally.nodes,
        pruned=tally.pruned, tasks=tally.tasks, splits=tally.splits,
        per_depth=tuple(tally.per_depth), steals_local=after[0] - before[0],
        steals_remote=after[1] - before[1], elapsed_s=t_end - t0,
        first_incumbent_s=rel(tally.t_first), final_incumbent_s=rel(tally.t_best),
        incumbent_updates=tally.updates,
        stop_latency_s=None if tally.t_hit is None else max(0.0, t_end - tally.t_hit),
        work_inflation=(tally.nodes / reference_nodes) if reference_nodes else None,
    )
    return tally, st


def _run(pilot, spec: Spec, ctl, stop) -> Tally:
    """Submit the search and wait: one root task, or on a pilot of several machines the
    driver's split of the top levels in groups (``top_split``), one task per group."""
    nodes = pilot.nodes if spec.coordination is not Coordination.SEQUENTIAL else 1
    if nodes > 1:
        tally, groups = top_split(spec, ctl, UNITS_PER_NODE * nodes, GROUPS_PER_NODE * nodes)
        futs = [pilot.submit(units_task, spec, g) for g in groups]
    else:
        tally, futs = Tally(tasks=0), [pilot.submit(task, spec, spec.root, ())]
    pending = set(futs)
    try:
        while pending:
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for f in done:
                part = f.result()
                tally.merge(part)
                if part.found is not None:
                    stop.offer(1.0)  # a find() hit: stop the other groups
        return tally
    except BaseException:
        ctl.array[0, STOP] = 1  # every task unwinds at its next poll
        stop.offer(1.0)
        # (no cancel() first: a cancelled driver future never counts as done for wait())
        _, late = cf.wait(pending, timeout=STOP_WAIT_S)
        for f in late:
            f.cancel()
        raise


def top_split(spec: Spec, ctl, want: int, groups: int) -> tuple[Tally, list]:
    """Expand the tree breadth-first in the driver until ``want`` subtrees are open (or
    ``MAX_SPLIT_DEPTH``); (the driver's Tally, the open subtrees dealt into ``groups``
    lists of (node, path)).  Nodes expanded here are visited (counted, bounded) here.

    Round-robin dealing gives every group early (promising, for branch and bound) and
    late subtrees; each group keeps pre-order.  A hit of find() here is the answer.
    """
    ex = Explorer(spec, (), ctl.array, 0, split=False)
    frontier = [(spec.root, ())]
    depth = 0
    try:
        while frontier and len(frontier) < want and depth < MAX_SPLIT_DEPTH:
            nxt = []
            for node, path in frontier:
                if not ex.visit(node, len(path), path):
                    continue
                for i, child in enumerate(ex.kids(node, path)):
                    nxt.append((child, path + (i,)))
            frontier, depth = nxt, depth + 1
    except _Stopped:  # the goal is among the nodes visited here
        return ex.tally, []
    ex.tally.tasks = 0
    if spec.coordination is Coordination.INDEXED:
        frontier = [(None, p) for _, p in frontier]
    else:
        for node, path in frontier:
            check_picklable(node, path, "a subtree is sent to a worker")
    k = max(1, min(groups, len(frontier)))
    return ex.tally, [frontier[i::k] for i in range(k) if frontier[i::k]]
