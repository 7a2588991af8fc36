"""``shoal.Pilot``: the public facade that holds resources and runs tasks on them.

A pilot is described by what it holds (``workers``, a ``topology``, later a
dask cluster) and picks the backend that provides it; every method forwards
to that backend through the protocol in ``shoal.runtime.api``.  Code written
against the Pilot (the skeletons in ``shoal.patterns``) therefore runs
unchanged on every backend.

Lifecycle: constructed = started (workers up); ``close()`` (or leaving the
``with`` block) waits for submitted work, or cancels it with
``cancel_pending=True`` — which is what an exception in the ``with`` body
does, so an error never leaves workers behind.  A pilot dropped without
``close()`` is closed when it is collected, and every open pilot at
interpreter exit, both after their pending work (``shoal.runtime.context``).
"""

from __future__ import annotations

import sys
import threading

from .runtime import context
from .runtime.api import BackendKind
from .runtime.future import Future
from .runtime.mapping import map_iter


class Pilot:
    """Holds workers and runs tasks on them: ``with shoal.Pilot() as pilot: ...``."""

    def __init__(self, workers: int | None = None, *, backend: str | BackendKind = BackendKind.LOCAL,
                 topology: str | None = None, trace: str | None = None, seed: int = 0,
                 dashboard: int | str | None = None, **options):
        try:
            kind = BackendKind(backend)
        except ValueError:
            choices = ", ".join(repr(k.value) for k in BackendKind)
            raise ValueError(f"unknown backend={backend!r}; choose one of {choices}") from None
        if kind is BackendKind.LOCAL:
            from .backends.local import LocalBackend

            self._backend = LocalBackend(workers, topology=topology, trace=trace, seed=seed, **options)
        else:  # BackendKind.DASK: address=, client=, cluster= or provider= (+ its options)
            if topology is not None or trace is not None:
                raise ValueError("backend='dask' takes no topology= or trace= (each dask worker's "
                                 "host has its own topology; use dask's dashboard for traces)")
            from .backends.dask import DaskBackend

            self._backend = DaskBackend(workers, seed=seed, **options)
        self.backend = kind
        self._closed = False
        self._dashboard = None
        try:
            if dashboard is not None:  # live pages: shoal.dashboard (127.0.0.1 unless "HOST:PORT")
                from .dashboard import Dashboard

                self._dashboard = Dashboard(backend=self._backend, address=dashboard)
            context.push_pilot(self)
        except BaseException:
            self._closed = True
            self._backend.close(cancel_pending=True)
            if self._dashboard is not None:
                self._dashboard.close()
            raise

    # -- work --------------------------------------------------------------------------

    def submit(self, fn, /, *args, retries: int = 0, timeout: float | None = None, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` on a worker; Futures among the arguments are dependencies.

        ``retries``: re-run up to this many times after an exception, a lost
        worker or a timeout.  ``timeout``: seconds the task may run once
        started; past it the worker is killed and replaced and the future
        gets ``shoal.TaskTimeout``.  (These two names are taken by shoal, so
        a task function cannot receive keyword arguments called so.)
        """
        return self._backend.submit(fn, args, kwargs, retries=retries, timeout=timeout)

    def map(self, fn, *iterables, ordered: bool = True, chunksize: int | None = None):
        """Lazy ``map(fn, *iterables)`` in parallel, batched adaptively, in bounded memory."""
        if self._backend.closing:
            from ._errors import PilotClosed

            raise PilotClosed("map() on a closed pilot; open a new shoal.Pilot")
        own_map = getattr(self._backend, "map", None)  # a backend may batch at its own level
        if own_map is not None:
            return own_map(fn, iterables, ordered=ordered, chunksize=chunksize)
        return map_iter(self._backend, fn, iterables, ordered=ordered, chunksize=chunksize)

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
        return getattr(self._backend, "nodes", 1)

    @property
    def topology(self):
        return self._backend.topology

    # -- lifecycle ---------------------------------------------------------------------

    def close(self, cancel_pending: bool = False) -> None:
        """Stop the workers: after the submitted work is done, or dropping it (``cancel_pending``)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._backend.close(cancel_pending=cancel_pending)
        finally:
            if self._dashboard is not None:
                self._dashboard.close()  # pages say "closed"; the port is free after this
            context.drop_pilot(self)

    def __enter__(self) -> Pilot:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel_pending=exc_type is not None)

    def __del__(self):
        # Dropped without close(): the pending work finishes, then the workers stop (what a
        # dropped ProcessPoolExecutor does), in a thread: a finalizer must not block.
        if not getattr(self, "_closed", True):
            self._closed = True
            context.drop_pilot(self)
            if context.exiting or sys.is_finalizing() or getattr(self._backend, "closed", False):
                return  # the exit handler closes it (a thread started now would never run)
            try:
                threading.Thread(target=context.close_quietly, args=(self._backend,),
                                 name="shoal-closer", daemon=True).start()
            except RuntimeError:  # interpreter shutdown: the exit handler closes it
                pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<shoal.Pilot {self.backend.value} workers={self.workers} {state}>"
