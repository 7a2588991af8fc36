"""A joblib parallel backend on shoal: scikit-learn's ``n_jobs`` on shoal's workers.

Usage::

    import shoal.integrations.joblib            # registers the backend "shoal"
    with joblib.parallel_config(backend="shoal"):           # shoal's default pilot,
        cross_val_score(model, X, y, n_jobs=2)               # kept warm between calls
    with shoal.Pilot(4) as pilot, joblib.parallel_config(backend="shoal", pilot=pilot):
        GridSearchCV(model, grid, n_jobs=-1).fit(X, y)       # this pilot (local or dask)

Which pilot: ``pilot=`` if given (never closed here); else the innermost pilot
this process opened; else the *default pilot*, started on first use with as
many workers as the call asks for, kept warm between ``Parallel`` calls (loky
reuses its executor the same way; a call that asks for more workers replaces
it by a bigger one) and closed at interpreter exit or by
``close_default_pilot()``.  A forked child never uses its parent's default or
innermost pilot (their workers are the parent's): it starts its own on first
use, while a parent's pilot passed as ``pilot=`` is an error saying so.

``n_jobs`` as joblib documents it: 1 runs in the caller (no pilot at all);
``k`` runs at most ``k`` batches at once (at most the pilot's workers);
``-1`` all workers (all CPUs for the default pilot), ``-2`` all but one;
``None`` is ``default_n_jobs`` = 1, as for loky (scikit-learn's default
``n_jobs=None`` runs in the caller).

Data flow: joblib hands the backend batches of calls (``BatchedCalls``, sized
by joblib's auto-batching from measured durations); each batch is pickled
here with joblib's memmapping reducers and is one shoal task; its result
comes back pickled with joblib's backward reducers.  So numpy arrays travel as
with loky: a caller's ``np.memmap`` arrives as a memmap of the same file (a
task's writes into a ``mode="w+"``/``"r+"`` one are seen by the caller), an
array above ``max_nbytes`` (1 MB) is dumped once to a temporary folder and
arrives as a read-only memmap (``mmap_mode``), and the folder is removed when
the ``Parallel`` call ends.  On a dask pilot (other machines, no shared file
system) arrays travel by value.  The future's done callback (the pilot's
receiving thread) tells joblib, which dispatches the next batch.

Inside a shoal task, ``Parallel(backend="shoal")`` runs its batches as
children of the task (``shoal.spawn``): idle workers steal them and the
waiting task runs them itself (a help-first join), so nested loops use the
same workers instead of new processes; nested calls with no backend named
use it too at the first level of nesting, sequential below (joblib's rule
against oversubscription).  The backend is registered in workers once a task
imports joblib (``shoal.runtime.post_import``).

Failure: a task's exception reaches joblib, which aborts the call: batches
not started are cancelled; on the default pilot the running ones are
cancelled with force (their workers are replaced, as loky kills its
workers), on a pilot of the user's they finish.

Rejected: a pilot per ``Parallel`` call (each call paid seconds of worker
start and imports: scikit-learn's small calls were an order of magnitude slower
than loky's, docs/benchmarks.md);
the default pilot as the innermost open pilot (``shoal.spawn`` outside a task
would silently use a pilot the user never opened); joblib's dask backend on a
dask-backed pilot (a second scheduler between joblib and shoal); one shoal task
per call (joblib's batching already amortises the per-task cost).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import pickle
import sys
import threading

from joblib.parallel import (
    AutoBatchingMixin,
    ParallelBackendBase,
    SequentialBackend,
    register_parallel_backend,
)

import shoal
from shoal import _context
from shoal.runtime import wire

try:
    from joblib._parallel_backends import FallbackToBackend
except ImportError:  # pragma: no cover - joblib < 1.3 has it in joblib.parallel
    from joblib.parallel import FallbackToBackend


class ShoalBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's backend protocol over ``shoal.Pilot.submit`` (``shoal.spawn`` in a task)."""

    supports_timeout = True
    supports_inner_max_num_threads = False
    default_n_jobs = 1  # as loky: n_jobs=None runs in the caller

    def __init__(self, pilot: shoal.Pilot | None = None, nesting_level=None,
                 inner_max_num_threads=None, **kwargs):
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads,
                         **kwargs)
        if pilot is not None and not isinstance(pilot, shoal.Pilot):
            raise TypeError(f"pilot= must be a shoal.Pilot, got {type(pilot).__name__}")
        self.given = pilot
        self.pilot: shoal.Pilot | None = None  # the one this call runs on (configure)
        self.leased: shoal.Pilot | None = None  # the default pilot, while this call holds it
        self.jobs: _Jobs | None = None
        self.memmaps: _Memmaps | None = None

    # -- where the call runs ------------------------------------------------------------

    @property
    def in_task(self) -> bool:
        """Inside a shoal task with no pilot given: batches are children of the task."""
        return self.given is None and _context.worker is not None

    @property
    def supports_retrieve_callback(self) -> bool:
        # In a task the results are retrieved by the waiting task itself (a help-first
        # join); a done callback would run where the worker settles futures.
        return not self.in_task

    @property
    def supports_return_generator(self) -> bool:
        # joblib's unordered generator needs retrieval callbacks (as for "multiprocessing")
        return not self.in_task

    def effective_n_jobs(self, n_jobs):
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        n_jobs = int(n_jobs)
        if self.given is None and not self.in_task and _inside_dask_worker():
            return 1  # a nested call in a dask worker (a dask pilot's task): no pilot there
        capacity, bounded = self._capacity()
        if n_jobs < 0:
            return max(capacity + 1 + n_jobs, 1)
        return min(n_jobs, capacity) if bounded else n_jobs

    def _capacity(self) -> tuple[int, bool]:
        """(workers or CPUs that ``-1`` means, whether ``k`` is capped by them)."""
        if self.given is not None:
            return self.given.workers, True
        if self.in_task:
            return len(_context.worker.node_of), True
        pilot = _innermost()
        if pilot is not None:
            return pilot.workers, True
        from joblib import cpu_count

        return cpu_count(), False  # the default pilot starts with what the call asks for

    def configure(self, n_jobs=1, parallel=None, prefer=None, require=None, **backend_args):
        if self.given is not None:
            _check_usable(self.given)  # a parent's pilot in a forked child: n_jobs=1 too
        n = self.effective_n_jobs(n_jobs)
        if n == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        self.parallel = parallel
        self.backend_args = backend_args
        args = {**self.backend_kwargs, **backend_args}  # parallel_config's, then Parallel's
        unknown = sorted(set(args) - _ARGS)
        if unknown:
            raise TypeError(f"joblib backend 'shoal' got unexpected argument(s) {', '.join(unknown)}; "
                            f"it takes {', '.join(sorted(_ARGS))} (and pilot=)")
        init = (args.get("initializer"), tuple(args.get("initargs", ())))
        if self.in_task:
            self.pilot = None
        elif self.given is not None:
            self.pilot = self.given
        else:
            self.pilot = _innermost()
            if self.pilot is None:
                self.pilot = self.leased = _default.acquire(n, init)
        if init[0] is not None and self.leased is None:
            where = "inside a shoal task" if self.in_task else f"on {self.pilot!r}"
            raise ValueError(
                f"joblib's initializer= runs once in each new worker, and {where} the workers "
                "run already: pass initializer=/initargs= to shoal.Pilot(...) instead, or leave "
                "the call to the backend's default pilot (no pilot open)")
        local = self.in_task or self.pilot.backend is shoal.BackendKind.LOCAL
        self.memmaps = _Memmaps.for_call(args, getattr(parallel, "_id", None), local,
                                         auto=not self.in_task)
        self.jobs = _Jobs(n, self.pilot, self.memmaps)
        return n

    # -- the protocol ---------------------------------------------------------------------

    def submit(self, func, callback=None):
        return self.jobs.submit(func, callback, in_task=self.in_task)

    def retrieve_result_callback(self, future):
        return _unpack(future.result())

    def retrieve_result(self, out, timeout=None):
        """In a task: wait for the batch (running other tasks meanwhile), then tell joblib."""
        return self.jobs.retrieve_in_task(out, timeout)

    def abort_everything(self, ensure_ready=True):
        jobs = self.jobs
        if jobs is not None:
            jobs.abort(force=self.leased is not None)
        self._release()
        if ensure_ready:
            self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel, **self.backend_args)

    def terminate(self):
        self._release()
        self.reset_batch_stats()

    def _release(self) -> None:
        if self.memmaps is not None:
            self.memmaps.clean()
            self.memmaps = None
        self.jobs = None
        self.pilot = None
        if self.leased is not None:
            leased, self.leased = self.leased, None
            _default.release(leased)

    def get_nested_backend(self):
        nesting_level = (self.nesting_level or 0) + 1
        if nesting_level > 1:
            return SequentialBackend(nesting_level=nesting_level), None
        return ShoalBackend(nesting_level=nesting_level), None

    def __reduce__(self):
        # A nested backend travels inside every batch (joblib's BatchedCalls): only what
        # a fresh one in the worker needs, never a pilot (a driver object).
        return ShoalBackend, (None, self.nesting_level, self.inner_max_num_threads)


