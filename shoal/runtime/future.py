"""shoal.Future: a ``concurrent.futures.Future`` that knows where it runs.

Two kinds of futures share this class:

* Driver futures (``Pilot.submit``): ordinary thread-safe futures, set by the
  backend's receiving thread; ``concurrent.futures.wait``, ``as_completed``
  and ``asyncio.wrap_future`` work on them unchanged.
* Worker futures (``shoal.spawn`` inside a task): made by ``Future.local()``
  without a ``threading.Condition`` (a worker runs one thread, so the lock
  would be pure overhead on the spawn path, which must stay in microseconds).
  Their ``result()`` never blocks the worker idle: it asks the worker to run
  other tasks (its own children first, then stolen ones) until the future is
  done — the "help first" join of Cilk/TBB.

Rejected: a separate LocalFuture type (users would have to care which one they
hold); blocking ``result()`` inside workers (two workers waiting on each
other's children deadlock a 2-worker pilot).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from _thread import RLock as _RLock
from _thread import allocate_lock as _allocate_lock
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING, RUNNING

from . import context


class _NoLock:
    """Stands in for the Condition of worker-local futures: single-threaded."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def notify_all(self):
        pass

    def wait(self, timeout=None):  # pragma: no cover - never reached: result() helps first
        raise RuntimeError("a worker-local future was waited on without the worker loop")


_NOLOCK = _NoLock()


class _Condition:
    """``threading.Condition`` over a Future's lock, cut to what futures use.

    The stdlib Condition allocates a dozen garbage-collected objects (bound
    methods, a deque, a dict); with tens of thousands of futures in flight the
    cyclic collector spends more time on them than the task takes.  Here a
    future holds no lock of its own: every driver future of this process shares
    one RLock (``Future._lock``: conditions may share a lock; nothing waits
    while holding it except ``wait``, which releases it), and, once a thread
    waits, the future keeps the list of its waiter locks (``_cw``).  This view
    is made when the stdlib's code asks for ``future._condition`` (never on the
    hot path).  Same semantics: an RLock, and one waiter lock per waiting thread.
    """

    __slots__ = ("_fut",)

    def __init__(self, fut):
        self._fut = fut

    def __enter__(self):
        return self._fut._lock.__enter__()

    def __exit__(self, *exc):
        return self._fut._lock.__exit__(*exc)

    def acquire(self, *args):
        return self._fut._lock.acquire(*args)

    def release(self):
        self._fut._lock.release()

    def wait(self, timeout=None):
        fut = self._fut
        lock = fut._lock
        waiter = _allocate_lock()
        waiter.acquire()
        if fut._cw is None:
            fut._cw = []
        fut._cw.append(waiter)
        saved = lock._release_save()
        got = False
        try:
            if timeout is None:
                got = waiter.acquire()
            elif timeout > 0:
                got = waiter.acquire(True, timeout)
            else:
                got = waiter.acquire(False)
            return got
        finally:
            lock._acquire_restore(saved)
            if not got:
                try:
                    fut._cw.remove(waiter)
                except ValueError:
                    pass

    def notify_all(self):
        _wake_all(self._fut)

    notify = notify_all  # spurious wake-ups are allowed by the Condition contract


def _wake_all(fut) -> None:
    """Release every thread waiting on ``fut``'s condition (its lock held)."""
    waiters = fut._cw
    if waiters:
        for waiter in waiters:
            try:
                waiter.release()
            except RuntimeError:  # pragma: no cover - timed out meanwhile
                pass
        waiters.clear()


