"""Submitting to the local backend: from a user thread to a worker's ring.

Data flow: ``submit`` → a ``_Task`` record in ``tasks`` (the driver's table of
outstanding work) → either pushed at once to the worker ``Placement`` picks, or, once
every worker has ``_STAGE_LOAD`` tasks outstanding, held in ``staged`` and pushed
``_BATCH`` at a time (one placement decision, one ``Outbox.send_many``, one doorbell).
Tasks whose arguments hold futures wait in ``waiting`` until those are done
(``_submit_later``).  Functions travel once (``DEFINE``, ``FunctionTable``); a task
carries its function's id.

Invariants (all under ``lock``):
* A task is in ``staged`` or has ``where`` set (the endpoint holding it, as far as the
  driver knows), never both; ``placed`` is the endpoint whose placement load counts it.
* Who stages makes sure someone flushes: staging happens only while every worker has a
  backlog, so results are on their way and the pump flushes every round.
* A task that does not fit its ring waits in the outbox's pending queue under a number
  (``queued``/``queued_in``): ``cancel()`` takes such a task back instead of racing it.
* A re-send (``_dispatch``: a worker died, a thief died) never sends a cancelled task,
  and sends a task a ``cancel()`` is deciding about behind a CANCEL_IF_QUEUED.

Rejected: a submit queue drained by a sender thread (one more GIL hand-off per task);
staging from the first task (a lone submit would wait for a batch); pickling outside
the lock in one call per batch (the fast path is already a single ``dumps`` call).
"""

from __future__ import annotations

import types

from ..._errors import BrokenPilot, PilotClosed, SerializationError
from ...runtime import graph, wire
from ...runtime.api import check_options as _check_options
from ...runtime.api import settle as _settle
from ...runtime.future import Future
from ...runtime.wire import Kind

_CACHEABLE = (types.FunctionType, types.BuiltinFunctionType)
_ATOMIC = graph.ATOMIC
_CANCELLED = "CANCELLED"
_PENDING = "PENDING"
_NO_RESOURCES = ("resources={!r}: the local backend has no worker resources to reserve (they are "
                 "dask worker resources: backend='dask'); on one machine, give the task its CPUs "
                 "with workers= and its devices through the environment (CUDA_VISIBLE_DEVICES)")
_NO_PRIORITY = ("priority={!r}: the local backend sends each task to a worker's ring when it is "
                "submitted, so no task waits where a priority could order it; submit the urgent "
                "tasks first, or run them as shoal.ensemble tasks (Task(priority=)), whose engine "
                "holds ready tasks back; dask's scheduler takes priority= (backend='dask')")
# Submit batching: once every worker has _STAGE_LOAD tasks outstanding, new tasks wait in
# ``staged`` and go out _BATCH at a time (one placement decision, one doorbell); below
# that load each task is pushed at once, so a lone submit never waits.
_BATCH = 32
_STAGE_LOAD = 64
_pack_task = wire.TASK_HDR.pack
_TASK = wire.TASK
_dumps = wire.pickle.dumps


class _Task:
    """Driver-side record of one outstanding task."""

    __slots__ = ("future", "msg", "retries", "timeout", "placed", "where", "fn", "queued", "queued_in",
                 "cancelling", "lost_on", "handed_by", "delayed")

    def __init__(self, future, msg, retries, timeout, fn):
        self.future = future
        self.msg = msg  # the TASK message, kept for resubmission
        self.retries = retries
        self.timeout = timeout
        self.placed = 0  # endpoint chosen by Placement (its load counts this task)
        self.where = 0  # endpoint that holds it now, as far as the driver knows
        self.fn = fn
        self.queued = 0  # its number in the pending queue of outbox ``queued_in`` (Outbox.send)
        self.queued_in = None  # (a stolen task has left it: ``where`` is then another worker)
        # cancel() told the workers to drop it (CANCEL_IF_QUEUED) and has not found it
        # running: a re-send (a worker died) must carry that too; True also once cancelled
        self.cancelling = False
        # (endpoint, generation) of a dead worker that had started it after stealing it, the
        # victim's MOVED still on its way: that MOVED must not re-place it (lifecycle.py)
        self.lost_on = None
        # (endpoint, generation) of the worker whose MOVED last said it handed the task on:
        # if that worker dies, its LOOT may have died with it in its outbox (lifecycle.py)
        self.handed_by = None
        # waiting out its retry_delay in the driver (Retries): no worker holds it, whatever a
        # worker's status cell still says of the attempt that failed
        self.delayed = False

    @property
    def name(self) -> str:
        return f"{wire.describe(self.fn)} ({self.future.task_id:#x})"


