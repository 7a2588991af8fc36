"""Placement and backfill policy: which waiting requests start now, on which cores/GPUs.

Pure: no I/O, no clock, no processes.  The engine feeds it ``Request``s (a
key plus ``cores``/``gpus``/``memory``) in arrival order and gets back
``Grant``s (the concrete CPU ids, GPU ids and bytes granted); it hands
``release(grant)`` back when a task ends.  That is all the state there
is, so property tests drive it directly (tests/ensemble/test_ens_scheduler.py).

Invariants:
  * never over-commit: granted cores/GPUs are disjoint from those in use and
    taken from the configured set; granted memory never exceeds the total;
  * work-conserving for the head: if the oldest waiting request fits what is
    free, it is placed;
  * backfilling: a request that does not fit does not block the ones behind
    it — smaller requests fill the gap — until ``patience`` requests have
    overtaken it; from then on nothing overtakes it (a reservation), so a
    wide task cannot starve behind a stream of narrow ones;
  * locality: a multi-core request gets its cores from one NUMA node when
    one has room (best fit: the node with the fewest free cores that still
    fits, which keeps big holes for big tasks), lowest CPU ids first;
  * queueing behind (only when ``place(..., queue=True)``, only for requests
    marked ``queueable``: the engine's 1-core local executables, run one after
    the other by the runner thread of their CPU): when no CPU is free, such a
    request may be granted a CPU held by another queueable request, at most one
    per CPU (``Grant.queued``).  Its runner starts it when the holder ends, so
    the CPU still runs one task at a time; when the holder is released the CPU
    passes to the queued grant instead of becoming free.  Nothing else is ever
    granted a CPU that is held or has a grant queued on it.

The engine offers the waiting requests in the order ``Waiting`` (below) keeps: by
``priority`` (higher first), then by arrival; the rules above read "oldest" as "first in
that order".

Rejected alternatives: EASY backfill with runtime estimates (estimates are
optional here; the patience counter gives the same no-starvation guarantee
without them); first-fit without reservation (starves wide tasks); a
bitmap allocator over a flat core list (ignores NUMA nodes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Request:
    key: Hashable
    cores: int = 1
    gpus: int = 0
    memory: int = 0
    queueable: bool = False  # may wait behind another queueable 1-core grant (see the invariants)


@dataclasses.dataclass(frozen=True)
class Grant:
    """What ``place`` hands out for one request.  (Named ``Placement`` before; renamed so it
    no longer shares a name with the runtime's task-placement policy, shoal/runtime/policy.py.)"""

    key: Hashable
    cpus: tuple[int, ...]
    gpus: tuple[int, ...]
    memory: int
    queued: bool = False  # placed behind the CPU's current holder: it starts when that one ends


class Scheduler:
    """Tracks free CPUs/GPUs/memory; places requests with backfilling.  Owner only (driver)."""

    def __init__(self, cpus: Iterable[int], *, gpus: int = 0, memory: int = 0,
                 nodes: Sequence[Iterable[int]] | None = None, patience: int = 64):
        self.cpus = tuple(sorted(set(cpus)))
        if not self.cpus:
            raise ValueError("a scheduler needs at least one CPU")
        self.gpu_count = gpus
        self.memory_total = memory  # 0: not tracked
        self.patience = patience
        node_of = {}
        for i, node in enumerate(nodes or [self.cpus]):
            for c in node:
                if c in self.cpus:
                    node_of[c] = i
        self.node_of = {c: node_of.get(c, 0) for c in self.cpus}
        self.one_node = len(set(self.node_of.values())) == 1
        self.free_cpus: set[int] = set(self.cpus)
        self.free_gpus: set[int] = set(range(gpus))
        self.free_memory = memory
        self.overtaken: dict[Hashable, int] = {}  # head key -> how many overtook it
        self.single: set[int] = set()  # CPUs held by a queueable (1-core) grant
        self.queued: dict[int, Hashable] = {}  # CPU -> the key of the grant queued behind its holder

    # -- questions ---------------------------------------------------------------------
    def impossible(self, req: Request) -> str | None:
        """Why ``req`` can never be placed on this pilot (None if it can)."""
        if req.cores > len(self.cpus):
            return f"asks for {req.cores} cores but the pilot has {len(self.cpus)}"
        if req.gpus > self.gpu_count:
            return f"asks for {req.gpus} GPUs but the pilot has {self.gpu_count} (pass gpus= to run)"
        if self.memory_total and req.memory > self.memory_total:
            return f"asks for {req.memory} bytes of memory but the pilot has {self.memory_total}"
        return None

    def fits(self, req: Request) -> bool:
        return (req.cores <= len(self.free_cpus) and req.gpus <= len(self.free_gpus)
                and (not self.memory_total or req.memory <= self.free_memory))

    @property
    def idle(self) -> bool:
        return len(self.free_cpus) == len(self.cpus) and len(self.free_gpus) == self.gpu_count

    # -- actions -----------------------------------------------------------------------
    def place(self, waiting: Sequence[Request], *, queue: bool = False) -> list[Grant]:
        """Place what fits from ``waiting`` (oldest first); the caller removes the placed keys.
        ``queue``: queueable requests that find no free CPU may queue behind a holder."""
        placed: list[Grant] = []
        head: Request | None = None  # oldest request that did not fit
        for req in waiting:
            slot = None
            if not self.fits(req):
                if queue and req.queueable and req.cores == 1 and not req.gpus and not req.memory:
                    slot = self._slot()
                if slot is None:
                    if head is None:
                        head = req
                    if not self.free_cpus and not (queue and self._slot() is not None):
                        break
                    continue
            if head is not None:
                if self.overtaken.get(head.key, 0) >= self.patience:
                    break  # reservation: nothing more overtakes the head
                self.overtaken[head.key] = self.overtaken.get(head.key, 0) + 1
            if slot is None:
                placed.append(self._take(req))
            else:
                self.queued[slot] = req.key
                placed.append(Grant(req.key, (slot,), (), 0, queued=True))
            self.overtaken.pop(req.key, None)
            if not self.free_cpus and not (queue and self._slot() is not None):
                break
        return placed

    def release(self, p: Grant) -> None:
        if len(p.cpus) == 1 and p.cpus[0] in self.queued:
            c = p.cpus[0]
            if self.queued.pop(c) != p.key:  # the holder ended: the CPU passes to the queued grant
                if self.memory_total:
                    self.free_memory += p.memory
                return
            return  # the queued grant went away before it started: the CPU stays with its holder
        if len(p.cpus) == 1:
            self.single.discard(p.cpus[0])
        self.free_cpus.update(p.cpus)
        self.free_gpus.update(p.gpus)
        if self.memory_total:
            self.free_memory += p.memory

    def mark_long(self, p: Grant) -> None:
        """``p``'s task outlived the quick window: nothing more queues behind it (what was
        queued is bounced back by its runner and released by the engine)."""
        if len(p.cpus) == 1:
            self.single.discard(p.cpus[0])

    def forget(self, key: Hashable) -> None:
        """``key`` left the waiting list without being placed (skipped, cancelled)."""
        self.overtaken.pop(key, None)

    def _slot(self) -> int | None:
        """The lowest CPU held by a queueable grant with nothing queued behind it yet."""
        free = [c for c in self.single if c not in self.queued]
        return min(free) if free else None

    def _take(self, req: Request) -> Grant:
        if req.cores == 1 and not req.gpus and self.one_node:  # the common case, what the rule below
            c = min(self.free_cpus)  # gives for it: the lowest free CPU
            self.free_cpus.discard(c)
            if req.queueable:
                self.single.add(c)
            if self.memory_total:
                self.free_memory -= req.memory
            return Grant(req.key, (c,), (), req.memory)
        by_node: dict[int, list[int]] = {}
        for c in self.free_cpus:
            by_node.setdefault(self.node_of[c], []).append(c)
        roomy = [cs for cs in by_node.values() if len(cs) >= req.cores]
        if roomy:
            cpus = sorted(min(roomy, key=lambda cs: (len(cs), min(cs))))[: req.cores]
        else:
            cpus = sorted(self.free_cpus)[: req.cores]
        gpus = sorted(self.free_gpus)[: req.gpus]
        if req.queueable and req.cores == 1:
            self.single.add(cpus[0])
        self.free_cpus.difference_update(cpus)
        self.free_gpus.difference_update(gpus)
        if self.memory_total:
            self.free_memory -= req.memory
        return Grant(req.key, tuple(cpus), tuple(gpus), req.memory)


_MISSING = object()


class Waiting:
    """The engine's waiting tasks, in the order they are offered to ``Scheduler.place``: by
    priority (higher first), then in arrival order.  ``waiting[key] = item`` files ``item``
    under ``item.priority``; ``first=True`` (``move_to_end(key, last=False)``) puts it ahead of
    its priority's others (a task bounced back to be placed again).

    Priority orders what is *ready*: the stage barrier and ``after=``/``when=`` decide which
    tasks are candidates at all (the engine skips the blocked ones), and the Scheduler's
    backfilling still lets a narrow task of lower priority past a wide one that does not fit
    (until ``patience`` have, as for arrival order).  One bucket per priority in use: a run
    that gives no priorities has one and pays what an ordered dict costs."""

    __slots__ = ("buckets", "order", "where")

    def __init__(self):
        self.buckets: dict[int, dict] = {}  # priority -> key -> item (insertion ordered)
        self.order: list[int] = []  # the priorities in use, highest first
        self.where: dict[Hashable, int] = {}  # key -> its priority

    def __len__(self) -> int:
        return len(self.where)

    def __bool__(self) -> bool:
        return bool(self.where)

    def __contains__(self, key) -> bool:
        return key in self.where

    def __setitem__(self, key, item) -> None:
        self.add(key, item)

    def add(self, key, item, first: bool = False) -> None:
        if key in self.where:
            self.pop(key)
        prio = item.priority
        bucket = self.buckets.get(prio)
        if bucket is None:
            bucket = self.buckets[prio] = {}
            self.order.append(prio)
            self.order.sort(reverse=True)
        if first:
            rest = dict(bucket)
            bucket.clear()
            bucket[key] = item
            bucket.update(rest)
        else:
            bucket[key] = item
        self.where[key] = prio

    def move_to_end(self, key, last: bool = True) -> None:
        item = self.pop(key)
        self.add(key, item, first=not last)

    def pop(self, key, default=_MISSING):
        prio = self.where.pop(key, _MISSING)
        if prio is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        bucket = self.buckets[prio]
        item = bucket.pop(key)
        if not bucket:
            del self.buckets[prio]
            self.order.remove(prio)
        return item

    def values(self) -> list:
        """A snapshot, highest priority first (callers pop from ``self`` while walking it)."""
        if len(self.order) == 1:
            return list(self.buckets[self.order[0]].values())
        return [item for prio in self.order for item in self.buckets[prio].values()]