class _Job:
    """One batch: its pickled payload, joblib's callback, the shoal future once started,
    and (in the driver) the future joblib holds, settled from the shoal one."""

    __slots__ = ("payload", "callback", "future", "task")

    def __init__(self, payload: bytes, callback, future):
        self.payload, self.callback, self.future, self.task = payload, callback, future, None


class _Jobs:
    """At most ``limit`` batches on the pilot at once (joblib's ``n_jobs``, when the pilot
    has more workers than that); the others wait here, in order."""

    def __init__(self, limit: int, pilot: shoal.Pilot | None, memmaps: _Memmaps):
        self.limit, self.pilot, self.memmaps = limit, pilot, memmaps
        self.lock = threading.Lock()
        self.running: set[_Job] = set()
        self.waiting: collections.deque[_Job] = collections.deque()
        self.aborted = False

    def submit(self, func, callback, in_task: bool) -> _Job | cf.Future:
        job = _Job(self.memmaps.dumps(func), callback, None if in_task else cf.Future())
        with self.lock:
            start = len(self.running) < self.limit
            if start:
                self.running.add(job)
            else:
                self.waiting.append(job)
        if start:
            self._start(job)
        return job if in_task else job.future

    def _start(self, job: _Job) -> None:
        if job.future is None:  # in a task: a child on this worker's deque
            job.task = shoal.spawn(_run_batch, job.payload)
            return
        if not job.future.set_running_or_notify_cancel():
            self._finished(job)
            return
        try:
            job.task = self.pilot.submit(_run_batch, job.payload)
        except BaseException as exc:  # noqa: BLE001 - a closed pilot: joblib gets the error
            self._settle(job, None, exc)
            return
        job.task.add_done_callback(lambda task, job=job: self._done(job, task))

    def _done(self, job: _Job, task) -> None:
        if task.cancelled():
            self._settle(job, None, cf.CancelledError())
        else:
            exc = task.exception()
            self._settle(job, None if exc is not None else task.result(), exc)

    def _settle(self, job: _Job, result, exc) -> None:
        self._finished(job)
        if exc is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(exc)
        if job.callback is not None:
            job.callback(job.future)

    def _finished(self, job: _Job) -> None:
        """A batch left the pilot: start the next one waiting."""
        with self.lock:
            self.running.discard(job)
            nxt = None
            if self.waiting and not self.aborted and len(self.running) < self.limit:
                nxt = self.waiting.popleft()
                self.running.add(nxt)
        if nxt is not None:
            self._start(nxt)

    def retrieve_in_task(self, job: _Job, timeout):
        result = job.task.result(timeout)  # help-first: this worker runs tasks meanwhile
        self._finished(job)
        if job.callback is not None:
            job.callback()  # joblib dispatches the next batch (no callback thread in a task)
        return _unpack(result)

    def abort(self, force: bool) -> None:
        with self.lock:
            self.aborted = True
            waiting, self.waiting = list(self.waiting), collections.deque()
            running = list(self.running)
        for job in waiting:
            if job.future is not None:
                job.future.cancel()
        for job in running:
            task = job.task
            if task is None or task.done():
                continue
            if task.cancel() or not force or self.pilot is None:
                continue
            try:
                self.pilot.cancel(task, force=True)  # the default pilot: kill, as loky does
            except Exception:  # noqa: BLE001 - finished meanwhile, or the pilot closed
                pass