class Submitting:
    """``LocalBackend``'s submit side (a mixin: the state is the backend's)."""

    def submit(self, fn, args: tuple, kwargs: dict, *, retries: int = 0, timeout: float | None = None,
               resources=None, retry_delay=None, priority: int = 0) -> Future:
        # The hot path of tiny tasks: every line here costs ~0.1 us per task.
        if self.closing:
            if self.broken is not None:
                raise BrokenPilot(self.broken)
            raise PilotClosed(self._closed_reason())
        if (type(retries) is not int or retries or timeout is not None or resources is not None
                or retry_delay is not None or priority):
            _check_options(retries, timeout, None, retry_delay, priority)
            if resources is not None:
                raise ValueError(_NO_RESOURCES.format(resources))
            if priority:
                raise ValueError(_NO_PRIORITY.format(priority))
        fut = Future()
        tid = fut.task_id = next(self.ids)
        fut._canceller = self._cancel_cb  # made once: a bound method per future is GC work
        fut._prober = self._probe_cb
        if retry_delay is not None and retries:
            self.retries.remember(tid, retry_delay)  # pump.py's _fail_or_retry asks it
        entry = self.fn_ids.get(id(fn))
        if entry is not None and not kwargs and not retries and timeout is None:
            # The fast path: a function the workers know, plain positional arguments (no
            # futures among them, nothing pickle could refuse or send by reference).
            for v in args:
                if type(v) not in _ATOMIC:
                    break
            else:
                task = _Task(fut, _pack_task(_TASK, 0, entry[0], tid) + _dumps((args, kwargs), 5),
                             0, None, fn)
                with self.lock:
                    self.tasks[tid] = task
                    staged = self.staged
                    staged.append(task)
                    if len(staged) >= _BATCH or self.placement.min_load() < _STAGE_LOAD or self.down:
                        self._flush_staged()
                return fut
        if (args and graph.any_future(args)) or (kwargs and graph.any_future(kwargs.values())):
            if not callable(fn):
                raise TypeError(f"submit() needs a callable, got {type(fn).__name__} {fn!r}")
            self._submit_later(fut, fn, args, kwargs, retries, timeout)
            return fut
        try:
            self._submit_now(fut, fn, args, kwargs, retries, timeout)
        except SerializationError as exc:
            fut.set_exception(exc)  # the error belongs to this task, not to the caller's loop
        return fut

    def _submit_now(self, fut, fn, args, kwargs, retries, timeout) -> None:
        flags = wire.TIMED if timeout is not None else 0
        entry = self.fn_ids.get(id(fn))
        if entry is not None:
            fn_id = entry[0]
            try:  # wire.dump_args inlined (the hot path); anything unusual goes through it
                payload = _dumps((args, kwargs), 5)
                if b"main__" in payload:
                    payload = wire.dump_args(args, kwargs, fn)
            except Exception:
                payload = wire.dump_args(args, kwargs, fn)
        elif type(fn) in _CACHEABLE and self._fn_id(fn):
            fn_id = self._fn_id(fn)
            payload = wire.dump_args(args, kwargs, fn)
        elif callable(fn):  # bound methods, partials, callable objects: their state may change
            fn_id = 0
            flags |= wire.INLINE_FN
            payload = wire.dump_inline(fn, args, kwargs)
        else:
            raise TypeError(f"submit() needs a callable, got {type(fn).__name__} {fn!r}")
        tid = fut.task_id
        task = _Task(fut, _pack_task(_TASK, flags, fn_id, tid) + payload, retries, timeout, fn)
        with self.lock:
            if fut._state == _CANCELLED:
                return
            self.tasks[tid] = task
            staged = self.staged
            staged.append(task)
            if len(staged) >= _BATCH or self.placement.min_load() < _STAGE_LOAD or self.down:
                self._flush_staged()

    def _flush_staged(self) -> None:
        """Push the staged tasks (lock held): one placement decision and one doorbell for
        the batch.  Who stages makes sure someone flushes: a task is staged only while
        every worker has ``_STAGE_LOAD`` tasks outstanding, so results are on their way
        and the pump, which flushes every round (and never parks with tasks staged),
        is awake soon; ``cancel()`` takes a staged task out first (``_probe``)."""
        staged, self.staged = self.staged, []
        live = [t for t in staged if t.future._state == _PENDING]  # cancelled ones stay here
        if not live:
            return
        if self.down:  # a worker has no process now: _dispatch finds live ones
            for task in live:
                self._dispatch(task)
            return
        w = self.placement.choose()
        if self.health.stopped and w + 1 in self.health.stopped:
            w = self._choose_usable(w)  # stopped.py: not on a worker known to be stopped
        self.placement.submitted(w, len(live))
        ep = w + 1
        for task in live:
            task.placed = task.where = ep
        box = self.out[ep]
        waiting = box.send_many([t.msg for t in live])
        if waiting:  # behind a backlog: numbered, so cancel() can take them back
            number = box.queued - waiting
            for task in live[-waiting:]:
                number += 1
                task.queued = number
                task.queued_in = box
            self.doorbell.ring()

    def _submit_later(self, fut, fn, args, kwargs, retries, timeout) -> None:
        """Hold a task until the futures among its arguments are done, then send it.

        From now on the task counts as outstanding (``waiting``): ``close`` waits
        for it, ``close(cancel_pending=True)`` cancels it."""
        deps = graph.collect_futures((args, kwargs))
        with self.lock:
            self.waiting[fut.task_id] = fut

        def on_deps_done():
            with self.lock:
                self.waiting.pop(fut.task_id, None)
            if fut.done():
                return
            err = graph.failed_dependency(deps)
            if err is not None:
                _settle(fut, False, err)
                return
            try:
                self._submit_now(fut, fn, graph.resolve(args), graph.resolve(kwargs), retries, timeout)
            except BaseException as exc:  # noqa: BLE001 - the task's own failure
                _settle(fut, False, exc)

        graph.when_done(deps, on_deps_done)

    def _fn_id(self, fn) -> int:
        """The id under which the workers know ``fn``; 0: send it with the task instead
        (``shoal.runtime.functions``: bounded, lambdas on second use, quarantine)."""
        entry = self.fn_ids.get(id(fn))
        if entry is not None:
            return entry[0]
        with self.lock:
            if not self.functions.wants(fn):
                return 0
        blob = wire.dump_function(fn)
        with self.lock:
            entry = self.fn_ids.get(id(fn))
            if entry is not None:
                return entry[0]
            fn_id, msg = self.functions.define(fn, blob)
            for ep in self.endpoints:
                self._send(ep, msg, wake=False)
        return fn_id

    def function_of(self, fn_id: int):
        """The function sent to the workers under ``fn_id`` (None if unknown)."""
        return self.functions.function_of(fn_id)

    def _send(self, ep: int, msg: bytes, wake: bool = True) -> int:
        """Send to a worker (lock held).  What does not fit waits in the outbox; the pump
        flushes it, so the pump must not sleep through it: ring its doorbell.  Returns
        the message's number in the outbox's pending queue (0: it is in the ring)."""
        box = self.out[ep]
        waits = box.send(msg, wake)
        if box.pending:
            self.doorbell.ring()
        return waits

    def _dispatch(self, task: _Task) -> None:
        """Send a task to a worker (lock held).  A task a cancel() is deciding about goes
        with a CANCEL_IF_QUEUED ahead of it: the worker it went to before (dead now) had
        been told to drop it, and this one must be too."""
        if task.placed:
            self.placement.finished(task.placed - 1)
            task.placed = 0
        if task.cancelling and task.future._state != _PENDING:
            return  # cancelled: it must never run, and nobody waits for it
        w = self.placement.choose()
        if self.down and w + 1 in self.down:  # no process there now: any live worker
            live = self.health.live(self.endpoints)
            if live:
                w = live[task.future.task_id % len(live)] - 1
        if self.health.stopped and w + 1 in self.health.stopped:
            w = self._choose_usable(w)  # stopped.py: not on a worker known to be stopped
        self.placement.submitted(w)
        ep = w + 1
        task.placed = task.where = ep
        task.handed_by = None
        if task.cancelling:  # ahead of the task in the same queue: dropped when it comes up
            self._send(ep, wire.encode_control(Kind.CANCEL_IF_QUEUED, [task.future.task_id]), wake=False)
        task.queued = self._send(ep, task.msg)
        task.queued_in = self.out[ep]
