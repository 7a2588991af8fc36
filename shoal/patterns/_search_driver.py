"""Driving one search from the driver: validate, submit, wait, report.

The engine (``_search``) runs inside workers; this module is the driver's
side: it makes the Control array (per machine), the stop and incumbent cells,
submits the root task — or, on a pilot of several machines, splits the top of
the tree into groups and moves subtrees to machines that run dry
(``_run_split``) — turns an interruption into the stop flag, and builds
``SearchStats`` from the merged ``Tally``.
"""

from __future__ import annotations

import concurrent.futures as cf
import pickle
import time

import shoal

from ._portable import portable
from ._progress import Ticker
from ._search import (
    NODES,
    SPAWNED,
    STARTED,
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
EXPORT_POLL_S = 0.002  # the driver's loop over results and exports (several machines)


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
    ctl = shoal.SharedArray.per_node(pilot, (pilot.workers + 1, 6), "int64", fill=0)
    owned = [ctl]
    try:
        stop = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
        owned.append(stop)
        cell = chan = requests = None
        if goal is Goal.OPTIMISE:
            cell = shoal.BestCell.for_pilot(pilot, "max", initial=spec_kw.get("initial"))
            owned.append(cell)
        split = pilot.nodes > 1 and coordination is not Coordination.SEQUENTIAL
        if split:  # subtrees move between machines on request (see _run_split)
            chan = shoal.Channel.for_pilot(pilot)
            requests = shoal.BestCell.for_pilot(pilot, "max", initial=0.0)
            owned += [chan, requests]
        for key in ("accept", "objective", "bound"):
            if spec_kw.get(key) is not None:
                spec_kw[key] = portable(spec_kw[key])
        spec = Spec(root=root, children=portable(children), goal=goal, control=ctl,
                    cell=cell, stop=stop, channel=chan, requests=requests,
                    coordination=coordination, per_depth=stats, **spec_kw)
        before = _steals(pilot) if stats else (0, 0)
        t0 = time.monotonic()
        ticker = Ticker("search", _sampler(ctl, cell, goal, coordination, reference_nodes,
                                           spec_kw.get("negate", False)),
                        rates=("nodes",), line=("nodes", "nodes_per_s", "incumbent", "frontier"))
        with ticker:
            if split:
                tally, exported = _run_split(pilot, spec, ctl, stop, chan, requests, ticker)
            else:
                tally, exported = _wait(pilot, [pilot.submit(task, spec, root, ())], ctl, stop,
                                        ticker), 0
        t_end = time.monotonic()
        after = _steals(pilot) if stats else (0, 0)
    finally:
        for obj in owned:
            obj.close()

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
        exported=exported,
    )
    return tally, st


def _sampler(ctl, cell, goal: Goal, coordination, reference_nodes, negate: bool):
    """The search's progress record, read from Control and the incumbent cell (driver)."""
    def sample() -> dict:
        a = ctl.array
        nodes = int(a[:, NODES].sum())
        rec = {"goal": goal.value, "coordination": coordination.value, "nodes": nodes,
               "tasks": int(a[:, STARTED].sum()),
               "frontier": max(0, int(a[:, SPAWNED].sum() - a[:, STARTED].sum()))}
        if cell is not None:
            rec["incumbent"] = -cell.value if negate else cell.value
        if reference_nodes:
            rec["work_inflation"] = round(nodes / reference_nodes, 4)
        return rec
    return sample


def _wait(pilot, futs: list, ctl, stop, ticker=None) -> Tally:
    """Merge the tallies of ``futs``; on an error or an interruption stop every task."""
    tally, pending = Tally(tasks=0), set(futs)
    try:
        while pending:
            done, pending = cf.wait(pending, timeout=None if ticker is None else ticker.timeout(),
                                    return_when=cf.FIRST_COMPLETED)
            if ticker is not None:
                ticker.tick()
            for f in done:
                tally.merge(f.result())
        return tally
    except BaseException:
        _stop_all(ctl, stop, pending)
        raise


def _stop_all(ctl, stop, pending) -> None:
    ctl.array[0, STOP] = 1  # every task unwinds at its next poll
    stop.offer(1.0)
    # (no cancel() first: a cancelled driver future never counts as done for wait())
    _, late = cf.wait(pending, timeout=STOP_WAIT_S)
    for f in late:
        f.cancel()


def _run_split(pilot, spec: Spec, ctl, stop, chan, requests, ticker) -> tuple[Tally, int]:
    """A search over several machines: (merged Tally, subtrees exported).

    The driver splits the top of the tree into groups (``top_split``), one task each;
    dask hands them to machines as they free up.  When fewer tasks are left than the
    pilot has workers, a machine is running dry: the driver raises ``requests``, and
    every busy machine's next poll gives its shallowest open subtree away through
    ``chan`` (``Explorer.export``); the driver submits each as a new task.

    Counting stays exact when a machine dies: dask re-runs a lost task from scratch,
    so the subtrees that attempt exported are explored again by the re-run.  A
    task's Tally lists the ids it exported, and only exports listed by a counted
    Tally are counted (orphans of a lost attempt are dropped); the search ends when
    the groups are done and every listed export is in.
    """
    tally, groups = top_split(spec, ctl, UNITS_PER_NODE * pilot.nodes,
                              GROUPS_PER_NODE * pilot.nodes)
    if tally.found is not None:
        return tally, 0
    uid_of = {pilot.submit(units_task, spec, g): None for g in groups}  # None: a group
    pending = set(uid_of)
    held: dict[int, Tally] = {}  # finished exports not (yet) listed by a counted Tally
    wanted: set[int] = set()  # listed by a counted Tally, not finished yet
    asked = received = 0
    stopping = False

    def count(part: Tally) -> None:
        tally.merge(part)
        for uid in part.exports or ():
            later = held.pop(uid, None)
            if later is None:
                wanted.add(uid)
            else:
                count(later)

    try:
        while pending or (wanted and not stopping):
            done, pending = cf.wait(pending, timeout=EXPORT_POLL_S,
                                    return_when=cf.FIRST_COMPLETED)
            ticker.tick()
            for f in done:
                part, uid = f.result(), uid_of.pop(f)
                if part.found is not None and not stopping:
                    stopping = True  # a find() hit: stop the others
                    stop.offer(1.0)
                if uid is None:
                    count(part)
                elif uid in wanted:
                    wanted.discard(uid)
                    count(part)
                else:
                    held[uid] = part
            for blob in chan.get():
                uid, units = pickle.loads(blob)
                received += 1
                if not stopping:
                    f = pilot.submit(units_task, spec, units)
                    uid_of[f] = uid
                    pending.add(f)
            if not stopping and len(pending) <= pilot.workers and asked <= received:
                asked += 1
                requests.offer(asked)
        if stopping:  # found: what was held may hold nothing better than the hit
            for part in held.values():
                tally.merge(part)
        return tally, received
    except BaseException:
        _stop_all(ctl, stop, pending)
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
