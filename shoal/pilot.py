"""``shoal.Pilot``: the public facade that holds resources and runs tasks on them.

A pilot is described by what it holds (``workers``, a ``topology``, later a
dask cluster) and picks the backend that provides it; every method forwards
to that backend through the protocol in ``shoal.runtime.api``.  Without ``backend=``: the
dask backend when a dask source is given (``provider=``, ``address=``, ...) or when this is
the batch step of a SLURM job of several nodes (one pilot over all of them,
``backends/dask/job_nodes.py``; ``SHOAL_ALL_NODES=0`` opts out), else the local one.  Code written
against the Pilot (the skeletons in ``shoal.patterns``) therefore runs
unchanged on every backend.

A Pilot is a ``concurrent.futures.Executor`` with the standard library's
semantics (``submit(fn, /, *args, **kwargs)`` passes every keyword to ``fn``;
``map(timeout=)``; ``shutdown(wait, cancel_futures)``; ``max_workers``,
``initializer``, ``initargs``, ``max_tasks_per_child``), so code that takes an
Executor takes a pilot.  shoal's own per-task options (``retries``,
``timeout``) live on ``pilot.options(...)``, which returns a view with the same
``submit``/``map``: they cannot collide with the function's keywords.  The
intended differences are listed, with reasons, in docs/guide.md ("Executor
compatibility").

Lifecycle: constructed = started (workers starting); ``shutdown()``/``close()``
(or leaving the ``with`` block) waits for submitted work, or cancels the work no
worker has started (``cancel_futures=True`` / ``cancel_pending=True``) — which
is what an exception in the ``with`` body does, so an error never leaves
workers behind.  A pilot dropped without ``close()`` is closed when it is
collected, and every open pilot at interpreter exit, both after their pending
work (``shoal.runtime.context``).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import threading

from ._errors import BrokenPilot, PilotClosed
from .runtime import context
from .runtime.api import BackendKind, SharedFactory, check_options
from .runtime.future import Future


class Pilot(cf.Executor):
    """Holds workers and runs tasks on them: ``with shoal.Pilot() as pilot: ...``."""

    def __init__(self, workers: int | None = None, *, max_workers: int | None = None,
                 backend: str | BackendKind | None = None, topology: str | None = None,
                 trace: str | None = None, seed: int = 0, initializer=None, initargs: tuple = (),
                 max_tasks_per_child: int | None = None,
                 dashboard: int | str | None = None, **options):
        context.refuse_while_loading()
        workers = _worker_count(workers, max_workers)
        try:
            kind = _backend_kind(backend, options)
        except ValueError:
            choices = ", ".join(repr(k.value) for k in BackendKind)
            raise ValueError(f"unknown backend={backend!r}; choose one of {choices}") from None
        if backend is None and kind is BackendKind.DASK and not _DASK_SOURCES & options.keys():
            options["allocation"] = True  # the nodes of this SLURM job (backends/dask/job_nodes.py)
        if kind is BackendKind.LOCAL:
            from .backends.local import LocalBackend

            self._backend = LocalBackend(workers, topology=topology, trace=trace, seed=seed,
                                         initializer=initializer, initargs=initargs,
                                         max_tasks_per_child=max_tasks_per_child, **options)
        else:  # BackendKind.DASK: address=, client=, cluster= or provider= (+ its options)
            why = (" (this is the batch step of a SLURM job of several nodes, so the pilot "
                   "spans them on dask; backend='local' or SHOAL_ALL_NODES=0 keeps it on this "
                   "node)") if backend is None and options.get("allocation") else ""
            if topology is not None or trace is not None:
                raise ValueError("backend='dask' takes no topology= or trace= (each dask worker's "
                                 "host has its own topology; use dask's dashboard for traces)" + why)
            if initializer is not None or max_tasks_per_child is not None:
                raise ValueError("backend='dask' takes no initializer= or max_tasks_per_child= "
                                 "(use a dask WorkerPlugin for per-worker set-up)" + why)
            from .backends.dask import DaskBackend

            self._backend = DaskBackend(workers, seed=seed, **options)
        self.backend = kind
        self._closed = False
        self._close_lock = threading.Lock()
        self._closer: threading.Thread | None = None
        self._dashboard = None
        try:
            if dashboard is not None:  # live pages: shoal.dashboard (127.0.0.1 unless "HOST:PORT")
                from .dashboard import Dashboard

                self._dashboard = Dashboard(backend=self._backend, address=dashboard)
            context.push_pilot(self, self._backend)
        except BaseException:
            self._closed = True
            self._backend.close(cancel_pending=True)
            if self._dashboard is not None:
                self._dashboard.close()
            raise

    # -- work --------------------------------------------------------------------------

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker; Futures among the arguments are dependencies.

        Every keyword goes to ``fn`` (as ``Executor.submit``); retries and
        timeouts are ``pilot.options(retries=..., timeout=...).submit(...)``.
        """
        return self._backend.submit(fn, args, kwargs)

    def options(self, *, retries: int = 0, timeout: float | None = None,
                resources: dict[str, float] | None = None, retry_delay=None,
                priority: int = 0, cache=None, pickle: bool = False) -> TaskOptions:
        """A view of this pilot whose ``submit``/``map`` run tasks with these options.

        ``retries``: re-run up to this many times after an exception, a lost
        worker or a timeout.  ``timeout``: seconds a task may run once started;
        past it the worker is killed and replaced and the future gets
        ``shoal.TaskTimeout``.  ``pilot.options(retries=2).submit(fn, x)``.
        ``resources``: abstract resources each task holds while it runs, e.g.
        ``{"GPU": 1}``: dask worker resources (a task runs only on a dask worker
        started with enough of them, docs/dask.md); the local backend refuses them.
        ``retry_delay``: seconds to wait before each retry, or
        ``shoal.Backoff(base=1, factor=2, cap=60, jitter=0.1)`` (1, 2, 4, ... s); nothing
        runs for the task meanwhile (``cancel()`` takes it).  Local backend; dask's own
        retries re-run at once, so dask refuses it.  ``priority``: on dask, its scheduler's
        ``priority=`` (higher first among tasks waiting for a worker); the local backend
        sends every task to a worker when submitted, so nothing waits there to be ordered
        and it refuses a priority other than 0 (docs/guide.md).
        ``cache``: a folder where each call's result is kept, keyed by the function's code by
        value and its arguments (shoal/cache.py): a call with a key already there is a finished
        future and does not run.  Values are stored in the data format; ``pickle=True`` for any
        picklable value, in a folder only you can write (docs/guide.md "Caching results").
        """
        check_options(retries, timeout, resources, retry_delay, priority)
        store = None
        if cache is not None:
            from .cache import FunctionCache

            store = FunctionCache(cache, pickle=pickle)
        elif pickle:
            raise ValueError("pilot.options(pickle=True) applies to cache=: give the cache folder too")
        return TaskOptions(self, retries, timeout, None if resources is None else dict(resources),
                           retry_delay, priority, store)

    def map(self, fn, *iterables, timeout: float | None = None, chunksize: int | None = None,
            ordered: bool = True, window_bytes: int | None = None):
        """``map(fn, *iterables)`` in parallel: results in input order (``ordered=False``:
        as they finish), batched adaptively (``chunksize`` fixes the batch size).

        Work starts at call time, within a bounded window: at most a few batches
        per worker and ``window_bytes`` bytes of pickled input (default 64 MiB)
        are in flight, and more input is read as results are consumed, so a
        generator of any length maps in bounded memory.  ``timeout`` (seconds
        from the call): ``next()`` raises ``concurrent.futures.TimeoutError``
        past it.  An item's exception is raised by ``next()`` after the results
        before it.
        """
        return self._map(fn, iterables, timeout, chunksize, ordered, window_bytes, 0, None, None)

    def _map(self, fn, iterables, timeout, chunksize, ordered, window_bytes, retries, task_timeout,
             resources):
        if self._backend.closing:
            broken = self._backend.broken
            if broken:
                raise BrokenPilot(broken)
            raise PilotClosed("cannot schedule new futures after shutdown: map() on a closed pilot; "
                              "open a new shoal.Pilot")
        return self._backend.map(fn, iterables, ordered=ordered, chunksize=chunksize, timeout=timeout,
                                 window_bytes=window_bytes, retries=retries, task_timeout=task_timeout,
                                 resources=resources)

    def get(self, dsk, keys, **kwargs):
        """dask's scheduler protocol: ``dask.compute(x, scheduler=pilot.get)`` submits the whole
        graph to this pilot as one shoal task graph (``shoal.integrations.dask``)."""
        from .integrations.dask import get

        return get(self, dsk, keys, **kwargs)

    @property
    def _max_workers(self) -> int:
        """``ProcessPoolExecutor``'s name for the worker count (dask reads it)."""
        return self._backend.n

    def cancel(self, future: Future, *, force: bool = False) -> bool:
        """Cancel ``future``'s task: like ``future.cancel()`` (False once a worker runs it;
        then the children it spawned that have not started are dropped, while the task
        itself runs on), or with ``force=True`` also a running task, by killing and
        replacing its worker (other tasks that worker was running get ``WorkerLost`` or
        their retries)."""
        if not isinstance(future, Future):
            raise TypeError(f"cancel() takes a shoal.Future, got {type(future).__name__}")
        if not force:
            if future.cancel():
                return True
            if not future.done():
                self._backend.cancel_children(future)
            return False
        return self._backend.force_cancel(future)

    def cancel_many(self, futures) -> list[bool]:
        """``[f.cancel() for f in futures]`` (the same answers, in order), with the backend's
        round trips shared: on a dask pilot one claim round for all of them instead of one
        per future (patterns that drop many futures at once)."""
        futures = list(futures)
        for f in futures:
            if not isinstance(f, Future):
                raise TypeError(f"cancel_many() takes shoal.Futures, got {type(f).__name__}")
        return self._backend.cancel_many(futures)

    def stats(self) -> dict:
        """Counters per worker (tasks run, steals by locality, idle time, messages) and driver totals."""
        return self._backend.stats()

    @property
    def dashboard_url(self) -> str | None:
        """Where the live dashboard is (``dashboard=PORT``), e.g. ``http://127.0.0.1:8787/``."""
        return None if self._dashboard is None else self._dashboard.url

    @property
    def workers(self) -> int:
        return self._backend.n

    @property
    def nodes(self) -> int:
        """Machines (node runtimes) the pilot spans now: 1 locally; dask workers on dask."""
        return self._backend.nodes

    @property
    def topology(self):
        return self._backend.topology

    @property
    def shared(self) -> SharedFactory:
        """The factory of this pilot's shared objects (``runtime.api.SharedFactory``), what
        ``SharedArray.per_node``, ``BestCell.for_pilot`` and ``Channel.for_pilot`` call."""
        return self._backend.shared

    @property
    def _broken(self):
        """Why the pilot cannot run tasks (a worker's initializer failed), or False
        (the attribute ``ProcessPoolExecutor`` has, under the same name)."""
        return self._backend.broken or False

    # -- lifecycle ---------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; free the workers once the submitted work is done.

        ``cancel_futures``: cancel the tasks no worker has started (running ones
        finish).  ``wait=False`` returns at once; the pilot closes in the
        background (a non-daemon thread, so the interpreter's exit waits for it).
        """
        if cancel_futures:
            self._backend.closing = True  # no new work while cancelling
            self._backend.cancel_pending()
        if wait:
            self.close()
            return
        with self._close_lock:
            if self._closed or self._closer is not None:
                return
            self._backend.closing = True
            self._closer = threading.Thread(target=self.close, name="shoal-shutdown")
            self._closer.start()

    def close(self, cancel_pending: bool = False, *, wait: bool = True) -> None:
        """Stop the workers: after the submitted work is done, or dropping it (``cancel_pending``).

        ``wait=False``: do not wait for running tasks either -- cancel what has not started
        and stop what runs now (their futures fail with ``PilotClosed``; local workers get a
        quarter of a second to exit, then SIGKILL).  Leaving a ``with`` block on
        ``KeyboardInterrupt`` does this, so Ctrl-C returns within about a second even with
        long tasks running; to let them finish instead, catch it inside the block and call
        ``pilot.close(cancel_pending=True)`` (wait=True) there.  Leaving the block on any other
        exception cancels the pending work and lets running tasks finish (up to 5 s)."""
        closer = self._closer
        if closer is not None and closer is not threading.current_thread():
            closer.join()
            return
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._backend.close(cancel_pending=cancel_pending, wait=wait)
        finally:
            if self._dashboard is not None:
                self._dashboard.close()  # pages say "closed"; the port is free after this
            context.drop_pilot(self)

    def __enter__(self) -> Pilot:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Ctrl-C means "stop": nothing pending starts, nothing running is waited for
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        self.close(cancel_pending=exc_type is not None, wait=not interrupted)

    def __del__(self):
        # Dropped without close(): the pending work finishes, then the workers stop (what a
        # dropped ProcessPoolExecutor does), in a thread: a finalizer must not block.
        if not getattr(self, "_closed", True):
            self._closed = True
            context.drop_pilot(self)
            if getattr(self, "_dashboard", None) is not None:  # its pages say closed, port freed
                try:
                    threading.Thread(target=self._dashboard.close, name="shoal-dashboard-closer",
                                     daemon=True).start()
                except RuntimeError:
                    pass
            if context.exiting or sys.is_finalizing() or self._backend.closed:
                return  # the exit handler closes it (a thread started now would never run)
            try:
                threading.Thread(target=context.close_quietly, args=(self._backend,),
                                 name="shoal-closer", daemon=True).start()
            except RuntimeError:  # interpreter shutdown: the exit handler closes it
                pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<shoal.Pilot {self.backend.value} workers={self.workers} {state}>"


class TaskOptions:
    """``pilot.options(retries=..., timeout=...)``: ``submit``/``map`` with per-task options."""

    __slots__ = ("pilot", "retries", "timeout", "resources", "retry_delay", "priority", "cache")

    def __init__(self, pilot: Pilot, retries: int, timeout: float | None,
                 resources: dict[str, float] | None = None, retry_delay=None, priority: int = 0,
                 cache=None):
        self.pilot, self.retries, self.timeout, self.resources = pilot, retries, timeout, resources
        self.retry_delay, self.priority = retry_delay, priority
        self.cache = cache  # a shoal.cache.FunctionCache, or None

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """``pilot.submit`` with these options; every keyword goes to ``fn``."""
        if self.cache is not None:
            from .cache import submit_cached

            return submit_cached(lambda f, a, k: self._submit(f, a, k), self.cache, fn, args, kwargs)
        return self._submit(fn, args, kwargs)

    def _submit(self, fn, args, kwargs) -> Future:
        if self.retry_delay is None and not self.priority:
            return self.pilot._backend.submit(fn, args, kwargs, retries=self.retries, timeout=self.timeout,
                                              resources=self.resources)
        return self.pilot._backend.submit(fn, args, kwargs, retries=self.retries, timeout=self.timeout,
                                          resources=self.resources, retry_delay=self.retry_delay,
                                          priority=self.priority)

    def map(self, fn, *iterables, timeout: float | None = None, chunksize: int | None = None,
            ordered: bool = True, window_bytes: int | None = None):
        """``pilot.map`` whose batches run with these options (``timeout`` here is the
        map's, as in ``Pilot.map``; the per-batch one is the option).  ``retry_delay`` and
        ``priority`` apply to ``submit`` only: a map is refused with them."""
        if self.retry_delay is not None or self.priority or self.cache is not None:
            raise ValueError("pilot.options(retry_delay=/priority=/cache=).map(...): these apply to "
                             "submit; submit the items one by one, or map without them")
        return self.pilot._map(fn, iterables, timeout, chunksize, ordered, window_bytes,
                               self.retries, self.timeout, self.resources)

    def __repr__(self) -> str:
        res = "" if self.resources is None else f" resources={self.resources}"
        res += "" if self.retry_delay is None else f" retry_delay={self.retry_delay!r}"
        res += f" priority={self.priority}" if self.priority else ""
        res += f" cache={self.cache.path!r}" if self.cache is not None else ""
        return f"<shoal.Pilot.options retries={self.retries} timeout={self.timeout}{res}>"


_DASK_SOURCES = frozenset(("address", "client", "cluster", "provider", "allocation"))


def _backend_kind(backend, options: dict) -> BackendKind:
    """The backend asked for; without ``backend=``: dask when a dask source is given
    (``provider="slurm"``, ``address=``, ...) or when this process is the batch step of a
    SLURM job of several nodes (``job_nodes.spans_job``: one pilot over all of them, unless
    ``SHOAL_ALL_NODES=0``), else local.  ``backend="local"`` always stays on this node."""
    if backend is not None:
        return BackendKind(backend)
    if _DASK_SOURCES & options.keys():
        return BackendKind.DASK
    env = os.environ
    if env.get("SLURM_JOB_ID") and not env.get("SLURM_STEP_ID"):  # cheap: no import outside
        from .backends.dask.job_nodes import spans_job  # (distributed is a dependency)

        if spans_job(env):
            return BackendKind.DASK
    return BackendKind.LOCAL


def _worker_count(workers, max_workers):
    """``workers`` or its stdlib name ``max_workers`` (not both); > 0 when given."""
    name = "workers"
    if max_workers is not None:
        if workers is not None and workers != max_workers:
            raise TypeError(f"give workers= or max_workers= (the same thing), not both: "
                            f"workers={workers!r}, max_workers={max_workers!r}")
        workers, name = max_workers, "max_workers"
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"{name} must be an int or None, got {name}={workers!r}")
    if workers <= 0:
        raise ValueError(f"{name} must be greater than 0, got {name}={workers}")
    return workers
