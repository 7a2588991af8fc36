"""A dask worker that stopped answering: the pilot treats it as lost within a bound.

A dask worker whose host crashed is noticed at once (its TCP connections reset).  One whose
host is cut off (a partition, a hung machine, a stopped process) is not: its connections
stay open and silent, and dask's scheduler waits for ``distributed.scheduler.worker-ttl``
(5 minutes by default, a setting of the *scheduler*, which a user of someone else's
cluster cannot change) before it gives the worker's tasks to others.  Until then every
future of a task there waits.

So while a dask pilot has tasks in flight, a thread of the pilot asks the scheduler every
``silent_after_s / 4`` seconds (at least every ``MIN_EVERY_S``) which workers have not
been heard from (no heartbeat, ``WorkerState.last_seen``) for ``silent_after_s`` seconds
(``Pilot(backend="dask", silent_after_s=30)``, the default; ``None`` turns it off) and has
the scheduler remove them, as its own worker-ttl check does: their running and queued tasks
go to other workers (dask counts the loss against ``allowed-failures``, after which the
future gets ``WorkerLost``).  A removed worker that is heard from again is unknown to the
scheduler: what it sends for the old tasks is dropped there (a key has one result, the
re-run's), and dask's worker closes itself and its nanny starts a fresh one, which joins
as a new worker (the "fenced, then rejoins" outcome).  Time from the cut to the re-run:
``silent_after_s`` plus at most one period plus the scheduler's reaction.

Rejected: a heartbeat of shoal's own to each node (dask's already exists and the scheduler
keeps its time); closing the worker from the driver (it cannot be reached: that is the
point); lowering dask's worker-ttl (a scheduler setting; users often do not own it).

``silent`` is the pure policy; ``evict_silent`` runs on the scheduler (stdlib only, pickled
by value like on_scheduler.py, so a user's scheduler need not have shoal installed).
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import cloudpickle

log = logging.getLogger("shoal.dask")

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the scheduler need not have shoal

DEFAULT_SILENT_AFTER_S = 30.0
MIN_EVERY_S = 0.5  # the shortest period between two asks
REASON = "shoal-silent-worker"


def silent(last_seen: dict[str, float], now: float, after_s: float) -> list[str]:
    """The addresses whose last heartbeat is more than ``after_s`` seconds before ``now``."""
    return sorted(a for a, seen in last_seen.items() if now - seen > after_s)


def period(after_s: float) -> float:
    """How often the driver asks, for a bound of ``after_s`` seconds."""
    return max(MIN_EVERY_S, after_s / 4)


async def evict_silent(after_s: float, dask_scheduler=None) -> list[tuple[str, str, float]]:
    """(scheduler) Remove the workers not heard from for ``after_s`` s; what was removed as
    ``(address, name, seconds silent)``."""
    sched = dask_scheduler
    now = time.time()
    seen = {addr: ws.last_seen for addr, ws in list(sched.workers.items())}
    out = []
    for addr in silent(seen, now, after_s):
        ws = sched.workers.get(addr)
        if ws is None:
            continue
        out.append((addr, str(ws.name), round(now - seen[addr], 1)))
        await sched.remove_worker(address=addr, stimulus_id=f"{REASON}-{now}", close=True)
    return out


class LivenessWatch:
    """The driver's side: a thread of its own (the balancer's calls to every node block on a
    silent one for the TCP timeout, ~30 s, so the check cannot live there) that asks the
    scheduler once a ``period`` while ``busy()`` says the pilot has tasks out.
    ``evicted``: what it removed, with when."""

    def __init__(self, client, after_s: float | None, busy=None):
        if after_s is not None and (isinstance(after_s, bool) or not isinstance(after_s, (int, float))
                                    or not after_s > 0):
            raise ValueError(f"silent_after_s must be a number of seconds > 0 or None, "
                             f"got {after_s!r}")
        self.client, self.after_s, self.busy = client, after_s, busy
        self.evicted: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.after_s is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="shoal-dask-liveness",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(period(self.after_s)):
            if self.busy is not None and not self.busy():
                continue
            try:
                self.watch()
            except Exception:  # noqa: BLE001 - the cluster is going away; the pilot says so
                pass

    def watch(self) -> None:
        """Ask the scheduler once (the thread's step)."""
        gone = self.client.run_on_scheduler(evict_silent, self.after_s)
        for addr, name, quiet in gone or ():
            log.warning("dask worker %s (%s) silent for %.1f s (silent_after_s=%s): removed; its "
                        "tasks run elsewhere", addr, name, quiet, self.after_s)
            self.evicted.append({"address": addr, "name": name, "silent_s": quiet,
                                 "at": time.time()})
