"""The dask backend's cancel paths: ``Future.cancel()``/``running()``, ``shutdown(cancel_futures=
True)`` and ``pilot.cancel(fut, force=True)`` (the protocol is claims.py's docstring).

A claim round, on the client's event loop (``_round``)::

    driver ── run_on_scheduler(locate) ─► scheduler: per key, atomically: on no dask worker
       │                                   -> cancelled now (TAKEN); ran -> STARTED; else
       │                                   the address of the one worker processing it
       ├─ client.run(cancel_keys, workers=[that worker]) per holder, concurrently, each
       │     bounded by CLAIM_TIMEOUT_S: TAKEN (tombstone, or the node queue's own cancel)
       │     or STARTED; no answer (stopped, killed) -> STARTED: cancel() says False
       └─ locate again with {key: the worker that took it}: still there -> cancelled now;
             moved (dask's work stealing, or that worker died) -> ask the new holder

So one stopped or dead dask worker delays only the cancels of the tasks it holds, by at
most ``CLAIM_TIMEOUT_S``, and the answer is then False (the task may run; its result, or
dask's re-run elsewhere, arrives).  A worker that answers after the driver gave up takes
nothing: the round carries a deadline (wall clock) and the driver voids it there
(``give_up_round``).  ``running()`` asks nobody: the nodes push STARTED events on the
pilot's topic (node.py ``_watch``) and the future goes RUNNING on arrival.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import cloudpickle

from ...runtime.api import settle
from ...runtime.future import Future
from . import on_scheduler
from .claims import Verdict
from .node import cancel_keys, force_keys, give_up_round

CLAIM_TIMEOUT_S = 5.0  # a cancel() waits this long for the one dask worker holding the task;
#                       no answer (stopped, dead, partitioned): False, the safe answer (claims.py)
SHUTDOWN_WAIT_S = 1.0  # shutdown(cancel_futures=True) waits this long for the round; what is
#                        still undecided then is cancelled in the background once its holder answers
LOCATE_RETRY_S = 0.005  # a key still unknown to the scheduler after the tombstones: ask again
cloudpickle.register_pickle_by_value(on_scheduler)  # the scheduler need not have shoal


class CancelPaths:
    """Mixed into ``DaskBackend`` (which owns ``client``, ``token``, ``_lock``,
    ``_pending``, ``_dask_of``, ``_claimed``, ``_claiming``, ``_withheld``, ``_rounds``,
    ``counters``; ``_cancel`` and ``_on_client_loop``)."""

    def _probe(self, fut: Future, cancel: bool = False) -> bool:
        """``Future.cancel()``'s question: does the task run (or did it)?  Answered by a
        claim round (claims.py) that asks the scheduler where the task is and only the dask
        worker holding it, and makes sure a task it reports not started never starts.
        ``running()``'s: nothing to ask -- the nodes push STARTED (``_on_started``), so
        a started task's future is RUNNING already (a few milliseconds after the start)."""
        dfut = self._dask_of.get(fut)
        if dfut is None or dfut.key in self._claimed:
            return False
        if cancel:
            # a concurrent cancel() may cancel fut during the round (then _claim skips it or
            # its round finds the key gone): not running, the caller's cancel() says True
            return not self._claim([fut]) and not fut.cancelled()
        return False

    def _on_started(self, keys) -> None:
        """The client's event loop: nodes report the keys a shoal worker started."""
        with self._lock:
            futs = [e[0] for e in map(self._pending.get, keys) if e is not None]
        for f in futs:
            f.mark_running()

    def _on_ended(self, keys) -> None:
        """The client's event loop: an attempt of these keys raised.  dask may retry them
        (``retries=``): nothing runs until then, so the future is PENDING again and
        ``cancel()`` asks (it takes a queued retry: True; docs/guide.md).  With no retry
        left the error settles the future next."""
        with self._lock:
            futs = [e[0] for e in map(self._pending.get, keys) if e is not None]
        for f in futs:
            f.mark_pending()

    def _claim(self, futs, wait_s: float = CLAIM_TIMEOUT_S, late=None) -> list[Future]:
        """One claim round for ``futs``: those taken back (they never run; the caller
        cancels them).  The round asks the scheduler where each task is (cancelling, at
        once and atomically, those on no dask worker) and then only the dask worker holding
        each of the others, concurrently, for at most ``CLAIM_TIMEOUT_S``; a worker that
        does not answer (stopped, killed, partitioned) holds its tasks: not taken.
        ``wait_s``: how long this thread waits; ``late(fut)`` is called on the client's
        loop for a future taken back after that (``cancel_pending``; else never)."""
        keys = {}
        for f in futs:
            d = self._dask_of.get(f)
            if d is not None and not f.done():
                keys[d.key] = f
        if not keys:
            return []
        if self.client.status != "running":
            with self._lock:
                self._claimed.update(keys)  # no cluster: nothing of ours runs any more
            return list(keys.values())
        if self._on_client_loop():
            return []  # a round trip from the loop that answers it would deadlock: say started
        late = late or Future.cancel  # taken after this thread stopped waiting: cancelled
        taken: list[Future] = []
        lock = threading.Lock()
        waiting = [True]

        def decided(key: str, took: bool) -> None:
            if not took:
                return
            with self._lock:
                self._claimed.add(key)
            with lock:
                if waiting[0]:
                    taken.append(keys[key])
                    return
            if late is not None:
                late(keys[key])

        with self._lock:
            for k in keys:
                self._claiming[k] = self._claiming.get(k, 0) + 1
        deadline = time.monotonic() + CLAIM_TIMEOUT_S
        try:
            done = asyncio.run_coroutine_threadsafe(self._round(keys, deadline, decided),
                                                    self.client.loop.asyncio_loop)
        except Exception:  # the loop is gone: nothing was asked
            self._unclaim(keys)
            return []
        try:
            done.result(timeout=min(wait_s, CLAIM_TIMEOUT_S) + (1.0 if late is None else 0.0))
        except Exception:  # still deciding (late= takes the rest), or the loop is stuck
            pass
        with lock:
            waiting[0] = False
            return list(taken)

    def _unclaim(self, keys) -> None:
        """A round for ``keys`` ended: outcomes ``_flush`` withheld meanwhile settle now,
        unless the key was taken back (its claimer cancels the future)."""
        held = []
        with self._lock:
            for k in keys:
                n = self._claiming.get(k, 0) - 1
                if n > 0:
                    self._claiming[k] = n
                    continue
                self._claiming.pop(k, None)
                entry = self._withheld.pop(k, None)
                if entry is not None and k not in self._claimed:
                    held.append(entry)
        for f, ok, value, refusal in held:
            if refusal:  # the node took it back, the round then gave up: it never ran
                if _force_cancelled(f):
                    with self._lock:
                        self.counters["cancelled"] += 1
            else:
                self.counters["failed"] += 1
                settle(f, ok, value)

    async def _round(self, keys: dict, deadline: float, decided) -> None:
        """The claim round on the client's loop (claims.py): ``decided(key, taken)`` once
        per key, before ``deadline`` (monotonic); undecided keys then count as started.

        A key the scheduler does not know yet (its submit is still in the client's batched
        stream, which the scheduler reads in order) is claimed on every dask worker, each
        bounded on its own, so it is refused wherever dask sends it; the next ``locate``
        then cancels it if it is on no worker or on one of those that took it."""
        rid = next(self._rounds)
        won: set[str] = set()  # keys this round cancelled (never given up: see the end)
        report = decided

        def decided(key: str, took: bool) -> None:
            if took:
                won.add(key)
            report(key, took)

        claimed: dict[str, list[str]] = {}  # key -> the dask workers that took it back
        asked_all: set[str] = set()
        todo, left_on = list(keys), {}  # left_on: worker -> keys to give up there at the end
        try:
            while todo:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    where = await asyncio.wait_for(self.client.run_on_scheduler(
                        on_scheduler.locate, todo, {k: claimed[k] for k in todo if k in claimed},
                        self.client.id, rid, asynchronous=True), left)
                except Exception:  # the scheduler does not answer: nothing decided
                    break
                workers = where.pop(on_scheduler.WORKERS, [])
                ask: dict[str, list[str]] = {}
                todo, unknown = [], []
                for key, got in where.items():
                    if got in (on_scheduler.TAKEN, on_scheduler.STARTED):
                        decided(key, got == on_scheduler.TAKEN)
                    elif got == on_scheduler.MISSING:
                        verdict = self._missing(key, keys[key])
                        if verdict is not None:
                            decided(key, verdict)
                        elif key in asked_all:
                            todo.append(key)  # tombstones everywhere: wait for the scheduler
                        else:
                            unknown.append(key)
                    else:
                        ask.setdefault(got, []).append(key)
                for key in unknown:
                    asked_all.add(key)
                    for addr in workers:
                        ask.setdefault(addr, []).append(key)
                if not ask:
                    if todo:
                        await asyncio.sleep(LOCATE_RETRY_S)
                    continue
                until = time.time() + max(0.0, deadline - time.monotonic() - 0.5)
                replies = await asyncio.gather(*(
                    self._ask(addr, ks, rid, until, deadline) for addr, ks in ask.items()))
                undecided = dict.fromkeys(unknown, True)  # True: no worker said STARTED
                for addr, ks, rep in replies:
                    if not isinstance(rep, dict):  # no answer: the task may run there
                        left_on.setdefault(addr, []).extend(ks)
                        for k in ks:
                            if k not in undecided:
                                decided(k, False)
                        continue
                    for k in ks:
                        if rep.get(k) == Verdict.TAKEN.value:
                            claimed.setdefault(k, []).append(addr)
                            if k not in undecided:
                                todo.append(k)  # confirmed by the scheduler next time round
                        elif k in undecided:
                            undecided[k] = False
                        else:
                            decided(k, False)
                for k, open_ in undecided.items():
                    if open_:
                        todo.append(k)
                    else:
                        decided(k, False)
            for k in todo:
                decided(k, False)
            for k, addrs in claimed.items():
                # taken there, then started elsewhere, or undecided: give up (the node runs
                # it after all).  Not ``self._claimed``: a concurrent cancel() of the same
                # future empties that, and a give_up of a key this round cancelled at the
                # scheduler would revive a task whose cancel() said True.
                if k not in won:
                    for addr in addrs:
                        left_on.setdefault(addr, []).append(k)
        finally:
            self._unclaim(keys)
        for addr, ks in left_on.items():
            self.client.loop.add_callback(self._give_up, addr, rid, ks)

    def _missing(self, key: str, fut: Future) -> bool | None:
        """A key the scheduler does not know: taken (another round took it back), started
        (it finished, or dask dropped it), or None (its submit has not arrived yet)."""
        if key in self._claimed or fut.cancelled():
            return True
        entry = self._pending.get(key)
        if entry is not None and entry[1].status == "cancelled" and getattr(
                entry[1]._state.exception, "reason", None) == on_scheduler.REASON:
            # another round's locate cancelled it, and dask's report outran that round's
            # reply (different comms): taken, never runs.  Before: False here,
            # while the other thread's cancel() said True for the same future.
            return True
        if entry is None or entry[1].status != "pending":
            return False
        return None

    async def _ask(self, addr: str, keys: list[str], rid: int, until: float, deadline: float):
        """(addr, keys, the claims' reply there or None) -- the one holder's part."""
        try:
            reps = await asyncio.wait_for(self.client.run(
                cancel_keys, self.token, keys, rid, until, workers=[addr], on_error="return",
                asynchronous=True), max(0.01, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - timed out, or the worker left
            return addr, keys, None
        return addr, keys, reps.get(addr)

    async def _give_up(self, addr: str, rid: int, keys: list[str]) -> None:
        try:
            await self.client.run(give_up_round, self.token, rid, keys, workers=[addr],
                                  on_error="ignore", asynchronous=True)
        except Exception:  # noqa: BLE001 - the worker is gone: nothing of the round is left
            pass

    def _on_client_loop(self) -> bool:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return running is getattr(self.client.loop, "asyncio_loop", running)

    def cancel_many(self, futs: list[Future]) -> list[bool]:
        """``Pilot.cancel_many``: ``Future.cancel()``'s answers, with one claim round for
        all the pending ones (instead of one round trip each)."""
        mine = [f for f in futs if f._state == "PENDING" and f._prober is not None
                and self._dask_of.get(f) is not None]  # another pilot's: its own cancel()
        asked = set(map(id, mine))
        self._claim(mine)  # the taken ones are in _claimed: their cancel() asks nobody
        out = []
        for f in futs:
            # _claimed first: a concurrent cancel() sets CANCELLED before it drops the key
            # from _claimed, so reading the state first could see PENDING and then no key
            taken = id(f) not in asked or self._dask_of[f].key in self._claimed
            if not taken and f._state == "PENDING":
                out.append(False)  # the round found it started (or could not ask): runs
            else:
                out.append(f.cancel())
        return out

    def cancel_pending(self) -> int:
        """``shutdown(cancel_futures=True)``: cancel every task no shoal worker started, in
        one claim round (claims.py); running tasks finish.  Waits at most
        ``SHUTDOWN_WAIT_S`` (the stdlib's ``shutdown(wait=False)`` does not block): the
        tasks of a dask worker that has not answered by then are cancelled when it does,
        if it had not started them.  Returns how many were cancelled by then."""
        with self._lock:
            futs = [f for f, _ in self._pending.values()]
        taken = self._claim(futs, SHUTDOWN_WAIT_S, late=Future.cancel)
        return sum(f.cancel() for f in taken)

    def cancel_children(self, fut: Future) -> None:
        """No-op: a task's spawned children live in its node's runtime, which the driver
        does not address by task id; they finish with their parent."""

    def force_cancel(self, fut: Future) -> bool:
        """``pilot.cancel(fut, force=True)``: cancel ``fut`` even while a shoal worker runs
        it, by killing and replacing that worker on its node (the local backend's force
        cancel, there; other tasks that worker ran get ``WorkerLost`` or their retries).
        False for a task that finished, or a map batch (no single task to stop)."""
        if fut.cancel():
            return True
        dfut = self._dask_of.get(fut)
        if (fut.done() or dfut is None or self.client.status != "running"
                or self._on_client_loop()):
            return False
        with self._lock:
            self._claimed.add(dfut.key)  # its run_task returns CANCELLED: _flush cancels it
        replies = {}
        try:  # only the dask worker the task is processing on (a stopped other one: no wait)
            holder = self.client.run_on_scheduler(on_scheduler.where, [dfut.key],
                                                  callback_timeout=CLAIM_TIMEOUT_S).get(dfut.key)
            if holder is not None:
                replies = self.client.run(force_keys, self.token, [dfut.key], workers=[holder],
                                          on_error="return", callback_timeout=CLAIM_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - no answer: not stopped
            replies = {}
        if not any(isinstance(r, list) and dfut.key in r for r in replies.values()):
            with self._lock:
                self._claimed.discard(dfut.key)
            return False
        if not _force_cancelled(fut):  # finished meanwhile
            return fut.cancelled()
        self._cancel(fut)
        return True


def _force_cancelled(fut: Future) -> bool:
    """Cancel ``fut`` also when RUNNING (``Future.cancel`` refuses that); False if it
    finished first."""
    with fut._condition:
        if fut._state == "RUNNING":
            fut._state = "PENDING"
    if not cf.Future.cancel(fut):
        return False
    try:
        fut.set_running_or_notify_cancel()  # CANCELLED -> CANCELLED_AND_NOTIFIED: wait() sees it
    except RuntimeError:  # another thread notified it first
        pass
    return True
