"""Tasks queued on a stopped (or dead) worker: taken back and re-placed on live workers.

The same handshake (``_re_place``) re-places the tasks a *dead* worker held queued
(lifecycle.py) and those a late MOVED names a dead thief for (pump.py): the dead one
may have handed them to a thief just before it died, its MOVED lost in its outbox, and
a blind re-send ran each twice (tests/runtime/test_worker_death.py).  A task a live
worker already runs stays there; one queued there is dropped there and runs under its
new id once.

A SIGSTOPped worker (or one held in a debugger) reads nothing: the tasks queued in its
ring or deque neither run nor time out (a deadline starts at STARTED, which it never
sends), and the live workers cannot steal them (a steal needs the victim to answer).
So once the health check (``runtime/health.py``, every ``_LIVENESS_S`` with work
outstanding) has seen a worker stopped, the pump:

* places no new task on it while some worker is live and not stopped (``_choose_usable``);
* takes back every task queued to it that it has not started (``_take_back_from``) and
  sends it to a live worker; the *same future* settles with the task's result.

Taking back is ``cancel()``'s handshake (cancel.py) under the task's old id, and the
task travels on under a new id:

1. under ``lock``: the stopped worker's status slots are read first (frozen while it
   is stopped; a task it has claimed or runs stays with it); a task still in the
   driver's outbox is withdrawn; CANCEL_IF_QUEUED(old ids) goes to *every* worker
   (a thief may hold one before the driver heard of the steal) ahead of any backlog;
2. the slots are read (``_run_state``: Dekker, as for ``cancel()``), and the rings are
   drained up to their marks: a task that had finished is then FINISHED;
3. under ``lock``: every task still pending, not running anywhere, and not being
   cancelled by a user meanwhile, gets a new id (``future.task_id`` too) and is
   dispatched.  The old id can never run: every worker was told to drop it before its
   slots were read, so a worker that resumes drops it (exactly once holds; a MOVED for
   it later is answered with a CANCEL, ``recently_cancelled``, recent.py).

Why a new id rather than the old one: the cancel must reach every worker, thieves
included, and the re-placed copy must not meet it.  ``_probe`` re-reads
``future.task_id`` under ``lock``, so a concurrent ``cancel()`` follows the task.

Rejected: counting a queued task's ``timeout=`` from submission while its worker is
stopped (the task would fail although a live worker could run it, and a task without
``timeout=`` would still hang); killing the stopped worker (a debugger's target, or a
job-control stop the user means to continue, would be destroyed).

What remains: a task the stopped worker had *started* stays with it (``timeout=``
bounds it: its deadline runs from STARTED and kills the worker); with every worker
stopped nothing can move, and tasks wait until SIGCONT (with ``timeout=`` a started
one is bounded, a queued one is not).  A worker seen running again is used again.
"""

from __future__ import annotations

from ...runtime import wire
from ...runtime.wire import Kind
from ...runtime.worker import STATUS_DEPTH, STATUS_RUNNING, STATUS_SLOTS

_PENDING = "PENDING"
_UNSETTLED = (_PENDING, "RUNNING")  # RUNNING: a probe's word, re-checked in the slots here
_IDS_PER_MESSAGE = 256
_pack_task = wire.TASK_HDR.pack
_unpack_task = wire.TASK_HDR.unpack_from


