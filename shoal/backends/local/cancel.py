"""``cancel()`` on the local backend: True only if the task will never run.

The stdlib's contract, kept under any number of submitting and cancelling threads.
``Future.cancel`` asks ``_probe(fut, cancel=True)`` first; False from it means "not
running and never will", and the future is then cancelled.  The cases:

* staged (not pushed): taken out of ``staged`` under ``lock``;
* waiting in a driver outbox behind a backlog: withdrawn from it (``Outbox.withdraw``)
  by the number it got when it was queued;
* in a worker's ring or deque: the **handshake** (Dekker's).  The driver pushes
  CANCEL_IF_QUEUED into every worker's ring *now* (``Outbox.send_urgent``, ahead of any
  backlog, into the quarter of the ring tasks leave free), fences (the doorbell), then
  reads the workers' status slots (``_run_state``).  A worker about to run a driver
  task writes the id into its slot, fences, then looks at its driver ring once more and
  drops the task if a cancel is there.  At least one side sees the other.
* finished: a worker clears its slot only once the result is in its ring, so a clear
  slot with a result still unread means "finished"; ``_drain_to_marks`` consumes every
  ring up to its tail of the moment the slots were read, and the future is FINISHED.

If a worker's ring has no room even for the cancel (it reads nothing: thousands of
cancels of tasks behind one long task), nobody is told and ``cancel()`` says False
(``stats()["driver"]["cancels_refused"]``): the task then runs as if never asked.

Issue 13's race (cancel() True for a task that ran, 1-4 in 10,000 with 3 submitting
threads and 1 cancelling) had three causes, one per case above: one drain round of at
most 256 messages a ring (the result lay further back), the CANCEL_IF_QUEUED queued
behind a backlog in the outbox (the handshake saw neither side), and a worker clearing
its slot with its result still in its own outbox.

Rejected: a cancel board in shared memory that workers check (one more structure every
task start reads, to fix what an ordering rule fixes); waiting until a full ring drains
(``cancel()`` would block behind a long task); a second driver→worker ring for control
messages (a wider matrix for one message kind).
"""

from __future__ import annotations

import os
import signal
import time

from ..._errors import WorkerLost
from ...runtime import wire
from ...runtime.future import Future
from ...runtime.health import proc_state
from ...runtime.wire import Kind
from ...runtime.worker import STATUS_DEPTH, STATUS_RUNNING, STATUS_SLOTS

_PENDING = "PENDING"
CLAIM_WAIT_S = 5.0  # how long cancel() waits for a live worker between its claim and confirm


