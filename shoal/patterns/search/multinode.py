"""A search over several machines (a dask pilot of several nodes): the driver deals out the
top of the tree; the runtime balances the rest.

Data flow::

    driver: top_split: expand the top of the tree breadth-first until UNITS_PER_NODE
            subtrees per machine are open; deal them round-robin into GROUPS_PER_NODE
            groups per machine; submit units_task(group) each (dask spreads them)
    units_task: spawn one engine task per subtree on this machine (its workers share them)
    engine: a running task keeps RESERVE shallow subtrees spawned (Explorer.keep_reserve);
            the dask backend's balancer lends spawned tasks from a busy machine to one
            whose workers are all hungry, and brings their results back

Counting stays exact when a machine dies: dask re-runs a lost group from scratch (a
group's Tally reaches the driver only whole), and the runtime lends again a task whose
borrower died; every result reaches its owner's join exactly once.

Rejected (and removed): a second balancer here -- the driver asked busy machines
(a counter cell) to give their shallowest open level away through a Channel and
submitted it as new groups, with its own exactly-once bookkeeping of exports.  It
existed only because search tasks could not leave their machine (they carry the
machine's replicas of the search's cells); now a replica travels as its pilot-level
object (backends/dask/cells.py), so the runtime's balancer serves searches too.
"""

from __future__ import annotations

import shoal

from .control import wait_all
from .engine import Explorer, task
from .model import Coordination, SearchSpec, Tally, _Stopped, check_picklable

UNITS_PER_NODE = 16  # a pilot of several machines: subtrees the driver opens per machine ...
GROUPS_PER_NODE = 4  # ... dealt into this many tasks per machine (dask spreads the tasks)
MAX_SPLIT_DEPTH = 8  # the driver expands at most this many levels


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


def run_split(pilot, spec: SearchSpec, ctl, stop, prog=None) -> Tally:
    """A search over several machines: the merged Tally (see the module docstring)."""
    tally, groups = top_split(spec, ctl, UNITS_PER_NODE * pilot.nodes,
                              GROUPS_PER_NODE * pilot.nodes)
    if tally.found is not None:
        return tally
    tally.merge(wait_all([pilot.submit(units_task, spec, g) for g in groups], ctl, stop, prog))
    return tally


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
            check_picklable(node, path, "a subtree is sent to a worker", subtree=True)
    k = max(1, min(groups, len(frontier)))
    return ex.tally, [frontier[i::k] for i in range(k) if frontier[i::k]]