class TakingBack:
    """``LocalBackend``'s handling of stopped workers (a mixin: the state is the backend's)."""

    def _avoid(self, ep: int) -> bool:
        """Whether nothing should be placed on ``ep`` now (down or stopped)."""
        return ep in self.down or ep in self.health.stopped

    def _choose_usable(self, w: int) -> int:
        """Placement chose worker ``w`` (index), which is stopped: the least loaded usable
        worker instead, or ``w`` when every live worker is stopped (it waits for SIGCONT)."""
        usable = self._usable()
        if not usable:
            return w
        return min(usable, key=lambda ep: self.placement.load(ep - 1)) - 1

    def _usable(self) -> list[int]:
        """Endpoints with a running, not stopped, process."""
        stopped, down = self.health.stopped, self.down
        return [ep for ep in self.endpoints if ep not in down and ep not in stopped]

    def _take_back_all(self) -> int:
        """Take back what the stopped workers hold queued (the pump, after a health check)."""
        if not self.health.stopped or self.closing or not self._usable():
            return 0
        return sum(self._take_back_from(ep) for ep in list(self.health.stopped))

    def _take_back_from(self, ep: int) -> int:
        """Re-place the tasks queued to stopped worker ``ep`` that it has not started."""
        with self.lock:
            if self.closing or ep not in self.health.stopped:
                return 0
            held = self._slot_ids(ep)
            cands = [t for t in self.tasks.values()
                     if t.where == ep and not t.cancelling and t.future._state == _PENDING
                     and t.future.task_id not in held]
        moved = self._re_place(cands)
        self.taken_back += moved or 0
        return moved or 0

    def _re_place(self, cands: list) -> int | None:
        """Re-place ``cands`` (tasks whose holder is stopped or dead, as far as the driver
        knows) without ever running one twice: cancel()'s handshake under the old ids,
        then a new id for each that no worker runs.  A task another worker got meanwhile
        (stolen before the driver heard: a MOVED still on its way, or lost with a dead
        victim) and already runs there stays there (``where`` follows it); one queued
        there is dropped there.  Returns how many were re-placed; None when a worker's
        ring had no room for the cancels (nothing was done)."""
        with self.lock:
            cands = [t for t in cands if not t.cancelling and t.future._state in _UNSETTLED
                     and self.tasks.get(t.future.task_id) is t]
            if not cands:
                return 0
            for task in cands:
                box = task.queued_in
                if task.queued and box is not None and box.waiting(task.queued) and len(task.msg) <= box.limit:
                    box.withdraw(task.msg)  # never reached a worker
                    task.queued = 0
            ids = [t.future.task_id for t in cands]
            msgs = [wire.encode_control(Kind.CANCEL_IF_QUEUED, ids[i:i + _IDS_PER_MESSAGE])
                    for i in range(0, len(ids), _IDS_PER_MESSAGE)]
            boxes = [self.out[e] for e in self.endpoints if e not in self.down]
            if not all(box.room_for(msgs) for box in boxes):
                return None  # a ring is full even in its reserve
            for box in boxes:
                box.send_urgent(msgs)  # then the doorbell: a fence before the slots are read
        running = {}
        for task in cands:
            ep = self._run_state(task.future.task_id)
            if ep:
                running[task.future.task_id] = ep
        self._drain_to_marks()  # a task that finished is FINISHED now, not re-run
        moved = 0
        with self.lock:
            for task in cands:
                old = task.future.task_id
                if (task.cancelling or task.future._state not in _UNSETTLED
                        or self.tasks.get(old) is not task):
                    continue  # a user's cancel() decides about it, or it settled
                if old in running:
                    task.where = running[old]  # it runs there: a death there accounts for it
                    continue
                if task.future._state != _PENDING:
                    task.future.mark_pending()  # a probe saw a claim that never became a start
                new = next(self.ids)
                _, flags, fn_id, _ = _unpack_task(task.msg)
                task.msg = _pack_task(wire.TASK, flags, fn_id, new) + task.msg[wire.TASK_HDR.size:]
                del self.tasks[old]
                self.tasks[new] = task
                self.retries.rename(old, new)
                task.future.task_id = new
                task.queued, task.queued_in = 0, None
                self.recently_cancelled.add(old)  # a MOVED of the old id gets a CANCEL
                self._dispatch(task)
                moved += 1
        return moved

    def _re_place_orphans(self) -> None:
        """Tasks whose holder died, found at its death or by a late MOVED (the pump, after
        a drain round: the handshake drains the rings itself).  If the cancels do not
        fit, they are sent plainly (the old way: a thief that has one runs it too)."""
        with self.lock:
            cands, self.orphans = self.orphans, []
            for task in cands:  # a cancel() is deciding about these: sent behind its cancel
                if task.cancelling and self.tasks.get(task.future.task_id) is task:
                    self._dispatch(task)
            cands = [t for t in cands if not t.cancelling]
        if self._re_place(cands) is None:
            with self.lock:
                for task in cands:
                    if task.future._state in _UNSETTLED and self.tasks.get(task.future.task_id) is task:
                        self._dispatch(task)

    def _slot_ids(self, ep: int) -> set[int]:
        """The driver tasks ``ep`` has claimed or runs (its status slots up to the claim)."""
        cell = self.matrix.status(ep)
        depth = cell[STATUS_DEPTH]
        return {cell[STATUS_RUNNING + i] for i in range(min(depth + 1, STATUS_SLOTS))} - {0}
