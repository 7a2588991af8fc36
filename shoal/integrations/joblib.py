"""A joblib parallel backend on a shoal pilot: scikit-learn's ``n_jobs`` on shoal's workers.

Usage::

    import shoal.integrations.joblib            # registers the backend "shoal"
    with joblib.parallel_config(backend="shoal"):           # a pilot per Parallel call,
        cross_val_score(model, X, y, n_jobs=2)               # n_jobs workers
    with shoal.Pilot(4) as pilot, joblib.parallel_config(backend="shoal", pilot=pilot):
        GridSearchCV(model, grid, n_jobs=-1).fit(X, y)       # this pilot (local or dask)

Data flow: joblib hands the backend batches of calls (``BatchedCalls``, sized
by joblib's auto-batching from measured durations); each batch is one
``pilot.submit``; the future's done callback (run by the pilot's receiving
thread) tells joblib, which dispatches the next batch.  With ``pilot=`` the
backend uses that pilot and never closes it; without, it uses the innermost
open pilot, else starts one with ``n_jobs`` workers for the ``Parallel`` call
and closes it after.

Failure: a task's exception reaches joblib, which cancels the rest
(``abort_everything``: the batches not started are cancelled, a pilot of our
own is closed).  Nested ``Parallel`` calls inside a task run sequentially
(joblib's rule for nested process backends).

Rejected: joblib's dask backend on a dask-backed pilot (a second scheduler
between joblib and shoal); one shoal task per call (joblib's batching already
amortises the per-task cost and adapts to the call duration).
"""

from __future__ import annotations

import os

from joblib.parallel import (
    AutoBatchingMixin,
    ParallelBackendBase,
    SequentialBackend,
    register_parallel_backend,
)

import shoal
from shoal import _context


class ShoalBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib's backend protocol over ``shoal.Pilot.submit``."""

    supports_retrieve_callback = True
    supports_timeout = True
    default_n_jobs = -1  # every usable CPU, like loky

    def __init__(self, pilot: shoal.Pilot | None = None, **kwargs):
        super().__init__(**kwargs)
        if pilot is not None and not isinstance(pilot, shoal.Pilot):
            raise TypeError(f"pilot= must be a shoal.Pilot, got {type(pilot).__name__}")
        self.given = pilot
        self.own: shoal.Pilot | None = None
        self.futures: set = set()

    @property
    def pilot(self) -> shoal.Pilot | None:
        if self.given is not None:
            return self.given
        if self.own is not None:
            return self.own
        return _innermost()

    def effective_n_jobs(self, n_jobs):
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        pilot = self.given or _innermost()
        if pilot is not None:
            return pilot.workers
        if n_jobs is None:
            n_jobs = self.default_n_jobs
        if n_jobs < 0:
            n_jobs = max(len(os.sched_getaffinity(0)) + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs=1, parallel=None, **backend_args):
        self.parallel = parallel
        n = self.effective_n_jobs(n_jobs)
        if self.pilot is None:
            self.own = shoal.Pilot(n)
        return n

    def submit(self, func, callback=None):
        fut = self.pilot.submit(func)
        self.futures.add(fut)
        fut.add_done_callback(self.futures.discard)
        if callback is not None:
            fut.add_done_callback(callback)
        return fut

    def retrieve_result_callback(self, future):
        return future.result()

    def abort_everything(self, ensure_ready=True):
        for fut in list(self.futures):
            fut.cancel()
        self.futures.clear()
        if self.own is not None:
            self.own.close(cancel_pending=True)
            self.own = None
        if ensure_ready:
            self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel)

    def terminate(self):
        if self.own is not None:
            self.own.close()
            self.own = None
        self.reset_batch_stats()

    def get_nested_backend(self):
        return SequentialBackend(nesting_level=self.nesting_level + 1), None


def _innermost() -> shoal.Pilot | None:
    """The innermost open pilot of this process, or None."""
    try:
        return _context.current_pilot()
    except RuntimeError:
        return None


register_parallel_backend("shoal", ShoalBackend)

__all__ = ["ShoalBackend"]
