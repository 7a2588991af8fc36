"""Who wins a dask task: the node that starts it, or the driver that cancels it.

The stdlib promise: ``Future.cancel()`` returns True only if the call will never run,
False once it runs or ran.  On dask a task passes through the scheduler, a dask worker's
queue, a dask thread (``run_task``) and its node runtime's queue before a shoal worker
starts it, and ``client.cancel`` only *asks* dask to forget it (a dask thread that already
entered ``run_task`` runs on).  So both sides go through one per-process registry, keyed by
the dask key, in each dask worker (``Claims``, one per pilot token)::

    driver: Future.cancel() ─► DaskBackend._probe ─► client.run(cancel_keys, keys)  (every worker)
                                                        │ under the claims lock, per key:
    dask thread: run_task ─► Claims.start(key, submit)  │  absent      -> tombstone, TAKEN
        tombstone?  -> return CANCELLED (never runs)    │  tombstone   -> TAKEN
        else submit to the node runtime, remember its   │  local fut.  -> fut.cancel(): True TAKEN
        local future (or STARTED for a map batch)       │                  (the local backend's own
    run_task returns ─► Claims.finish(key) -> DONE      │                  promise), False STARTED
                                                        │  STARTED/DONE -> STARTED

The driver's ``cancel()`` returns True only when no worker answered STARTED (then it
releases the dask future); otherwise False, and it lifts the tombstones it planted
(``forget_keys``) so a re-run after a worker death is not refused.  A tombstone also stops
a task that arrives at a node after the claim round (still in the scheduler, in transit,
or in the dask worker's own queue): it returns ``CANCELLED`` without running.

The same registry answers ``Future.running()`` (``started``: a shoal worker runs or ran
the key here; nothing changes) and ``pilot.cancel(fut, force=True)`` (node.py
``force_keys``: the node runtime force-cancels the local future, killing and replacing
the shoal worker that runs it).  ``close_node`` drops a pilot's claims with its runtime;
its later tasks return ``CANCELLED`` there without a registry.

Invariants: a key's entry moves only absent -> tombstone (-> absent, ``forget``), absent ->
local future/STARTED -> DONE (-> absent, ``prune``); a local future may be cancelled in place.
All moves happen under ``Claims.lock``, so a start and a cancel of one key on one node are
ordered, and the loser sees the winner's entry.  DONE
entries are dropped once dask no longer holds the key's result on this worker (the driver
then holds the settled future: its ``cancel()`` answers False without asking); a missing
entry with dask's key state ``memory``/``error`` still answers STARTED.

Rejected:
* Asking the node only after ``client.cancel`` (cancel first, then see who ran it): a task
  found running must still deliver its result, but dask has dropped its future by then.
* The driver as the only authority (each node asks "may I run key K?" before starting):
  a round trip per task on the hot path, for an operation (cancel) that is rare.
* A scheduler plugin holding the claims: the scheduler would need shoal importable, which
  a user's ``dask scheduler`` need not have.
* Trusting dask's task state alone (``executing`` = started): a dask thread that entered
  ``run_task`` may still wait in the node runtime's queue, where a cancel can take it back.

Left open (documented in docs/guide.md): a dask worker that *joins* between the claim
round and the scheduler's release never saw the tombstone and could start the task; and a
cancel issued on the client's event loop (a done-callback) cannot wait for a round trip, so
it answers False (the conservative answer: the task may run, its result arrives).
"""

from __future__ import annotations

import enum
import threading
from collections import deque

CANCELLED = "shoal:cancelled-before-start"  # run_task/run_batch's value for a refused key
_PRUNE_EVERY = 64  # finished keys between two prunings of DONE entries


class Fate(enum.Enum):
    """A key's entry in a node's claims (besides the local Future of a queued task)."""

    TOMBSTONE = "tombstone"  # the driver cancelled it before this node started it
    STARTED = "started"  # a map batch runs (no single local future to take back)
    DONE = "done"  # run_task returned: it ran here


class Verdict(enum.Enum):
    TAKEN = "taken"  # will never run on this node
    STARTED = "started"  # runs or ran on this node


class Claims:
    """One pilot's task claims in one dask worker process."""

    def __init__(self):
        self.lock = threading.RLock()
        self.entries: dict[str, object] = {}  # dask key -> local Future | Fate
        self.done: deque[str] = deque()  # DONE keys, oldest first (pruned from the front)
        self.finished = 0

    def start(self, key: str, submit):
        """``run_task``: claim ``key`` and call ``submit()`` (the node runtime's local
        future, or ``Fate.STARTED``); None when the driver cancelled the key first."""
        with self.lock:
            if self.entries.get(key) is Fate.TOMBSTONE:
                return None
            got = self.entries[key] = submit()
            return got

    def finish(self, key: str, held=None) -> None:
        """``run_task`` returned (it ran, or its local future was taken back)."""
        with self.lock:
            if self.entries.get(key) is not Fate.TOMBSTONE:
                self.entries[key] = Fate.DONE
                self.done.append(key)
            self.finished += 1
            if held is not None and self.finished % _PRUNE_EVERY == 0:
                self.prune(held)

    def cancel(self, keys, state=None) -> dict[str, Verdict]:
        """The driver's claim round: each key is taken back (tombstone or the local
        future's own cancel) or reported started.  ``state(key)``: dask's state of the key
        on this worker (None when it holds none), for DONE entries already pruned."""
        out = {}
        with self.lock:
            for key in keys:
                entry = self.entries.get(key)
                if entry is None:
                    if state is not None and state(key) in ("memory", "error"):
                        out[key] = Verdict.STARTED
                        continue
                    self.entries[key] = Fate.TOMBSTONE
                    out[key] = Verdict.TAKEN
                elif entry is Fate.TOMBSTONE:
                    out[key] = Verdict.TAKEN
                elif isinstance(entry, Fate):
                    out[key] = Verdict.STARTED
                else:  # the node runtime's future: its cancel() keeps the local promise
                    out[key] = Verdict.TAKEN if entry.cancel() else Verdict.STARTED
        return out

    def started(self, keys) -> list[str]:
        """``Future.running()``'s question, changing nothing: which of ``keys`` a shoal
        worker runs or ran here (a task queued in the node runtime has not started)."""
        out = []
        with self.lock:
            for key in keys:
                entry = self.entries.get(key)
                if entry is Fate.STARTED or entry is Fate.DONE or (
                        entry is not None and not isinstance(entry, Fate)
                        and (entry.running() or entry.done() and not entry.cancelled())):
                    out.append(key)
        return out

    def forget(self, keys) -> None:
        """Lift tombstones of keys whose cancel was refused elsewhere (they run)."""
        with self.lock:
            for key in keys:
                if self.entries.get(key) is Fate.TOMBSTONE:
                    del self.entries[key]

    def prune(self, held) -> None:
        """Drop DONE entries of keys whose result dask no longer keeps here (``held(key)``
        is false): ``cancel`` then answers from dask's state, or the driver does.  Oldest
        first, stopping at the first key still held (amortised O(1) per finished task;
        entries behind a long-held result wait for it)."""
        with self.lock:
            while self.done and not held(self.done[0]):
                key = self.done.popleft()
                if self.entries.get(key) is Fate.DONE:
                    del self.entries[key]
