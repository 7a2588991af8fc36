"""Answers to the driver's own requests: workers' STATS replies and ``export()``'s loot.

The driver asks every worker for its counters (``stats()``, ``monitor()``) and, as
endpoint 0, for spawned tasks to give another machine (``export()``); the answers
arrive on the pump (pump.py ``_handle``), and the asking thread waits for them here.

State (each part under its own condition, a ``Rank.LEAF`` lock: no other lock is taken
while one is held, locks.py):

* stats: the replies to the current ``stats()`` call (endpoint -> reply), and every
  worker's latest reply for ``monitor()`` (dropped at its death: a monitor shows the
  replacement, not the dead one);
* loot: the TASK messages given to endpoint 0 so far, and the workers yet to answer.
  A LOOT that comes after ``export()`` gave up waiting for its sender is not kept: the
  pump runs it here (``loot_arrived`` says so).

Rejected: the asking thread reading the rings itself (the pump is their one consumer,
with a ``cancel()`` draining in turn: a third consumer would need ``consume_lock`` for
the whole wait); one condition for both (a ``stats()`` waiting would wake on every loot).
"""

from __future__ import annotations

import time

from . import locks


class Replies:
    """What the workers answered to the driver's STATS and STEAL requests (any thread)."""

    def __init__(self):
        self._stats_cond = locks.condition("replies.stats")
        self._stats: dict[int, dict] = {}  # replies to the stats() call under way
        self._latest: dict[int, dict] = {}  # every worker's last reply (monitor())
        self._loot_cond = locks.condition("replies.loot")
        self._loot: list[bytes] = []
        self._loot_wait: set[int] = set()

    # -- STATS ---------------------------------------------------------------------------

    def ask_stats(self) -> None:
        """A ``stats()`` call starts: forget the replies to earlier ones."""
        with self._stats_cond:
            self._stats.clear()

    def stats_arrived(self, ep: int, reply: dict) -> None:
        """Worker ``ep``'s STATS reply (the pump)."""
        reply["at"] = time.time()
        with self._stats_cond:
            self._stats[ep] = reply
            self._latest[ep] = reply
            self._stats_cond.notify_all()

    def wait_stats(self, n: int, timeout: float) -> dict[int, dict]:
        """The replies so far, once ``n`` have come or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        with self._stats_cond:
            while len(self._stats) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._stats_cond.wait(left)
            return dict(self._stats)

    def latest(self, eps) -> dict[int, dict | None]:
        """Each of ``eps``' latest reply (None: none yet)."""
        with self._stats_cond:
            return {ep: self._latest.get(ep) for ep in eps}

    def forget(self, ep: int) -> None:
        """Worker ``ep`` died: its replacement has no reply yet."""
        with self._stats_cond:
            self._latest.pop(ep, None)

    # -- export()'s loot -----------------------------------------------------------------

    def expect_loot(self, eps) -> None:
        """``export()`` asks ``eps`` (STEAL as endpoint 0): wait for each one's LOOT."""
        with self._loot_cond:
            self._loot, self._loot_wait = [], set(eps)

    def loot_arrived(self, victim: int, msgs: list) -> bool:
        """``victim``'s LOOT (the pump).  False: nobody waits for it (``export()`` gave up)."""
        with self._loot_cond:
            if victim not in self._loot_wait:
                return False
            self._loot_wait.discard(victim)
            self._loot.extend(msgs)
            self._loot_cond.notify_all()
            return True

    def collect_loot(self, timeout: float) -> list[bytes]:
        """The loot, once every worker answered or ``timeout`` passed; later LOOTs are not kept."""
        deadline = time.monotonic() + timeout
        with self._loot_cond:
            while self._loot_wait and deadline > time.monotonic():
                self._loot_cond.wait(deadline - time.monotonic())
            got, self._loot, self._loot_wait = self._loot, [], set()
            return got
