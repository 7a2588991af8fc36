"""Driving one search from the driver: validate, submit the root task, wait, report.

The engine (``_search``) runs inside workers; this module is the driver's
side: it makes the Control array (stop flag, counters) and the incumbent cell,
submits the root task, turns an interruption into the stop flag, and builds
``SearchStats`` from the merged ``Tally``.
"""

from __future__ import annotations

import time

import shoal

from ._portable import Pinned, portable
from ._search import (
    STOP,
    Coordination,
    Goal,
    SearchStats,
    Spec,
    Tally,
    check_picklable,
    coordination_of,
    task,
)

STOP_WAIT_S = 10.0  # how long an interrupted search waits for its tasks to unwind


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
    import concurrent.futures as cf

    check_picklable(root, (), "the root is sent to a worker")
    ctl = shoal.SharedArray((pilot.workers + 1, 4), "int64", fill=0)
    cell = None
    try:
        if goal is Goal.OPTIMISE:
            cell = shoal.BestCell.for_pilot(pilot, "max", initial=spec_kw.get("initial"))
        for key in ("accept", "objective", "bound"):
            if spec_kw.get(key) is not None:
                spec_kw[key] = portable(spec_kw[key])
        spec = Spec(root=root, children=portable(children), goal=goal, control=Pinned(ctl),
                    cell=None if cell is None else Pinned(cell),
                    coordination=coordination, per_depth=stats, **spec_kw)
        before = _steals(pilot) if stats else (0, 0)
        t0 = time.monotonic()
        fut = pilot.submit(task, spec, root, ())
        try:
            tally = fut.result()
        except BaseException:
            ctl.array[0, STOP] = 1  # every task unwinds at its next poll
            # (no cancel() first: a cancelled driver future never counts as done for wait())
            if not cf.wait([fut], timeout=STOP_WAIT_S).done:
                fut.cancel()
            raise
        t_end = time.monotonic()
        after = _steals(pilot) if stats else (0, 0)
    finally:
        ctl.close()
        if cell is not None:
            cell.close()

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
