"""The local backend's pump thread: the only consumer of the worker→driver rings.

Each round it drains every worker's ring (at most 256 messages each), flushes staged
tasks and the driver outboxes' backlogs, enforces deadlines, restarts workers that
could not be started, and checks for stopped workers; with nothing to do it parks on
the driver's doorbell (and the workers' pidfds, so a death wakes it).

Results are settled in bulk (``_on_results``): one acquisition of ``lock`` per batch,
one ``Placement.finished`` per worker, the futures' states set under that same lock
(``settle_many``) so that a ``cancel()`` that finds the task gone finds its future
FINISHED, and done-callbacks run after the lock is released.  ``consume_lock`` makes
the pump and a ``cancel()`` that drains (cancel.py) take turns on the rings.

Invariants: the pump never waits on a worker (workers may wait for it: a worker keeps
a task's status slot until the result is in the ring); it never dies before ``close``
(an error is logged, counted in ``pump_errors``, and the loop goes on with a backoff).

Rejected: a thread per worker ring (GIL churn); decoding results through
``wire.decode_result`` per record (inlined: the hot path); settling futures after the
lock is released (a ``cancel()`` in between said True for a task that had run).
"""

from __future__ import annotations

import logging
import signal
import time

from ..._errors import BrokenPilot, RemoteTraceback
from ...runtime import wire
from ...runtime.api import settle as _settle
from ...runtime.future import delivering_thread, run_callbacks, settle_many
from ...runtime.health import Change, proc_state
from ...runtime.wire import Kind
from .stopped import _UNSETTLED
from .submit import _Task

_LOG = logging.getLogger("concurrent.futures")  # where executors report failed initializers
_SPIN = 3  # empty pump rounds before parking (spinning would hold the GIL that submit needs)
_LIVENESS_S = 2.0  # with work outstanding, the pump checks this often for stopped workers
_RESULT = wire.RESULT
_OK_STATUS = int(wire.Status.OK)
_unpack_result = wire.RESULT_HDR.unpack_from
_loads = wire.pickle.loads
_log = logging.getLogger("shoal.runtime")


