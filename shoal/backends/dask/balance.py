"""Spawned work between machines: the driver's balancer for a dask pilot.

Inside a node, idle shoal workers steal from busy ones through the rings.
Between nodes the balancer does it one level up, through dask::

    driver, every BALANCE_S while the pilot has tasks in flight:
      client.run(node_load) ─► plan(): a node whose shoal workers are all hungry
                                (or that runs none) and the busiest one, unless a
                                task of ours waits in dask's queue (dask will hand
                                it to the idle node itself)
      client.run(export_spawned, workers=[busy]) ─► the busy node's runtime steals
          as endpoint 0: half of every shoal worker's deque, oldest first (the
          biggest subtrees); tasks carrying this node's shared memory stay there
      client.run(run_lent, workers=[idle]) for each task lent: the idle node's
          runtime runs it (not as a dask task: the lender's root task, waiting
          in a join for it, may hold the only dask thread there is) and
          publishes the result on the pilot's topic ─► driver
      client.run(deliver_result, workers=[busy]) ─► the RESULT goes through the
          busy node's rings to the task's owner, whose ``shoal.spawn`` future
          (maybe waited on in a join) completes

A node that had nothing to give is left alone for a while (backoff doubling
up to ``MAX_BACKOFF_S``), so a node busy with one long task is not asked 50
times a second.  A lent task that fails travels back as its exception; one
whose borrower leaves the cluster is lent again (to another node, or back to
its lender); one whose lender died has nobody waiting (dask re-runs the
lender's root task, which spawns anew).

Rejected: nodes stealing from each other directly (a dask worker cannot
address another's shoal runtime; dask's comms go through the scheduler or a
client anyway); the idle node asking (it would need a client of its own in
every dask worker, and the driver already sees who is idle); pushing work
before anyone is idle (every lent task costs milliseconds of dask, worth it
only for work that would otherwise wait).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

from .node import deliver_result, export_spawned, node_load, run_lent

BALANCE_S = 0.02  # the balancer's period while tasks are in flight
MAX_BACKOFF_S = 1.0  # the longest a node that gave nothing is left alone


def plan(load: dict[str, tuple[int, int]], ours_waiting: int, quiet_until: dict[str, float],
         now: float) -> tuple[str, list[str]] | None:
    """Pure policy: ``(victim, idle dask workers)`` to move work from, to; or None.

    ``load``: (shoal workers, hungry ones) of each dask worker's node runtime
    ((0, 0): none runs there); ``ours_waiting``: this pilot's tasks not on any
    worker yet (dask will hand them to the idle ones itself); ``quiet_until``:
    workers not to ask before that time.  A node whose workers wait in joins for
    work lent elsewhere is hungry, not busy: that is what dask's own view misses.
    """
    idle = sorted(a for a, (n, hungry) in load.items() if hungry == n)
    if not idle or ours_waiting > 0:
        return None
    busy = [a for a, (n, hungry) in load.items()
            if hungry < n and quiet_until.get(a, 0.0) <= now]
    if not busy:
        return None
    victim = max(busy, key=lambda a: (load[a][0] - load[a][1], a))
    return victim, idle


class Balancer:
    """One per dask pilot: a thread that runs while the pilot has tasks in flight."""

    def __init__(self, backend):
        self.backend = backend
        self.lent: dict[int, list] = {}  # lent id -> [lender, task id, borrower, item]
        self.done: queue.SimpleQueue = queue.SimpleQueue()  # (lent id, ok, value blob)
        self.quiet: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.moved = 0
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        backend.hub.on_lent = self._on_lent

    def kick(self) -> None:
        """Tasks are in flight (any thread): make sure the balancer runs."""
        with self._cond:
            if self._stop:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="shoal-dask-balancer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(10)
        self.lent.clear()

    def _on_lent(self, msg: dict) -> None:
        """A lent task finished (the client's event loop): the loop hands it back."""
        self.done.put((msg["lent"], msg["ok"], msg["value"]))
        with self._cond:
            self._cond.notify()

    def _busy(self) -> bool:
        return bool(self.backend.outstanding or self.lent)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._busy():
                    self._cond.wait(1.0)
                if self._stop:
                    return
            try:
                self.backend.watch_resources()  # resources= no worker offers any more
            except Exception:  # pragma: no cover - the cluster is going away
                pass
            try:
                self._settle()
                self._balance()
            except Exception:  # the cluster is going away; the pilot reports that itself
                pass
            time.sleep(BALANCE_S)

    def _balance(self) -> None:
        client, b = self.backend.client, self.backend
        if len(client.scheduler_info().get("workers", {})) < 2:
            return  # one machine: nothing to move (one small round trip, not three)
        waiting = max(0, b.outstanding - sum(len(k) for k in client.processing().values()))
        if waiting:
            return
        load = {a: tuple(v) for a, v in client.run(node_load, b.token, on_error="return").items()
                if isinstance(v, (tuple, list))}
        self._relend(set(load))
        now = time.monotonic()
        move = plan(load, waiting, self.quiet, now)
        if move is None:
            return
        victim, idle = move
        got = client.run(export_spawned, b.token, workers=[victim], on_error="return").get(victim)
        if not isinstance(got, list) or not got:
            back = self.backoff[victim] = min(MAX_BACKOFF_S, 2 * self.backoff.get(victim, BALANCE_S))
            self.quiet[victim] = now + back
            return
        self.backoff.pop(victim, None)
        self.quiet.pop(victim, None)
        for i, item in enumerate(got):
            lid = next(self._ids)
            self.lent[lid] = [victim, item[0], idle[i % len(idle)], item]
            self._send(lid)
        self.moved += len(got)

    def _send(self, lid: int) -> None:
        _, _, borrower, (_, blob, body, inline) = self.lent[lid]
        self.backend.client.run(run_lent, self.backend.cfg, lid, blob, body, inline,
                                workers=[borrower], wait=False, on_error="ignore")

    def _relend(self, alive: set) -> None:
        """Lent tasks whose borrower is gone: to another machine (the lender, at worst)."""
        for lid, entry in list(self.lent.items()):
            lender, _, borrower, _ = entry
            if borrower in alive:
                continue
            if lender not in alive:
                del self.lent[lid]  # nobody waits for it any more
                continue
            entry[2] = min(alive)
            self._send(lid)

    def _settle(self) -> None:
        client, token = self.backend.client, self.backend.token
        while True:
            try:
                lid, ok, blob = self.done.get_nowait()
            except queue.Empty:
                return
            entry = self.lent.pop(lid, None)
            if entry is not None:
                client.run(deliver_result, token, entry[1], ok, blob, workers=[entry[0]],
                           on_error="ignore")