class Cancelling:
    """``LocalBackend``'s cancel side (a mixin: the state is the backend's)."""

    def _cancel(self, fut: Future) -> None:
        with self.lock:
            if self.waiting and self.waiting.pop(fut.task_id, None) is not None:
                return  # still waiting for its inputs: nothing was sent
            task = self.tasks.pop(fut.task_id, None)
            if task is None:
                return
            self.retries.forget(fut.task_id)
            if task.placed:
                self.placement.finished(task.placed - 1)
            if task.where and not self.closed:
                self._send(task.where, wire.encode_control(Kind.CANCEL, [fut.task_id]))
                # it may have been stolen meanwhile: a MOVED on its way is forwarded the cancel
                self.recently_cancelled.add(fut.task_id)

    def _running_on(self, tid: int) -> int:
        """The endpoint whose status cell says it runs driver task ``tid`` now (0: none)."""
        status = self.matrix.status
        for ep in self.endpoints:
            cell = status(ep)
            depth = cell[STATUS_DEPTH]
            for i in range(min(depth, STATUS_SLOTS)):
                if cell[STATUS_RUNNING + i] == tid:
                    return ep
        return 0

    def _run_state(self, tid: int) -> int:
        """Like ``_running_on``, but a worker that has *claimed* ``tid`` (slot written, depth
        not yet raised) is waited for: it is deciding, within microseconds, whether a
        cancel reached it first (it drops the claim) or not (it raises the depth).

        The handshake with the worker (``Worker.run_wire``) is Dekker's: the driver pushes
        CANCEL_IF_QUEUED then fences (the doorbell ring) then reads the slots; the worker
        writes its claim, fences, then rechecks its driver ring.  At least one sees the
        other, so ``cancel()`` never returns True for a task that then runs (the cancel goes
        to every worker, so also a thief that got the task before the driver heard).

        A claim by a worker that has died is void: it died before confirming, so the task
        never started there.  Calling it "started" (as this once did) marked the future
        RUNNING and made ``cancel()`` say False; the worker's death then treated the task
        as queued there, and a RUNNING task was never re-placed: its future hung (the
        SIGKILL cancel storm of tests/runtime/test_worker_death.py, 1 round in a few
        hundred).  A live claimer that neither confirms nor drops within
        ``CLAIM_WAIT_S`` (stopped, or starved of the CPU) is called started; should it
        then drop the task after all, it says so (DROPPED) and the pump re-places it.

        Rejected: waiting for such a claimer without a bound (a stopped worker would
        block ``cancel()`` until somebody continues it)."""
        status = self.matrix.status
        deadline = None
        while True:
            claimed = 0
            for ep in self.endpoints:
                cell = status(ep)
                depth = cell[STATUS_DEPTH]
                for i in range(min(depth + 1, STATUS_SLOTS)):
                    if cell[STATUS_RUNNING + i] == tid:
                        if i < depth:
                            return ep
                        if self.processes.running(ep):
                            claimed = ep
            if not claimed:
                return 0
            now = time.monotonic()
            if deadline is None:
                deadline = now + CLAIM_WAIT_S
            elif now > deadline:
                return claimed  # alive but not deciding: call it started
            os.sched_yield()

    def _probe(self, fut: Future, cancel: bool = False) -> bool:
        """Whether a worker runs ``fut``'s task now; if so the future goes RUNNING
        (``Future.running()``/``cancel()`` ask: RUNNING is read from the workers'
        status cells on demand, so the hot path sends no message per start).  With
        ``cancel``, first tell the holder to drop the task unless it started."""
        tid = fut.task_id
        task = self.tasks.get(tid)
        if task is None and cancel:
            with self.lock:  # a result being settled (_on_results) is FINISHED once we get it
                task = self.tasks.get(tid)
                renamed = fut.task_id != tid  # taken back from a stopped worker: a new id
            if renamed:  # decided again under the new id (stopped.py; ``lock`` is not re-entrant)
                return self._probe(fut, cancel)
        if self.closed or task is None:
            return False
        if task.delayed:  # waiting out its retry_delay: nothing runs (a status cell may be stale)
            if not cancel:
                return False
            with self.lock:
                if task.delayed:
                    task.cancelling = True  # the pump no longer sends it; cancel() takes it
                    return False
        if cancel and not task.where:
            with self.lock:
                if not task.where:  # staged, not pushed: take it out, so it never is
                    try:
                        self.staged.remove(task)
                    except ValueError:
                        pass
                    return False
        if cancel and task.where:
            # To every worker: a thief may hold the task before the driver hears of the steal.
            # (With retries left, only to its holder: a re-run after a refused cancel must not
            # meet a stale cancel elsewhere; there a steal in flight can still race.)
            # Into the rings now, ahead of any backlog in the outboxes (send_urgent): the
            # handshake (see _run_state) needs it there before the slots are read.  A ring
            # without room (its worker stuck in a long task, thousands of cancels in its
            # reserve) cannot be told: then nobody is, and cancel() says False.
            msg = wire.encode_control(Kind.CANCEL_IF_QUEUED, [tid])
            renamed = False
            with self.lock:
                if self.closed or task.future._state != _PENDING:
                    return False
                renamed = fut.task_id != tid  # taken back from a stopped worker (stopped.py)
                if not renamed:
                    holder = task.queued_in
                    if task.queued and holder is not None and holder.waiting(task.queued) and (
                            len(task.msg) <= holder.limit):
                        # Still in the driver's outbox behind a backlog: no worker has it, and
                        # none will (taken back; every re-send checks ``cancelling``).
                        holder.withdraw(task.msg)
                        task.queued = 0
                        task.cancelling = True
                        return False
                    boxes = [self.out[ep] for ep in (self.endpoints if not task.retries else (task.where,))
                             if ep not in self.down]
                    if not all(box.room_for([msg]) for box in boxes):
                        self.cancels_refused += 1  # nobody was told: the task runs as if not asked
                        return True
                    for box in boxes:
                        box.send_urgent([msg])
                    task.cancelling = True
            if renamed:  # decided again under the new id (``lock`` is not re-entrant)
                return self._probe(fut, cancel)
        if not self._run_state(tid):
            if cancel:
                # Not running: not started, or finished with its result still in a ring
                # (a worker clears its status only once the result is in its ring).  Drain
                # the rings up to what they held when the slots were read: a finished
                # task's future is then FINISHED and cancel() says False.
                self._drain_to_marks()
                # (CANCELLED: another thread's cancel() won meanwhile; then this one is True too)
                return fut._state in ("FINISHED", "RUNNING")
            return False
        if cancel:
            with self.lock:
                task.cancelling = False  # it runs: a re-run (retries) must not be dropped
        fut.mark_running()
        return True

    def force_cancel(self, fut: Future) -> bool:
        """Cancel ``fut`` even while it runs: kill and replace the worker running it.

        The worker is frozen (SIGSTOP) and its status cell read again before the kill:
        between the first look and the kill the task could end and the worker start
        another, which the kill then took with it (WorkerLost for a task nobody
        cancelled).  Frozen, the cell cannot change: the task still runs there (killed,
        True) or it ended (the worker goes on, False, as for a finished task).  What the
        kill still takes: the driver tasks on the same stack (a task waiting in a
        help-first join for which the worker ran this one, or one run inside this one's
        join) fail with WorkerLost or retry; its queued tasks run elsewhere."""
        if fut.cancel():
            return True
        tid = fut.task_id
        with self.lock:
            task = self.tasks.get(tid)
            ep = self._running_on(tid) if task is not None else 0
            if not ep or self.closed:
                return False
            proc = self.processes.proc(ep)
        resume = _freeze(proc)
        with self.lock:
            task = self.tasks.get(tid)
            if (task is None or self.closed or self.processes.proc(ep) is not proc
                    or self._running_on(tid) != ep or proc.poll() is not None):
                if resume:
                    _signal(proc, signal.SIGCONT)
                return False  # it ended meanwhile (or its worker died: WorkerLost says so)
            del self.tasks[tid]
            if task.placed:
                self.placement.finished(task.placed - 1)
                task.placed = 0
            self.forced[ep] = fut.task_id
        _force_cancelled(fut)  # outside the lock: its done callbacks may submit
        _signal(proc, signal.SIGKILL)
        return True

    def cancel_children(self, fut: Future) -> None:
        """A running task's spawned children that have not started are dropped (it runs on)."""
        ep = self._running_on(fut.task_id)
        if ep:
            with self.lock:
                if not self.closed:
                    self._send(ep, wire.encode_control(Kind.CANCEL, [fut.task_id]))

    def cancel_pending(self) -> int:
        """Cancel every task no worker has started (``shutdown(cancel_futures=True)``).

        Workers start in the background (the constructor does not wait); so that
        "not started" does not just mean "submitted before the workers were up", this
        first waits (bounded) until they run and each one holding work has begun a
        task, as a process pool's first tasks are already under way by then."""
        try:
            self._wait_started(self.start_timeout)
        except WorkerLost:
            pass
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            idle = [ep for ep in self.endpoints
                    if self.placement.load(ep - 1) and not self.matrix.status(ep)[STATUS_DEPTH]]
            if not idle:
                break
            time.sleep(0.001)
        with self.lock:
            futs = list(self.waiting.values()) + [t.future for t in self.tasks.values()]
        return sum(1 for fut in futs if fut.cancel())


def _signal(proc, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def _freeze(proc, limit: float = 5.0) -> bool:
    """SIGSTOP ``proc`` and wait (bounded) until it is stopped or gone, so its status cell
    holds still.  True if this call stopped it (the caller resumes it); False if it was
    stopped already (a debugger's: left as it is) or is gone."""
    if proc.poll() is not None or proc_state(proc.pid) in ("T", "t"):
        return False
    _signal(proc, signal.SIGSTOP)
    deadline = time.monotonic() + limit
    while proc_state(proc.pid) not in ("T", "t", None) and proc.poll() is None:
        if time.monotonic() > deadline:
            break  # (uninterruptible sleep?) read the cell anyway: at worst the old window
        os.sched_yield()
    return True


def _force_cancelled(fut: Future) -> None:
    """Move a RUNNING future to CANCELLED (``Future.cancel`` refuses RUNNING ones)."""
    with fut._condition:
        if fut._state not in ("PENDING", "RUNNING"):
            return
        fut._state = "CANCELLED"
        fut._condition.notify_all()
    fut._invoke_callbacks()
    fut.set_running_or_notify_cancel()  # CANCELLED -> CANCELLED_AND_NOTIFIED, tells wait()
