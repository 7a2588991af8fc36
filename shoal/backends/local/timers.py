"""The local backend's two clocks: ``timeout=`` deadlines and ``retry_delay=`` waits.

``Deadlines`` — a task submitted with ``timeout=`` gets a deadline when its worker says
it STARTED (pump.py ``_handle``); the pump pops the deadlines that passed (``due``), and
for a task still held where it started, kills that worker (``claim_kill``: one kill per
worker; the death then fails the task with ``TaskTimeout``, ``overran``).  A deadline
starts at STARTED, never at submission: a task queued behind others has not overrun.

``Retries`` — a task with ``retries=`` and ``retry_delay=`` keeps its policy and the
attempts so far here (``remember``, ``next_delay``); a failed attempt whose delay is
not 0 waits in a heap (``defer``) until the pump sends it again (``pop_due``).  A task
taken back from a stopped worker gets a new id and its policy follows it (``rename``).

Each owns its state under its own ``Rank.LEAF`` lock (locks.py): callers may hold
``consume_lock`` or ``lock``, and nothing else is taken while one of these is held.
What to do with a due entry (is the task still outstanding, where is it) is the
caller's: these know ids, endpoints and times only.

Rejected: one heap of both kinds (a deadline kills a worker, a due retry sends a task:
every pop would branch, and a task can have both at once); the deadlines under
``lock`` (STARTED is handled under ``consume_lock`` only, and the check needs neither
lock for the heap itself).
"""

from __future__ import annotations

import heapq

from ..._backoff import retry_delay
from . import locks


class Deadlines:
    """``timeout=`` deadlines, from STARTED (any thread; the kills: the pump thread)."""

    def __init__(self):
        self._lock = locks.make("deadlines", locks.Rank.LEAF)
        self._heap: list = []  # (deadline, task id, endpoint it started on)
        self._killed: dict[int, int] = {}  # endpoint killed for an overrun -> the task id

    def started(self, tid: int, ep: int, at: float) -> None:
        """Task ``tid`` started on ``ep`` and must be done by ``at`` (monotonic)."""
        with self._lock:
            heapq.heappush(self._heap, (at, tid, ep))

    def next_due(self) -> float | None:
        """The earliest deadline (None: none).  Read without the lock, as the pump asks
        every round: heapq's C functions run whole under the GIL, so ``heap[0]`` is
        always the earliest entry of the moment."""
        try:
            return self._heap[0][0]
        except IndexError:
            return None

    def due(self, now: float) -> list[tuple[int, int]]:
        """(task id, endpoint) of every deadline up to ``now``, removed."""
        out = []
        with self._lock:
            heap = self._heap
            while heap and heap[0][0] <= now:
                _, tid, ep = heapq.heappop(heap)
                out.append((tid, ep))
        return out

    def claim_kill(self, ep: int, tid: int) -> bool:
        """Whether to kill ``ep`` for ``tid``'s overrun (False: it is being killed already)."""
        with self._lock:
            if ep in self._killed:
                return False
            self._killed[ep] = tid
            return True

    def overran(self, ep: int) -> int | None:
        """At ``ep``'s death: the task it was killed for overrunning (None: none)."""
        with self._lock:
            return self._killed.pop(ep, None)


class Retries:
    """``retry_delay=`` policies and the retries waiting out their delay (any thread)."""

    def __init__(self):
        self._lock = locks.make("retries", locks.Rank.LEAF)
        self._policies: dict[int, list] = {}  # task id -> [retry_delay policy, retries so far]
        self._due: list = []  # heap of (due, task id)

    def remember(self, tid: int, policy) -> None:
        """Task ``tid`` retries after ``policy`` (a number or a ``Backoff``)."""
        with self._lock:
            self._policies[tid] = [policy, 0]

    def any(self) -> bool:
        """Whether some task has a policy (the result path skips ``forget`` when none has)."""
        return bool(self._policies)

    def forget(self, tid: int) -> None:
        """Task ``tid`` settled or was cancelled."""
        if self._policies:
            with self._lock:
                self._policies.pop(tid, None)

    def next_delay(self, tid: int) -> float:
        """Seconds before ``tid``'s next attempt (0: at once; counts the attempt)."""
        with self._lock:
            policy = self._policies.get(tid)
            if policy is None:
                return 0.0
            policy[1] += 1
            what, n = policy
        return retry_delay(what, n, tid)

    def rename(self, old: int, new: int) -> None:
        """Task ``old`` travels on as ``new`` (taken back from a stopped or dead worker)."""
        if self._policies:
            with self._lock:
                if old in self._policies:
                    self._policies[new] = self._policies.pop(old)

    def defer(self, tid: int, at: float) -> None:
        """Send ``tid`` again at ``at`` (monotonic)."""
        with self._lock:
            heapq.heappush(self._due, (at, tid))

    def next_due(self) -> float | None:
        """When the earliest deferred retry is due (None: none waits; read without the
        lock, as ``Deadlines.next_due``)."""
        try:
            return self._due[0][0]
        except IndexError:
            return None

    def pop_due(self, now: float) -> list[int]:
        """The ids of the deferred retries due by ``now``, removed."""
        out = []
        with self._lock:
            due = self._due
            while due and due[0][0] <= now:
                out.append(heapq.heappop(due)[1])
        return out