class Pumping:
    """``LocalBackend``'s pump thread and result handling (a mixin: the state is the backend's)."""

    def _fail_all(self, exc: BaseException) -> None:
        with self.lock:
            tasks = list(self.tasks.values())
            self.tasks.clear()
        for task in tasks:
            _settle(task.future, False, exc)

    def _on_init_failed(self, ep: int, tb: str) -> None:
        """A worker's initializer raised: log it and break the pilot (a process pool's rule)."""
        _LOG.critical("Exception in initializer of shoal worker %d:\n%s", ep, tb)
        first_line = tb.strip().splitlines()[-1] if tb.strip() else "?"
        self.broken = (f"a worker's initializer failed ({first_line}); the pilot cannot run tasks: "
                       f"create a new shoal.Pilot")
        self.closing = True
        self._fail_all(BrokenPilot(self.broken))

    def _fail_or_retry(self, tid: int, task: _Task, exc: BaseException, retry: bool = True) -> None:
        if retry and task.retries > 0 and not self.closing:
            task.retries -= 1
            delay = self.retries.next_delay(tid)
            # flagged before the future goes PENDING: a probe reading the failed attempt's
            # stale status cell must not make it RUNNING again for the whole delay (_probe)
            task.delayed = delay > 0
            # between attempts nothing runs: PENDING again, so cancel() takes the queued retry
            # (True; the earlier attempt's side effects stay), as on dask (docs/guide.md)
            task.future.mark_pending()
            with self.lock:
                if tid in self.tasks:
                    if delay > 0:  # options(retry_delay=): sent again by the pump when due
                        if task.placed:
                            self.placement.finished(task.placed - 1)
                            task.placed = 0
                        task.where = 0  # no worker holds it (a death there does not re-place it)
                        self.retries.defer(tid, time.monotonic() + delay)
                        self.doorbell.ring()  # a pump parked for longer wakes to see it
                    else:
                        self._dispatch(task)
                    return
        self.retries.forget(tid)
        with self.lock:
            self.tasks.pop(tid, None)
            if task.placed:
                self.placement.finished(task.placed - 1)
                task.placed = 0
        _settle(task.future, False, exc)

    def _send_delayed(self) -> None:
        """Send the retries whose retry_delay has passed (a cancelled one is gone from ``tasks``)."""
        with self.lock:
            for tid in self.retries.pop_due(time.monotonic()):
                task = self.tasks.get(tid)
                if task is not None and task.delayed:
                    task.delayed = False
                    if not task.cancelling:  # else a cancel() is taking it (_probe)
                        self._dispatch(task)

    def _pump(self) -> None:
        """The pump thread's body: it never dies before ``close``.  Anything a round
        raises (BaseException included) is reported and the loop goes on."""
        delivering_thread(self._probe_cb)  # a done-callback here that waits on a pending future would hang
        errors = 0
        while True:
            try:
                self._pump_rounds()
                return
            except BaseException:  # noqa: BLE001 - a dead pump would hang every future
                if self.closed:
                    return
                self.pump_errors += 1
                errors += 1
                _log.exception("shoal: the pump thread hit an error; it goes on")
                time.sleep(min(1.0, 0.001 * 2 ** min(errors, 10)))

    def _pump_rounds(self) -> None:
        idle = 0
        deadlines, retries = self.deadlines, self.retries
        while True:
            got = self._drain_inboxes()
            if self.orphans:
                self._re_place_orphans()  # stopped.py
            if self.staged:
                with self.lock:
                    if self.staged:
                        self._flush_staged()
            deadline = deadlines.next_due()
            if deadline is not None and deadline <= time.monotonic():
                self._check_deadlines()
            if self.down:
                self._retry_down()
            due = retries.next_due()
            if due is not None and due <= time.monotonic():
                self._send_delayed()
            if any(box.pending for box in self.out.values()):
                with self.lock:
                    for box in self.out.values():
                        box.flush()
            if self.tasks and self.health.check_due(time.monotonic()):
                self._check_liveness()
            if got:
                idle = 0
                continue
            if self.closed:
                return
            idle += 1
            if idle < _SPIN:
                continue
            timeout = None
            deadline = deadlines.next_due()
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())
            due = retries.next_due()
            if due is not None:
                due = max(0.0, due - time.monotonic())
                timeout = due if timeout is None else min(timeout, due)
            if self.down and not self.closing:
                due = self.health.wake_in(time.monotonic())
                timeout = due if timeout is None else min(timeout, due)
            # Never parked for longer than a health-check period, even with no work: a task
            # submitted to a stopped worker while the pump slept rings no bell of ours (no
            # result will come), and the check (stopped.py) must still see that worker.
            timeout = _LIVENESS_S if timeout is None else min(timeout, _LIVENESS_S)
            if any(box.pending for box in self.out.values()):
                timeout = 0.001
            woke = self.doorbell.park(self._readable, timeout, self.processes.pidfds())
            for fd in woke:
                ep = self.processes.endpoint_of(fd)
                if ep is not None:
                    self._on_death(ep)

    def _check_liveness(self) -> None:
        """Report workers that are stopped (SIGSTOP, a debugger), and take back the tasks
        queued to them (stopped.py): a stopped worker neither runs nor hands them on."""
        for ep, proc in self.processes.all():
            change = self.health.saw(ep, proc.pid, None if ep in self.down else proc_state(proc.pid))
            if change is Change.STOPPED:
                _log.warning("shoal: worker %d (pid %d) is stopped (SIGSTOP or a debugger); the "
                             "tasks queued to it go to live workers, the one it runs waits until "
                             "it gets SIGCONT (a timeout= bounds it)", ep, proc.pid)
            elif change is Change.RUNS_AGAIN:
                _log.warning("shoal: worker %d (pid %d) runs again", ep, proc.pid)
        if self.health.stopped:
            self._take_back_all()  # stopped.py: its queued tasks go to live workers

    def _readable(self) -> bool:
        if self.closed:
            return True
        if self.staged or self.orphans:
            return True
        for _, box in self.inboxes:
            if box.ring.readable():
                return True
        return False

    def _drain_inboxes(self) -> bool:
        """Consume what the workers sent (the pump; also ``cancel()``: one at a time)."""
        with self.consume_lock:
            return self._drain_locked()

    def _drain_to_marks(self) -> None:
        """Consume and handle every message the workers had published when this is called
        (``cancel()``, after it read the status slots).  One ``_drain_locked`` round takes
        at most 256 messages per worker: with a backlog behind the pump, the result of the
        task being cancelled could still be in the ring after it, and cancel() said True
        for a task that had run (a race a stress test found).  Bounded: the marks do not move."""
        marks = [(box.ring, box.ring.produced()) for _, box in self.inboxes]
        with self.consume_lock:
            while not self.closed and not all(ring.reached(mark) for ring, mark in marks):
                self._drain_locked()

    def _drain_locked(self) -> bool:
        got = False
        for ep, box in self.inboxes:
            if box.ring.readable():
                msgs = box.receive(256)
                if not msgs:
                    continue
                got = True
                self.messages_in += len(msgs)
                results = []
                for m in msgs:
                    try:
                        if m[0] == _RESULT:
                            _, status, tid = _unpack_result(m)
                            try:
                                value = _loads(m[16:] if len(m) < 4096 else memoryview(m)[16:])
                            except BaseException as exc:  # noqa: BLE001 - even SystemExit
                                results.append((tid, False, wire.result_unpickling_error(tid, status, exc)))
                                continue
                            if status == _OK_STATUS:
                                results.append((tid, True, value))
                            else:
                                exc, tb, hops = value
                                exc.__cause__ = RemoteTraceback(tb, hops)
                                results.append((tid, False, exc))
                        else:
                            self._handle(ep, m)
                    except BaseException:  # noqa: BLE001 - one bad message, not the batch
                        self.pump_errors += 1
                        _log.exception("shoal: a message from worker %d could not be handled", ep)
                if results:
                    self._on_results(results)
        return got

    def _on_results(self, results: list) -> None:
        """Finish the futures of a batch of results: one lock round and one load update per
        worker for the batch, then the futures in bulk (``settle_many``)."""
        settle, retry = [], []
        tasks = self.tasks
        done_on: dict[int, int] = {}
        forget = self.retries.forget if self.retries.any() else None
        with self.lock:
            for tid, ok, value in results:
                task = tasks.get(tid)
                if task is None:
                    continue  # cancelled, or a duplicate after a re-run
                if not ok and task.retries > 0:
                    retry.append((tid, task, value))
                    continue
                del tasks[tid]
                if forget is not None:
                    forget(tid)
                placed = task.placed
                if placed:
                    done_on[placed] = done_on.get(placed, 0) + 1
                settle.append((task.future, ok, value))
            finished = self.placement.finished
            for ep, n in done_on.items():
                finished(ep - 1, n)
            # Settled under the lock that popped them: a cancel() that finds its task gone
            # (it looks under this lock) then finds the future FINISHED; settled after the
            # release, such a cancel() said True for a task whose result was being set.
            called: list = []
            settle_many(settle, _log, called)
        self._run_callbacks(called)
        for tid, task, value in retry:
            self._fail_or_retry(tid, task, value)

    def _run_callbacks(self, called: list) -> None:
        """Run done-callbacks (``consume_lock`` held), never nested in one another.

        A done-callback that calls ``cancel()`` drains the rings (``_drain_to_marks``),
        which settles more futures whose callbacks may cancel again: run inline, each
        cancel nested a drain in the last, until a RecursionError struck in the middle of
        the placement bookkeeping (the pump then failed every round and futures hung).
        A callback run meanwhile only queues the newly settled futures; the outermost
        call runs them, in order, after the callback that drained them returns."""
        if self.deferred_callbacks is not None:
            self.deferred_callbacks.extend(called)
            return
        pending = called
        try:
            while pending:
                self.deferred_callbacks = []
                run_callbacks(pending, _log)
                pending = self.deferred_callbacks
        finally:
            self.deferred_callbacks = None

    def _handle(self, ep: int, msg: bytes) -> None:
        kind = msg[0]
        if kind == Kind.MOVED:
            thief, gen, ids = wire.decode_control(msg)
            with self.lock:
                for tid in ids:
                    task = self.tasks.get(tid)
                    if task is None and tid in self.recently_cancelled:
                        self._send(thief, wire.encode_control(Kind.CANCEL, [tid]))
                    if task is not None:
                        if task.lost_on is not None and task.lost_on == (thief, gen):
                            continue  # it died running there: failed or retried already
                        task.where = thief
                        task.handed_by = (ep, self.processes.generation(ep))
                        if self.processes.generation(thief) != gen:
                            # the thief died since: re-placed through the handshake after
                            # this round (it may have handed the task on before dying)
                            self.orphans.append(task)
                            self.doorbell.ring()
        elif kind == Kind.STARTED:
            tid, where = wire.decode_control(msg)
            task = self.tasks.get(tid)
            if task is not None and task.timeout is not None:
                task.where = where
                self.deadlines.started(tid, where, time.monotonic() + task.timeout)
                task.future.mark_running()
        elif kind == Kind.DROPPED:
            # A worker dropped a task for a cancel.  Normally that cancel() is still
            # deciding (``cancelling``) or took the task (gone).  Otherwise nobody will run
            # it: a cancel() that called a claim started after waiting (cancel.py,
            # CLAIM_WAIT_S) said False, or a stale cancel met a copy sent again under the
            # same id.  It must still run: re-placed through the handshake (stopped.py).
            (tid,) = wire.decode_control(msg)
            with self.lock:
                task = self.tasks.get(tid)
                if task is not None and not task.cancelling and task.future._state in _UNSETTLED:
                    self.orphans.append(task)
                    self.doorbell.ring()
        elif kind == Kind.INIT_FAILED:
            self._on_init_failed(*wire.decode_control(msg))
        elif kind == Kind.STATS:
            self.replies.stats_arrived(ep, wire.decode_control(msg))
        elif kind == Kind.LOOT:
            victim, _, msgs = wire.decode_control(msg)
            waited = self.replies.loot_arrived(victim, msgs)
            if msgs and not waited:  # an answer after export() gave up: run it here
                self.give_back(msgs)

    def _check_deadlines(self) -> None:
        for tid, ep in self.deadlines.due(time.monotonic()):
            task = self.tasks.get(tid)
            if task is None or task.where != ep or not self.deadlines.claim_kill(ep, tid):
                continue
            self.processes.signal(ep, signal.SIGKILL)