def _run_batch(payload: bytes) -> bytes:
    """A batch in a worker: unpickle, run, pickle the results with joblib's backward
    reducers (a memmap of the caller's file stays one; temporary ones become arrays)."""
    batch = pickle.loads(payload)
    return wire.cloud_dumps(batch(), _backward_reducers())


def _unpack(result: bytes):
    return pickle.loads(result)


_BACKWARD: dict | None = None


def _backward_reducers() -> dict:
    global _BACKWARD
    if _BACKWARD is None:
        try:
            import numpy as np
            from joblib._memmapping_reducer import reduce_array_memmap_backward
        except ImportError:
            _BACKWARD = {}
        else:
            _BACKWARD = {np.ndarray: reduce_array_memmap_backward,
                         np.memmap: reduce_array_memmap_backward}
    return _BACKWARD


class _Memmaps:
    """joblib's memmapping for one ``Parallel`` call: the forward reducers that pickle a
    batch (memmaps by file; arrays above ``max_nbytes`` dumped to a temporary folder once)
    and that folder, created on first need and removed by ``clean``.

    The folder's files are registered with loky's resource tracker by joblib's reducer
    (so a SIGKILLed driver's files are removed too): that helper process starts only when
    an array is large enough to be dumped."""

    def __init__(self, reducers: dict, folder: _TempFolder | None):
        self.reducers, self.folder = reducers, folder

    @classmethod
    def for_call(cls, args: dict, context_id, local: bool, auto: bool) -> _Memmaps:
        if not local:
            return cls({}, None)
        try:
            import numpy as np
            from joblib._memmapping_reducer import ArrayMemmapForwardReducer
        except ImportError:
            return cls({}, None)
        max_nbytes = args.get("max_nbytes", 1e6) if auto else None
        folder = _TempFolder(args.get("temp_folder"), context_id)
        mmap_mode = args.get("mmap_mode", "r")
        if mmap_mode is None:
            max_nbytes = None
        forward = ArrayMemmapForwardReducer(max_nbytes, folder.resolve, mmap_mode or "r",
                                            unlink_on_gc_collect=False,
                                            verbose=args.get("verbose", 0), prewarm=False)
        return cls({np.ndarray: forward, np.memmap: forward}, folder)

    def dumps(self, batch) -> bytes:
        return wire.cloud_dumps(batch, self.reducers)

    def clean(self) -> None:
        if self.folder is not None:
            self.folder.clean()


