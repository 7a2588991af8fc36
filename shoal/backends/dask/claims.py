"""Who wins a dask task: the node that starts it, or the driver that cancels it.

The stdlib promise: ``Future.cancel()`` returns True only if the call will never run,
False once it runs or ran.  On dask a task passes through the scheduler, a dask worker's
queue, a dask thread (``run_task``) and its node runtime's queue before a shoal worker
starts it, and ``client.cancel`` only *asks* dask to forget it (a dask thread that already
entered ``run_task`` runs on).  So the driver asks the scheduler where the task is, and
then the one dask worker holding it, through a per-process registry keyed by the dask key
in each dask worker (``Claims``, one per pilot token)::

    driver: Future.cancel() ─► cancel.py _round
      1 run_on_scheduler(locate): per key, atomically (the scheduler's loop is one thread):
          on no worker (queued, waiting, no-worker) -> cancelled there now: TAKEN
          ran (erred)                               -> STARTED
          processing on W, or in memory on W        -> ask W (a value in memory may be
                                                       the refusal of another round's tombstone):
      2 client.run(cancel_keys, workers=[W])          │ under the claims lock, per key:
    dask thread: run_task ─► Claims.start(key, submit)  │  absent      -> tombstone, TAKEN
        tombstone?  -> return CANCELLED (never runs)    │  tombstone   -> TAKEN
        else submit to the node runtime, remember its   │  local fut.  -> fut.cancel(): True TAKEN
        local future (or STARTED for a map batch)       │                  (the local backend's own
    run_task returns ─► Claims.finish(key) -> DONE      │                  promise), False STARTED
                                                        │  STARTED/DONE -> STARTED
      3 locate again with {key: W}: still processing on W (or in memory there: the refusal)
          -> cancelled at the scheduler now: TAKEN; moved (dask's work stealing took it from
          W's queue, or W died and dask re-runs it) -> ask the new holder (back to 2)

``cancel()`` returns True only for TAKEN.  W not answering within ``CLAIM_TIMEOUT_S``
(stopped, killed mid-round, partitioned) means STARTED: False, the safe answer (the task
may run; its result or dask's re-run elsewhere arrives).  Only W is asked, so a stopped
worker delays only the cancels of the tasks it holds.  A round that reaches W after the
driver gave up takes nothing: it carries a deadline (W's wall clock), and the driver
sends ``give_up`` (the round id is void there, its tombstones lifted; either message may
arrive first).

``Future.running()`` asks nobody: node.py's watcher publishes STARTED on the pilot's topic
once a shoal worker starts a node-queued task, and the driver marks the future RUNNING
(a few milliseconds after the start; a task that finishes first never shows RUNNING).
``pilot.cancel(fut, force=True)`` asks only the holder too (node.py ``force_keys``: the
node runtime force-cancels the local future, killing and replacing the shoal worker that
runs it).  ``close_node`` drops a pilot's claims with its runtime; its later tasks return
``CANCELLED`` there without a registry.

Invariants: a key's entry moves only absent -> tombstone (-> absent, ``forget``), absent ->
local future/STARTED -> DONE (-> absent, ``prune``); a local future may be cancelled in place.
All moves happen under ``Claims.lock``, so a start and a cancel of one key on one node are
ordered, and the loser sees the winner's entry.  The scheduler cancels a key only in the
same event-loop step in which it saw the key on no worker, or still on the worker that took
it back.  DONE entries are dropped once dask no longer holds the key's result on this
worker (the driver then holds the settled future: its ``cancel()`` answers False without
asking); a missing entry with dask's key state ``memory``/``error`` still answers STARTED.

Rejected:
* Asking every dask worker in one ``client.run`` round with tombstones everywhere (the
  previous design): one stopped worker made every ``cancel()`` and ``running()`` wait the
  round's 30 s timeout, and a worker killed during the round counted as "not holding", so
  ``cancel()`` said True for a started task whose re-run elsewhere then met a tombstone.
* Asking the node only after ``client.cancel`` (cancel first, then see who ran it): a task
  found running must still deliver its result, but dask has dropped its future by then.
* The driver as the only authority (each node asks "may I run key K?" before starting):
  a round trip per task on the hot path, for an operation (cancel) that is rare.
* A scheduler plugin holding the claims: the scheduler would need shoal importable, which
  a user's ``dask scheduler`` need not have (``on_scheduler.locate`` travels by value).
* Trusting dask's task state alone (``executing`` = started): a dask thread that entered
  ``run_task`` may still wait in the node runtime's queue, where a cancel can take it back.
* ``running()`` as a round trip (~1.2 ms a call, every dask worker asked): a poll over
  thousands of futures took seconds.

Left open (documented in docs/guide.md): a cancel issued on the client's event loop (a
done-callback) cannot wait for a round trip, so it answers False (the conservative answer:
the task may run, its result arrives).

A holder that takes a node-queued task back and answers after the driver gave up (its event
loop stalled between taking and replying: a GC pause, a SIGSTOP, a slow link; or its clock
runs behind the driver's by more than the 0.5 s margin) must not leave that False a lie: its
``run_task`` does not return ``CANCELLED`` at once but waits (``settle_taken``) until either
dask releases the key there (the driver confirmed the take at the scheduler: cancelled) or
the driver's ``give_up`` names the round (the task is submitted to the node runtime again and
runs).  Every round ends in one of the two for each key it took (cancel.py ``_round``), and a
driver that vanishes releases its keys.  The wait is bounded: ``VERDICT_WAIT_S`` past the
round's deadline with neither (a ``give_up`` lost while the worker stays connected, or a
release still on its way after a SIGSTOP), the holder asks the scheduler to decide
(on_scheduler.py ``arbitrate``, atomic as ``locate``): a round that confirmed has cancelled
the key there (CANCELLED); otherwise the rounds are void there too, their confirming
``locate`` takes nothing and their ``cancel()`` says False, and the task runs.  Before, the task never ran and the future
ended CANCELLED after ``cancel()`` had said False (tests/attack/test_contract_dask.py).
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque

CANCELLED = "shoal:cancelled-before-start"  # run_task/run_batch's value for a refused key
_PRUNE_EVERY = 64  # finished keys between two prunings of DONE entries
_VOID_KEEP = 4096  # abandoned round ids remembered (a round arrives within seconds, or never)
VERDICT_WAIT_S = 5.0  # a taken task waits this long past its round's deadline for the
#                      driver's verdict, then asks the scheduler to decide (``settle_taken``)


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
        self.void: set[int] = set()  # claim rounds the driver gave up on (they change nothing)
        self.voided: deque[int] = deque()  # the same, oldest first (bounded)
        # key -> {round id: that round's deadline (driver's wall clock)} of the rounds that
        # took its queued local future
        self.taken: dict[str, dict[int, float]] = {}
        self.revive: set[str] = set()  # such keys whose round the driver gave up on: re-submit
        self.changed = threading.Condition(self.lock)  # taken/revive moved (run_task waits)

    def start(self, key: str, submit):
        """``run_task``: claim ``key`` and call ``submit()`` (the node runtime's local
        future, or ``Fate.STARTED``); None when the driver cancelled the key first."""
        with self.lock:
            if self.entries.get(key) is Fate.TOMBSTONE:
                return None
            got = self.entries[key] = submit()
            return got

    def finish(self, key: str, held=None, failed: bool = False) -> None:
        """``run_task`` returned (it ran, or its local future was taken back) or raised
        (``failed``: dask may retry it, here or elsewhere; until then dask's state of the
        key, ``error``, answers STARTED, and a queued retry can be taken back like any
        task: docs/guide.md, retries and cancel)."""
        with self.lock:
            entry = self.entries.get(key)
            if failed and entry is not None and not isinstance(entry, Fate):
                del self.entries[key]
            elif entry is not None and not isinstance(entry, Fate) and entry.cancelled():
                # taken back from the node queue and not revived: it never ran here.  A
                # round arriving later must hear TAKEN (DONE answered STARTED, and a
                # concurrent cancel() of the same future said False)
                self.entries[key] = Fate.TOMBSTONE
            elif entry is not Fate.TOMBSTONE:
                self.entries[key] = Fate.DONE
                self.done.append(key)
            self.finished += 1
            if held is not None and self.finished % _PRUNE_EVERY == 0:
                self.prune(held)

    def cancel(self, keys, state=None, round_id: int | None = None,
               until: float | None = None) -> dict[str, Verdict]:
        """The driver's claim round: each key is taken back (tombstone or the local
        future's own cancel) or reported started.  ``state(key)``: dask's state of the key
        on this worker (None when it holds none), for DONE entries already pruned.  A round
        the driver already gave up on (``void``: it answered False meanwhile) takes nothing.
        ``until``: the round's deadline (the driver's wall clock), for ``settle_taken``."""
        out = {}
        with self.lock:
            if round_id is not None and round_id in self.void:
                return {key: Verdict.STARTED for key in keys}
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
                elif entry.cancel():  # the node runtime's future: its cancel() keeps the local
                    out[key] = Verdict.TAKEN  # promise; run_task waits for the round's end
                    if round_id is not None:
                        self.taken.setdefault(key, {})[round_id] = (
                            time.time() if until is None else until)
                else:
                    out[key] = Verdict.STARTED
        return out

    def settle_taken(self, key: str, wanted, arbitrate=None, poll_s: float = 0.02) -> bool:
        """``run_task`` whose local future a claim round cancelled: True when every round
        that took it was given up (the driver answered False: the caller submits the task
        again, it runs), False when the cancel stands (dask released the key here:
        ``wanted()`` turned false, as the driver's confirming ``locate`` cancelled it at the
        scheduler; or a take no round owns, such as a force cancel).  Waits for whichever
        comes first; a round that confirmed never sends ``give_up`` for the key, so a
        revival cannot outrun its release.

        Bounded: ``VERDICT_WAIT_S`` past the latest deadline of the rounds that took it (a
        lost ``give_up``; a release still on its way), ``arbitrate(key, round ids)`` asks
        the scheduler, which decides atomically (on_scheduler.py ``arbitrate``): True, the
        rounds are void there too, so their confirming ``locate`` can no longer take the
        key (their ``cancel()`` says False) and the task runs; False, a round confirmed."""
        not_before = 0.0
        with self.lock:
            while True:
                if key in self.revive:
                    self.revive.discard(key)
                    return True
                rounds = self.taken.get(key)
                if rounds is None:
                    return False
                if not wanted():
                    del self.taken[key]
                    return False
                if arbitrate is not None and time.time() > max(
                        max(rounds.values()) + VERDICT_WAIT_S, not_before):
                    ids = sorted(rounds)
                    self.lock.release()  # a round trip to the scheduler: others may go on
                    try:
                        run = arbitrate(key, ids)
                    except Exception:  # noqa: BLE001 - no scheduler now: ask again later
                        run, not_before = None, time.time() + VERDICT_WAIT_S
                    finally:
                        self.lock.acquire()
                    if run is False:
                        self.taken.pop(key, None)
                        return False
                    if run:
                        for rid in ids:  # as the lost give_up would have
                            self.give_up(rid, [key])
                        continue  # revived, unless a newer round took it meanwhile
                self.changed.wait(poll_s)

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

    def give_up(self, round_id: int, keys) -> None:
        """The driver gave up waiting for round ``round_id`` (this worker did not answer in
        time) and answered False: if the round has not run here yet it never takes
        anything; if it has, its tombstones are lifted and the local futures it cancelled
        are submitted again by their ``run_task`` (``settle_taken``)."""
        with self.lock:
            self.void.add(round_id)
            self.voided.append(round_id)
            while len(self.voided) > _VOID_KEEP:
                self.void.discard(self.voided.popleft())
            for key in keys:  # a queued local future it took back runs after all, unless
                rounds = self.taken.get(key)  # another round took it too (it may confirm)
                if rounds is not None and round_id in rounds:
                    del rounds[round_id]
                    if not rounds:
                        del self.taken[key]
                        self.revive.add(key)
            self.changed.notify_all()
            self.forget(keys)

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
