"""A search over several machines (a dask pilot of several nodes): the driver's side
and the workers' side of moving subtrees between machines.

Data flow::

    driver: top_split: expand the top of the tree breadth-first until UNITS_PER_NODE
            subtrees per machine are open; deal them round-robin into GROUPS_PER_NODE
            groups per machine; submit units_task(group) each (dask spreads them)
    units_task: spawn one engine task per subtree on this machine (its workers share them)
    driver: when fewer tasks are left than the pilot has workers, a machine is running
            dry: raise the RequestCounter; every busy machine's next poll gives its
            shallowest open level away through the Channel (export_level); the driver
            submits each such group as a new units_task

Counting stays exact when a machine dies: dask re-runs a lost task from scratch, so
the subtrees that attempt exported are explored again by the re-run.  A task's Tally
lists the ids it exported, and only exports listed by a counted Tally are counted
(orphans of a lost attempt are dropped); the search ends when the groups are done and
every listed export is in.
"""

from __future__ import annotations

import concurrent.futures as cf
import pickle
import random

import shoal

from .control import EXPORTED, stop_all
from .engine import Explorer, task
from .model import Coordination, SearchSpec, Tally, _Stopped, check_picklable

UNITS_PER_NODE = 16  # a pilot of several machines: subtrees the driver opens per machine ...
GROUPS_PER_NODE = 4  # ... dealt into this many tasks per machine (dask spreads the tasks)
MAX_SPLIT_DEPTH = 8  # the driver expands at most this many levels
EXPORT_POLL_S = 0.002  # the driver's loop over results and exports


class RequestCounter:
    """How many subtree exports the driver has asked for, on every machine.

    The driver ``ask()``s when a machine runs dry; a worker whose machine has exported
    fewer than ``asked`` gives a level away.  Built on the public
    ``shoal.BestCell.for_pilot`` (a count that only rises, kept in step across machines).
    """

    __slots__ = ("_cell", "_asked")

    def __init__(self, cell, asked: int = 0):
        self._cell, self._asked = cell, asked

    @classmethod
    def for_pilot(cls, pilot) -> RequestCounter:
        return cls(shoal.BestCell.for_pilot(pilot, "max", initial=0.0))

    def ask(self) -> int:
        """One more request (driver only); the new total."""
        self._asked += 1
        self._cell.offer(self._asked)
        return self._asked

    @property
    def asked(self) -> float:
        """Requests made so far, as this machine has heard of them."""
        return self._cell.value

    def close(self) -> None:
        self._cell.close()

    def __reduce__(self):
        return (RequestCounter, (self._cell,))


def units_task(spec: SearchSpec, units: list) -> Tally:
    """A group of subtrees ``[(node, path)]`` (the driver's split of the top levels on a
    pilot of several nodes): one task each, spawned here, so this node's workers share them."""
    tally = Tally(tasks=0)
    futs = [shoal.spawn(task, spec, node, path) for node, path in units[:0:-1]]
    try:
        tally.merge(task(spec, *units[0]))
        for f in reversed(futs):
            tally.merge(f.result())
    except BaseException:
        for f in futs:
            f.cancel()
        raise
    return tally


def export_level(ex: Explorer, iters, idx) -> None:
    """Another machine ran dry: give it the unexplored siblings of ``ex``'s shallowest open
    level, in one Channel message (if the slot is still full or the message too big,
    they are spawned here instead)."""
    ex.exporting = []
    try:
        ex.split_at(iters, idx, 1, whole_level=True)
    finally:
        units, ex.exporting = ex.exporting, None
    if units and not _export(ex, units):
        for node, path in units:
            ex.spawn_unit(node, path)


def _export(ex: Explorer, units: list) -> bool:
    """Put the subtrees in the Channel; False: the slot is still full or it is too big."""
    uid = random.getrandbits(62)
    try:
        blob = pickle.dumps((uid, units), 5)
    except Exception:
        import cloudpickle

        blob = cloudpickle.dumps((uid, units))
    if len(blob) > ex.channel.size or not ex.channel.put(blob):
        return False
    ex.ctl[ex.me, EXPORTED] += 1
    t = ex.tally
    if t.exports is None:
        t.exports = []
    t.exports.append(uid)
    return True


def run_split(pilot, spec: SearchSpec, ctl, stop, chan, requests, prog=None) -> tuple[Tally, int]:
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
            for f in done:
                part, uid = f.result(), uid_of.pop(f)
                if part.found is not None and not stopping:
                    stopping = True  # a find() hit: stop the others
                    stop.set()
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
            if prog is not None:
                prog.tick()
            if not stopping and len(pending) <= pilot.workers and asked <= received:
                asked = requests.ask()
        if stopping:  # found: what was held may hold nothing better than the hit
            for part in held.values():
                tally.merge(part)
        return tally, received
    except BaseException:
        stop_all(ctl, stop, pending)
        raise


def top_split(spec: SearchSpec, ctl, want: int, groups: int) -> tuple[Tally, list]:
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
        deepest = MAX_SPLIT_DEPTH if spec.kernel is None else min(MAX_SPLIT_DEPTH,
                                                                  spec.kernel_depth)
        while frontier and len(frontier) < want and depth < deepest:
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