class _TempFolder:
    """joblib's ``TemporaryResourcesManager`` for one call, made on first use."""

    def __init__(self, root: str | None, context_id):
        self.root, self.context_id = root, context_id
        self.manager = None
        self.lock = threading.Lock()

    def resolve(self) -> str:
        with self.lock:
            if self.manager is None:
                from joblib._memmapping_reducer import TemporaryResourcesManager

                self.manager = TemporaryResourcesManager(self.root, context_id=self.context_id)
            return self.manager.resolve_temp_folder_name()

    def clean(self) -> None:
        with self.lock:
            manager, self.manager = self.manager, None
        if manager is not None:
            manager._clean_temporary_resources(force=False, allow_non_empty=True)


class _DefaultPilot:
    """The pilot of the calls that name none: started on first use, kept between calls.

    ``acquire(n)`` returns it with at least ``n`` workers: a smaller one is replaced by
    one of ``n`` (closed once the calls still on it release it).  Not on the stack of
    open pilots (``shoal.spawn`` outside a task must not find a pilot the user never
    opened); closed at interpreter exit with every other open pilot
    (``shoal.runtime.context``).  A forked child forgets its parent's (at-fork hook)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pilot: shoal.Pilot | None = None
        self.init: tuple = (None, ())  # the (initializer, initargs) it was started with
        self.users: dict[shoal.Pilot, int] = {}

    def acquire(self, n: int, init: tuple = (None, ())) -> shoal.Pilot:
        """The default pilot with at least ``n`` workers started with ``init``, an
        ``(initializer, initargs)`` pair (joblib's, passed on to ``shoal.Pilot``)."""
        retired = None
        with self.lock:
            pilot = self.pilot
            if pilot is not None and _unusable(pilot) is not None:
                self.users.pop(pilot, None)
                pilot = self.pilot = None
            if pilot is None or pilot.workers < n or not _same(self.init, init):
                if pilot is not None and not self.users.get(pilot):
                    retired = pilot
                initializer, initargs = init
                self.pilot = pilot = shoal.Pilot(n, initializer=initializer, initargs=initargs)
                self.init = init
                _context.drop_pilot(pilot)
            self.users[pilot] = self.users.get(pilot, 0) + 1
        if retired is not None:
            self.users.pop(retired, None)
            retired.close()
        return pilot

    def release(self, pilot: shoal.Pilot) -> None:
        with self.lock:
            left = self.users.get(pilot, 0) - 1
            if left > 0:
                self.users[pilot] = left
                return
            self.users.pop(pilot, None)
            retired = pilot if pilot is not self.pilot else None
        if retired is not None:
            retired.close()

    def close(self) -> None:
        with self.lock:
            pilot, self.pilot = self.pilot, None
            self.users.pop(pilot, None)
        if pilot is not None and _unusable(pilot) is None:
            pilot.close()

    def forget(self) -> None:
        """In a forked child: the parent's pilot is not ours (its backend already refuses
        every use, lifecycle.py ``_forked``)."""
        self.lock = threading.Lock()
        self.pilot = None
        self.init = (None, ())
        self.users = {}


_default = _DefaultPilot()
os.register_at_fork(after_in_child=_default.forget)


def close_default_pilot() -> None:
    """Close the default pilot now (its workers exit; the next call starts a new one).
    Interpreter exit does this too."""
    _default.close()


def default_pilot() -> shoal.Pilot | None:
    """The default pilot if one is running, else None (for inspection: ``.workers``)."""
    pilot = _default.pilot
    return pilot if pilot is not None and _unusable(pilot) is None else None


# what joblib passes to configure() (Parallel's and parallel_config's keywords): "context"
# is multiprocessing's (ignored: shoal starts its workers itself)
_ARGS = frozenset({"max_nbytes", "temp_folder", "mmap_mode", "verbose", "context",
                   "initializer", "initargs"})


def _same(a: tuple, b: tuple) -> bool:
    """Whether two (initializer, initargs) pairs are the same (loky's test for reusing its
    executor); objects that cannot be compared are different."""
    try:
        return a[0] is b[0] and (a[1] is b[1] or bool(a[1] == b[1]))
    except Exception:  # noqa: BLE001 - e.g. numpy arrays among initargs
        return False


def _unusable(pilot: shoal.Pilot) -> str | None:
    """Why ``pilot`` cannot run work in this process, or None."""
    backend = pilot._backend
    if not backend.closing:
        return None
    reason = getattr(backend, "_closed_reason", None)
    return reason() if reason is not None else "the pilot is closed"


def _check_usable(pilot: shoal.Pilot) -> None:
    why = _unusable(pilot)
    if why is not None:
        raise shoal.PilotClosed(f"joblib backend 'shoal' was given pilot={pilot!r}: {why}")


def _inside_dask_worker() -> bool:
    if "distributed" not in sys.modules:
        return False
    from joblib._parallel_backends import inside_dask_worker

    return inside_dask_worker()


def _innermost() -> shoal.Pilot | None:
    """The innermost pilot this process opened and can use, or None (a forked child's
    inherited ones belong to its parent)."""
    for ref in reversed(_context.pilots):
        pilot = ref()
        if pilot is not None and _unusable(pilot) is None:
            return pilot
    return None


register_parallel_backend("shoal", ShoalBackend)
# a task that imports joblib in a worker finds "shoal" registered (shoal.runtime.post_import)
_context.worker_after_import.setdefault("joblib.parallel", set()).add(__name__)

__all__ = ["ShoalBackend", "close_default_pilot", "default_pilot"]
