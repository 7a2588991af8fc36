"""The backend protocol: what every backend (local, dask) implements for ``shoal.Pilot``.

The Pilot facade (``shoal/pilot.py``) picks a backend and forwards to it;
patterns and workloads see only the Pilot, so they run unchanged on every
backend.  Generic behaviour built on ``submit`` alone — ``map``'s adaptive
batching — lives in ``shoal.runtime.mapping`` so each backend gets it free.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from .future import Future


class BackendKind(enum.Enum):
    LOCAL = "local"
    DASK = "dask"


class Backend(Protocol):
    """What a Pilot needs from a backend (any thread may call these)."""

    n: int  # workers

    def submit(self, fn, args: tuple, kwargs: dict, *, retries: int = 0,
               timeout: float | None = None) -> Future: ...

    def stats(self, timeout: float = 2.0) -> dict[str, Any]: ...

    def close(self, cancel_pending: bool = False) -> None: ...

    # Optional: ``map(fn, iterables, *, ordered, chunksize)`` -> iterator.  When a backend
    # has it, ``Pilot.map`` uses it instead of ``mapping.map_iter`` over ``submit`` (the dask
    # backend batches at two levels: dask tasks between hosts, shoal tasks inside each).