class Future(cf.Future):
    """A ``concurrent.futures.Future`` for a shoal task."""

    # task id (set by whoever made it); the backend/worker that can cancel it
    task_id: int = 0
    _canceller = None
    _prober = None  # driver futures: does a worker run the task now (-> RUNNING); spawned: is it lent out
    # Defaults until set: a future costs one object and its condition, not five objects.
    # Each garbage-collected object per task is paid again by every collection that walks
    # the futures in flight (20,000 of them in a burst of tiny tasks: ~1.5 us per task).
    _state = PENDING
    _result = None
    _exception = None

    _w = None  # the stdlib's ``_waiters`` list, once someone waits (wait/as_completed)
    _cb = None  # its ``_done_callbacks`` list, once someone adds one
    _lock = _RLock()  # shared by the driver futures of this process (see _Condition)
    _cw = None  # threads blocked in result()/exception(): their waiter locks

    def __init__(self):
        pass  # everything is a class default until set: no garbage-collected parts

    @property
    def _condition(self):
        """What the stdlib's code locks and waits on (see ``_Condition``)."""
        return _NOLOCK if self._lock is None else _Condition(self)

    # concurrent.futures reaches both lists only with the condition's lock held (adding a
    # waiter or a callback, settling), so making them on first use cannot race.
    @property
    def _waiters(self) -> list:
        w = self._w
        if w is None:
            w = self._w = []
        return w

    @property
    def _done_callbacks(self) -> list:
        cb = self._cb
        if cb is None:
            cb = self._cb = []
        return cb

    @classmethod
    def local(cls, task_id: int) -> Future:
        """A lock-free future for a task spawned inside a worker: worker thread only."""
        f = cls.__new__(cls)
        f._lock = None  # no lock: its _condition is _NOLOCK
        f.task_id = task_id
        return f

    def result(self, timeout=None):
        if self._state != FINISHED:
            worker = context.worker
            if worker is not None:
                worker.help_until(self, timeout)
            elif _delivering.prober is not None:
                _refuse_wait(self)
        elif self._exception is None:
            # Done: no lock needed (a finished future never changes; _result was written
            # before _state).  The common case of collecting thousands of results.
            return self._result
        return super().result(timeout)

    def exception(self, timeout=None):
        if self._state != FINISHED:
            worker = context.worker
            if worker is not None:
                worker.help_until(self, timeout)
            elif _delivering.prober is not None:
                _refuse_wait(self)
        return super().exception(timeout)

    def done(self) -> bool:
        if self._state in _SETTLED:
            return True
        # In a worker, a result that came home while the SIGURG handler polled waits to be
        # settled at a call into the runtime (Worker.on_signal); this is one, so that a task
        # polling ``done()`` sees it.
        worker = context.worker
        if worker is not None and worker.unsettled and not worker.in_handler:
            worker.settle_deferred()
        return self._state in _SETTLED

    def running(self) -> bool:
        if self._state == PENDING and self._prober is not None:
            self._prober(self)
        return self._state == RUNNING

    def cancel(self) -> bool:
        """Cancel the task unless a worker runs it already (then False, as the stdlib's)."""
        if self._state == CANCELLED_AND_NOTIFIED:
            return True  # cancelled before: nothing more to do
        if self._state == PENDING and self._prober is not None and self._prober(self, True):
            return False
        if not super().cancel():
            return False
        # Tell concurrent.futures.wait/as_completed at once (CANCELLED_AND_NOTIFIED), as an
        # executor does when it dequeues a cancelled item: our items may never be dequeued.
        # Two threads can both pass the stdlib's cancel(); only the first to notify goes on
        # (the other's notify would raise 'Future in unexpected state').  The lock is an RLock.
        with self._condition:
            if self._state != CANCELLED:
                return True  # another cancel() notified first and tells the backend
            self.set_running_or_notify_cancel()
        canceller = self._canceller
        if canceller is not None:
            canceller(self)
        return True

    def mark_running(self) -> None:
        """PENDING -> RUNNING (a worker started the task); a no-op in any other state.  The
        stdlib's ``set_running_or_notify_cancel`` raises on a RUNNING future: two threads
        polling ``running()``, or a poll and the pump's STARTED, would both call it."""
        with self._condition:
            if self._state == PENDING:
                self._state = RUNNING

    def mark_pending(self) -> None:
        """RUNNING -> PENDING (an attempt failed and its retry waits: nothing runs now); a
        no-op in any other state."""
        with self._condition:
            if self._state == RUNNING:
                self._state = PENDING

    def __reduce__(self):
        raise TypeError(
            "a shoal.Future cannot be pickled; pass it directly as an argument of "
            "submit()/spawn() (also inside a list, tuple or dict) to make a dependency"
        )

    def __repr__(self) -> str:
        return f"<shoal.Future {self.task_id:#x} {self._state.lower()}>"


