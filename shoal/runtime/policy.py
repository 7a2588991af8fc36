"""Pure scheduling policy: where a submitted task goes, whom an idle worker robs, how long it waits.

Nothing here does I/O, reads the clock or starts processes; randomness arrives as
an injected ``random.Random`` so every decision is reproducible under a seed.
The worker loop and the backends feed events in (``submitted``, ``finished``,
``remove``, ``add``) and carry the returned decisions out.

Three pieces
-----------
* :func:`steal_share` — how much of its deque a victim hands a thief.
* :func:`victim_order` — the order in which a thief asks other workers for work:
  every worker on its own NUMA node (shuffled), then the other nodes by distance
  ``|node - mine|`` (then id), workers shuffled within each node.
* :class:`Placement` — redirect-push for tasks submitted by the driver (XQueue):
  push to the least-loaded worker of the preferred node, ties broken round-robin,
  but redirect to the globally least-loaded worker when the preferred node's
  minimum exceeds the global minimum by more than ``redirect_threshold``.
  Loads live in buckets (load -> FIFO of workers) per node and globally, so
  ``choose`` and the ``submitted``/``finished`` events are O(1) amortised.

Alternatives rejected
---------------------
* A central task queue: one lock or one multi-writer ring that every worker and
  the driver contend on; it serialises exactly the fine-grained tasks we target
  and breaks the single-writer invariant of the ring matrix.
* Random victims without locality: uniform choice sends half the steals across
  the interconnect on a 2-node machine, dragging the task's data with it;
  trying the near node first keeps most steals local while still balancing.
* Work-pushing on every spawn: a worker spawning children would pay a placement
  decision and a ring write per child and scatter a subtree's data; children go
  on the spawner's own deque and only idle workers pull (work-first stealing).
  Only driver submissions, which have no local deque, are pushed.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["Placement", "steal_share", "victim_order"]


def steal_share(queued: int, busy: bool, exporting: bool) -> int:
    """How many of its ``queued`` tasks a victim gives a thief: half, rounded up only
    when it answers from inside a running task (``busy``: a lone child is worth giving,
    the victim has work anyway), rounded down from its loop or a help-first join (it
    keeps one to run next).  Rounding up in a join too made two joining workers pass a
    lone stolen task back and forth forever (a livelock of a deep stolen chain: each
    took it, then gave it away before running it).  ``exporting``: the driver takes
    work for another machine while a task runs here; it never steals back, so it gets
    the rounded-up half."""
    return (queued + 1) // 2 if busy or exporting else queued // 2


def victim_order(me: int, node_of: Sequence[int], rng: random.Random) -> list[int]:
    """Workers for ``me`` to try stealing from: same node first (shuffled), then by node distance."""
    if not 0 <= me < len(node_of):
        raise ValueError(f"worker {me} out of range for {len(node_of)} workers")
    mine = node_of[me]
    by_node: dict[int, list[int]] = {}
    for worker, node in enumerate(node_of):
        if worker != me:
            by_node.setdefault(node, []).append(worker)
    order: list[int] = []
    for node in sorted(by_node, key=lambda n: (abs(n - mine), n)):
        workers = by_node[node]
        rng.shuffle(workers)
        order.extend(workers)
    return order


class _Buckets:
    """Workers grouped by load with the minimum tracked; FIFO within a load for round-robin."""

    __slots__ = ("by_load", "min", "size", "total")

    def __init__(self) -> None:
        self.by_load: dict[int, OrderedDict[int, None]] = {}
        self.min = 0
        self.size = 0
        self.total = 0  # sum of loads

    def insert(self, worker: int, load: int) -> None:
        bucket = self.by_load.get(load)
        if bucket is None:
            bucket = self.by_load[load] = OrderedDict()
        bucket[worker] = None
        if self.size == 0 or load < self.min:
            self.min = load
        self.size += 1
        self.total += load

    def discard(self, worker: int, load: int) -> None:
        bucket = self.by_load[load]
        del bucket[worker]
        self.size -= 1
        self.total -= load
        if self.size and load == self.min and not bucket:
            self.min = min(key for key, workers in self.by_load.items() if workers)

    def move(self, worker: int, load: int, delta: int) -> None:
        """Move ``worker`` from ``load`` to ``load + delta``: O(1) for delta = +-1.

        Emptied buckets stay in ``by_load`` for reuse (a worker flipping between
        loads 0 and 1 allocates nothing); ``min`` always names a non-empty bucket.
        A bulk move (delta > 1: a batch of tasks pushed at once) that empties the
        minimum's bucket finds the new minimum among loads ``load+1 .. load+delta``
        (every other worker's load is at least the old minimum): O(delta).
        """
        by_load = self.by_load
        bucket = by_load[load]
        del bucket[worker]
        new = load + delta
        target = by_load.get(new)
        if target is None:
            target = by_load[new] = OrderedDict()
        target[worker] = None
        self.total += delta
        if new < self.min:
            self.min = new
        elif load == self.min and not bucket:
            if delta == 1:
                self.min = new
            else:
                get = by_load.get
                self.min = next(k for k in range(load + 1, new + 1) if get(k))

    def pick(self) -> int:
        """A least-loaded worker; rotates it to the back of its bucket (round-robin)."""
        bucket = self.by_load[self.min]
        worker = next(iter(bucket))
        bucket.move_to_end(worker)
        return worker


class Placement:
    """Redirect-push placement of driver-submitted tasks; driver thread only (not thread-safe).

    ``choose`` does not change loads: the caller reports ``submitted(worker)`` once
    the task is pushed and ``finished(worker)`` when its result comes back.  The
    injected ``rng`` only seeds the initial round-robin order among idle workers.
    """

    def __init__(
        self, node_of: Sequence[int], rng: random.Random, redirect_threshold: int = 2
    ) -> None:
        if not node_of:
            raise ValueError("Placement needs at least one worker")
        if redirect_threshold < 0:
            raise ValueError(f"redirect_threshold must be >= 0, got {redirect_threshold}")
        self.redirect_threshold = redirect_threshold
        self._node_of: list[int] = list(node_of)
        self._load: list[int | None] = [None] * len(node_of)  # None: removed
        self._global = _Buckets()
        self._nodes: dict[int, _Buckets] = {}
        for node in sorted(set(self._node_of)):
            self._nodes[node] = _Buckets()
        # The round-robin order among equally loaded workers starts as a seeded
        # shuffle, so no worker index is systematically first in a partial burst.
        workers = list(range(len(node_of)))
        rng.shuffle(workers)
        self._single = False
        for worker in workers:
            self.add(worker)
        # One NUMA node (most machines): the node's buckets would mirror the global ones,
        # so they are not kept; choose() and the load events skip them (the submit hot path).
        self._single = len(self._nodes) == 1

    # -- events in ----------------------------------------------------------
    def submitted(self, worker: int, n: int = 1) -> None:
        """``n`` tasks were pushed to ``worker``."""
        load = self._load[worker] if 0 <= worker < len(self._load) else None
        if load is None:
            self._live_load(worker)  # raises
        self._load[worker] = load + n
        self._global.move(worker, load, n)
        if not self._single:
            self._nodes[self._node_of[worker]].move(worker, load, n)

    def finished(self, worker: int, n: int = 1) -> None:
        """``n`` tasks of ``worker`` finished (or were stolen away from it)."""
        load = self._load[worker] if 0 <= worker < len(self._load) else None
        if not load or load < n:
            self._live_load(worker)  # raises if not live
            raise ValueError(f"finished({worker}, n={n}) with only {load} outstanding tasks")
        self._load[worker] = load - n
        self._global.move(worker, load, -n)
        if not self._single:
            self._nodes[self._node_of[worker]].move(worker, load, -n)

    def min_load(self) -> int:
        """The outstanding load of the least-loaded live worker (0 when none is live)."""
        glob = self._global
        return glob.min if glob.size else 0

    def remove(self, worker: int) -> None:
        """Worker lost: never chosen again; its outstanding load is forgotten."""
        load = self._live_load(worker)
        self._load[worker] = None
        self._global.discard(worker, load)
        if not self._single:
            self._nodes[self._node_of[worker]].discard(worker, load)

    def add(self, worker: int, node: int | None = None) -> None:
        """Worker (re)started with no load; ``node`` defaults to the index's previous node."""
        if worker < 0:
            raise ValueError(f"worker index must be >= 0, got {worker}")
        if worker >= len(self._load):
            if node is None:
                raise ValueError(f"new worker {worker} needs a node")
            grow = worker + 1 - len(self._load)
            self._load.extend([None] * grow)
            self._node_of.extend([node] * grow)
        elif self._load[worker] is not None:
            raise ValueError(f"worker {worker} is already live")
        if node is not None:
            self._node_of[worker] = node
        self._load[worker] = 0
        self._global.insert(worker, 0)
        if self._single:
            if self._node_of[worker] in self._nodes:
                return
            self._single = False  # a second node appears: build its buckets from the loads
            for node in self._nodes:
                self._nodes[node] = _Buckets()
            for w, load in enumerate(self._load):
                if load is not None and w != worker:
                    self._nodes[self._node_of[w]].insert(w, load)
        buckets = self._nodes.get(self._node_of[worker])
        if buckets is None:
            buckets = self._nodes[self._node_of[worker]] = _Buckets()
        buckets.insert(worker, 0)

    # -- decisions out ------------------------------------------------------
    def choose(self, preferred_node: int | None = None) -> int:
        """The worker to push the next task to; does not change loads.

        ``preferred_node=None`` means the node with the least load per live worker.
        A known node with no live workers redirects globally; an unknown node id is
        a ValueError; no live workers at all is a LookupError.
        """
        glob = self._global
        if glob.size == 0:
            raise LookupError("no live workers to place a task on")
        if self._single and (preferred_node is None or preferred_node in self._nodes):
            return glob.pick()
        if preferred_node is None:
            node = self._least_loaded_node()
        else:
            node = self._nodes.get(preferred_node)
            if node is None:
                raise ValueError(f"unknown NUMA node {preferred_node}")
        if node.size == 0 or node.min - glob.min > self.redirect_threshold:
            return glob.pick()
        return node.pick()

    def load(self, worker: int) -> int:
        """Outstanding tasks of live ``worker``."""
        return self._live_load(worker)

    def node_of(self, worker: int) -> int:
        return self._node_of[worker]

    # -- internals ----------------------------------------------------------
    def _live_load(self, worker: int) -> int:
        load = self._load[worker] if 0 <= worker < len(self._load) else None
        if load is None:
            raise ValueError(f"worker {worker} is not live")
        return load

    def _least_loaded_node(self) -> _Buckets:
        best: _Buckets | None = None
        for node in self._nodes.values():
            if node.size and (best is None or node.total * best.size < best.total * node.size):
                best = node
        assert best is not None  # glob.size > 0
        return best

