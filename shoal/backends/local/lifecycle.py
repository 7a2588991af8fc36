"""What happens to the local backend's workers: death, replacement, close, fork.

The processes themselves (start, generations, reaping, signals, the lifeline pipe)
are the ``Processes`` component (processes.py); this module decides what a worker's
start, death or the backend's close means for the tasks.  The segment is a memfd,
so no /dev/shm name exists to leak.

A death (the pump sees the pidfd) is handled under ``consume_lock`` then ``lock``: what
the worker sent before dying is drained, its running driver tasks (its status cell,
wherever the driver thought they were) fail or retry, everything else it held is
re-placed elsewhere through the cancel handshake (``orphans``, stopped.py: it may have
handed some to a thief just before), the other workers are told (``DIED``), and a
replacement of the next generation is started (with backoff when starting fails).  A function that kills a worker while it is unpickled is quarantined.

``close`` waits for (or cancels) the outstanding work, tells the workers to stop, and
tears down; in a forked child (at-fork hook) the parent's pilot is closed without
touching the parent's workers and its futures fail with ``PilotClosed``.

Rejected: re-sending a dead worker's queued tasks blindly (it may have handed some to
a thief just before it died, its MOVED lost in its outbox: each ran twice); settling
the lost tasks under ``lock`` (their done-callbacks may submit, which takes it).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import signal
import subprocess
import time
import weakref

from ..._errors import (
    BrokenPilot,
    PilotClosed,
    SerializationError,
    TaskTimeout,
    WorkerLost,
)
from ...queues import RingMatrix
from ...queues.ring import Ring
from ...runtime import context, wire
from ...runtime import trace as tracing
from ...runtime.api import settle as _settle
from ...runtime.future import abandon
from ...runtime.wire import Kind
from ...runtime.worker import (
    STATUS_DEPTH,
    STATUS_LOADING,
    STATUS_RUNNING,
    STATUS_SLOTS,
)
from .submit import _Task

_log = logging.getLogger("shoal.runtime")
_live: weakref.WeakSet = weakref.WeakSet()  # this process's backends (for fork detection)


class Lifecycle:
    """``LocalBackend``'s worker processes and shutdown (a mixin: the state is the backend's)."""

    def _start_worker(self, ep: int) -> None:
        self.processes.start(ep)
        if self.init_msg is not None:
            self._send(ep, self.init_msg, wake=False)  # first in its ring: before any task

    def _wait_started(self, timeout: float) -> None:
        self.processes.wait_started(timeout)

    def _replace(self, ep: int) -> None:
        """Start a replacement on ``ep`` (lock held).  A failure (no free fds, ENOMEM, the
        pids limit) leaves ``ep`` down; the pump retries with backoff and says so."""
        try:
            self._start_worker(ep)
        except BaseException as exc:  # noqa: BLE001 - the pump thread must not die of it
            entry = self.health.start_failed(ep, repr(exc), time.monotonic())
            _log.warning("shoal: could not start a replacement for worker %d (attempt %d: %r); "
                         "its tasks go to the other workers; retrying in %.2f s",
                         ep, entry.tries, exc, entry.delay)
            return
        if self.health.started(ep):
            _log.warning("shoal: worker %d is back (pid %d)", ep, self.processes.pid(ep))
        for msg in self.functions.defines.values():
            self._send(ep, msg, wake=False)

    def _retry_down(self) -> None:
        with self.lock:
            for ep in self.health.due(time.monotonic()):
                if not self.closing:
                    self._replace(ep)

    def _on_death(self, ep: int) -> None:
        """A worker process exited: account for its tasks, tell the others, replace it."""
        with self.consume_lock:  # no cancel() drains the inbox being reset
            self._on_death_locked(ep)

    def _on_death_locked(self, ep: int) -> None:
        proc = self.processes.reaped(ep)
        self._drain_inboxes()  # results it sent before dying are not lost
        status = self.matrix.status(ep)
        depth = status[STATUS_DEPTH]
        running = {status[STATUS_RUNNING + i] for i in range(min(depth, STATUS_SLOTS))}
        loading = status[STATUS_LOADING]
        for i in range(RingMatrix.STATUS_WORDS):
            status[i] = 0
        if loading and (proc.returncode != -signal.SIGKILL or self.functions.strike(loading)):
            # It died unpickling a function: no other worker gets that DEFINE again.  A
            # SIGKILL may be somebody else's (a user, force cancel of another task): the
            # function is quarantined at its second such death (an OOM kill repeats).
            self._quarantine(loading, ep, proc)
        overran = self.deadlines.overran(ep)
        self.replies.forget(ep)  # a monitor shows the replacement, not the dead
        forced = self.forced.pop(ep, None)
        dead_gen = self.processes.next_generation(ep)
        lost: list[_Task] = []
        with self.lock:
            # Unread messages to the dead worker: its tasks go elsewhere, the rest is moot.
            ring = Ring(self.matrix.segment.buf, *self.matrix._ring_offsets[(0, ep)])
            while ring.readable():
                ring.pop()
            ring.close()
            self.out[ep].clear()
            for other in self.endpoints:
                if other != ep:
                    self._send(other, wire.encode_control(Kind.DIED, [ep, dead_gen]))
            self.health.lost(ep)  # re-sent tasks go elsewhere
            broken = []
            for tid, task in list(self.tasks.items()):
                if task.placed == ep:
                    self.placement.finished(ep - 1)
                    task.placed = 0
                if tid in running or (tid == overran and task.where == ep):
                    # Whatever ``where`` says: a task it stole is in its status cell before
                    # the victim's MOVED reaches us (that may wait in the victim's outbox
                    # behind a full ring); it started here, so it fails (or retries) and is
                    # never silently re-run when the MOVED comes.
                    if task.where != ep:
                        task.lost_on = (ep, dead_gen)  # that MOVED is then moot (pump.py)
                    lost.append(task)
                elif task.where == ep:
                    if self.functions.quarantined and self.functions.is_quarantined(task.fn):
                        broken.append(task)
                    elif task.cancelling:
                        self._dispatch(task)  # behind a CANCEL_IF_QUEUED: a cancel() decides
                    else:
                        # Not to be sent again blindly: it may have left for a thief whose
                        # victim's MOVED died in the victim's outbox (stopped.py _re_place).
                        self.orphans.append(task)
                elif task.handed_by == (ep, dead_gen) and not task.cancelling:
                    # Its MOVED said the dead worker handed it to a live thief, but the LOOT
                    # that carried it can have died in the dead one's outbox: the thief never
                    # got it, and nobody would run it (the SIGKILL cancel storm, 1 round in
                    # about 1,500).  Workers now hold a MOVED back until its LOOT is in the
                    # thief's ring (worker.py); this is the driver's own guard for a MOVED that
                    # arrives first all the same.  Re-placed through the handshake, which
                    # leaves it where it runs if the thief did get it.  (A cancel() deciding
                    # about it told every worker already.)
                    self.orphans.append(task)
            for inbox_ep, box in self.inboxes:
                if inbox_ep == ep:
                    box.reset()
            if not self.closing and self.broken is None:
                self._replace(ep)
        for task in broken:
            self._fail_or_retry(task.future.task_id, task, SerializationError(
                self.functions.quarantined[id(task.fn)][1]), retry=False)
        if self.broken is not None:
            self._fail_all(BrokenPilot(self.broken))
            return
        for task in lost:
            tid = task.future.task_id
            if tid == forced:
                continue  # cancel(force=True) settled it already
            if tid == overran:
                err = TaskTimeout(f"task {task.name} ran longer than its timeout of {task.timeout} s; "
                                  f"worker {ep} was killed and replaced")
            elif getattr(self, "stopping", False):  # close() killed it at its grace's end (Ctrl-C)
                self._fail_or_retry(tid, task, PilotClosed(
                    f"the pilot closed while task {task.name} ran (worker {ep} stopped)"), retry=False)
                continue
            else:
                err = WorkerLost(f"worker {ep} (pid {proc.pid}) died with exit code {proc.returncode} "
                                 f"while running task {task.name}; a replacement was started")
            self._fail_or_retry(tid, task, err)

    def _quarantine(self, fn_id: int, ep: int, proc) -> None:
        """Function ``fn_id`` killed worker ``ep`` while being unpickled: drop its DEFINE
        (replacements would die of it too), fail its tasks, refuse new ones."""
        with self.lock:
            why = self.functions.quarantine(fn_id, lambda name: (
                f"function {name} killed worker {ep} (pid {proc.pid}, exit code "
                f"{proc.returncode}) while the worker unpickled it (importing its module?); "
                "it is quarantined: its tasks fail, the others go on"))
        if why is not None:
            _log.error("shoal: %s", why)

    def _closed_reason(self) -> str:
        if self.forked:
            return (f"this pilot belongs to process {self.pid}, and this process ({os.getpid()}) "
                    "is a fork of it: a forked process cannot use its parent's pilot (the workers "
                    "and rings are the parent's); open a new shoal.Pilot in the child")
        if context.exiting:
            return "cannot schedule new futures after interpreter shutdown"
        return "cannot schedule new futures after shutdown: submit() on a closed pilot; open a new shoal.Pilot"

    def _forked(self) -> None:
        """In the child of ``os.fork()`` (at-fork hook): never touch the parent's workers,
        rings or processes; every use raises ``PilotClosed`` saying why."""
        self.forked = True
        self.closing = self.closed = True
        self.processes.forked()
        # The parent's outstanding futures can never settle here: fail them, so result()
        # in the child raises instead of waiting forever.  No done-callbacks (user code in
        # an at-fork hook); no thread waits on them in the child (only this one survived).
        abandon([*self.waiting.values(), *(t.future for t in self.tasks.values())],
                PilotClosed(self._closed_reason()))
        self.tasks, self.waiting, self.staged = {}, {}, []
        self.out, self.inboxes = {}, []

    def close(self, cancel_pending: bool = False, wait: bool = True) -> None:
        with self.close_lock:  # the exit handler and a collected pilot's closer may race
            self._close(cancel_pending or not wait, CLOSE_GRACE_S if wait else STOP_GRACE_S)

    def _close(self, cancel_pending: bool, grace: float = 5.0) -> None:
        if self.closed:
            return
        self.closing = True
        while True:  # tasks waiting for inputs are outstanding too (they finish or cancel)
            with self.lock:
                futs = list(self.waiting.values()) + [t.future for t in self.tasks.values()]
            if not futs:
                break
            if cancel_pending:
                for f in futs:
                    f.cancel()
                break
            cf.wait(futs)
        with self.lock:
            for ep in self.endpoints:
                self._send(ep, wire.encode_control(Kind.SHUTDOWN, []))
        deadline = time.monotonic() + grace
        for _, proc in self.processes.all():
            try:
                proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stopping = True  # its running task ends PilotClosed, not WorkerLost
                proc.kill()
                proc.wait()
        self.closed = True
        self.doorbell.ring()  # the pump may be parked with nothing to read
        self.pump_thread.join(5.0)
        for task in list(self.tasks.values()):
            _settle(task.future, False, PilotClosed("the pilot closed before this task finished"))
        self.tasks.clear()
        if self.trace_path:
            tracing.merge(self.trace_path, list(self.endpoints))
        self._teardown()

    def _teardown(self) -> None:
        self.processes.teardown()
        self.inboxes = []
        self.out = {}
        self.matrix.close()


# How long close() lets the workers finish their running tasks and exit on SHUTDOWN before
# it kills them: ``close(wait=True)`` (the default, and leaving a with block on an
# exception) CLOSE_GRACE_S; ``close(wait=False)`` (leaving it on Ctrl-C) STOP_GRACE_S, time
# for an idle worker to read SHUTDOWN and exit by itself, a busy one is SIGKILLed.
CLOSE_GRACE_S = 5.0
STOP_GRACE_S = 0.25


def _after_fork_in_child() -> None:
    for backend in list(_live):
        backend._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