class _Delivering(threading.local):
    prober = None  # set on a backend's result pump: the ``_prober`` of the futures it settles


_delivering = _Delivering()


def delivering_thread(prober) -> None:
    """Mark the calling thread as the one that settles the driver futures whose ``_prober``
    is ``prober``: a done-callback it runs must not wait on one of them still pending
    (only this thread could settle it).  Futures of other backends may still be waited on."""
    _delivering.prober = prober


def _refuse_wait(fut) -> None:
    if fut._state not in _SETTLED and fut._prober is _delivering.prober:
        raise RuntimeError(
            f"{fut!r}: result()/exception() of a pending future inside a done-callback would wait "
            "forever: callbacks run on the thread that delivers results. Submit from the callback "
            "and chain with add_done_callback, or wait in another thread")


_SETTLED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))


def _new_lock_after_fork() -> None:
    # A fork while another thread held the shared lock would leave it held forever in
    # the child: the child's futures get a fresh one.
    Future._lock = _RLock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def settle_many(items, log, later: list | None = None) -> None:
    """Finish driver futures in bulk: ``items`` of ``(future, ok, value)``.

    What ``set_result``/``set_exception`` do, with the Condition's lock taken
    directly and no exception for a future settled meanwhile (a cancelled one is
    skipped): the result pump finishes hundreds of futures per round, and the
    stdlib's two calls, the set literal and the ``InvalidStateError`` path cost
    more than the rest of a tiny task's round trip.  The shared lock is taken once
    for the batch; done-callbacks run after it is released, in order; one that
    raises (even ``BaseException``) is reported on ``log``.  With ``later``, the
    futures whose callbacks are due are appended to it instead (the caller holds a
    lock of its own and runs them with ``run_callbacks`` after releasing it).
    """
    called, held = [], None
    try:
        for fut, ok, value in items:
            lock = fut._lock
            if lock is not held:  # in practice one lock for the whole batch
                if held is not None:
                    held.release()
                    held = None
                lock.acquire()
                held = lock
            if fut._state in _SETTLED:
                continue
            if ok:
                fut._result = value
            else:
                fut._exception = value
            fut._state = FINISHED
            waiters = fut._w
            if waiters:  # concurrent.futures.wait / as_completed
                for waiter in waiters:
                    if ok:
                        waiter.add_result(fut)
                    else:
                        waiter.add_exception(fut)
            if fut._cw:
                _wake_all(fut)
            if fut._cb:
                called.append(fut)
    finally:
        if held is not None:
            held.release()
    if later is not None:  # the caller runs them (run_callbacks) once its own lock is released
        later.extend(called)
        return
    run_callbacks(called, log)


def run_callbacks(futs, log) -> None:
    """The done-callbacks of settled ``futs``, in order; one that raises is logged."""
    for fut in futs:
        try:
            fut._invoke_callbacks()
        except BaseException:  # noqa: BLE001 - a done-callback raising SystemExit, say
            log.exception("shoal: a done-callback of %r raised", fut)


def abandon(futs, exc: BaseException) -> None:
    """Fail the unsettled ``futs`` with ``exc`` without running their done-callbacks: the
    child of a fork, whose inherited futures can never settle (called from an at-fork
    hook, where user code must not run; no other thread survived the fork to wait)."""
    for fut in futs:
        if fut._state in (PENDING, RUNNING):
            fut._exception = exc
            fut._state = FINISHED


def set_local_result(fut: Future, value) -> None:
    """Finish a worker-local future (worker thread only; skips the lock dance)."""
    if fut._state == PENDING:
        fut._result = value
        fut._state = FINISHED
        if fut._cb:
            fut._invoke_callbacks()


def set_local_exception(fut: Future, exc: BaseException) -> None:
    if fut._state == PENDING:
        fut._exception = exc
        fut._state = FINISHED
        if fut._cb:
            fut._invoke_callbacks()
