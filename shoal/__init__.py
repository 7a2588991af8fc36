"""shoal: a task-parallel runtime with lock-free shared-memory queues and work stealing.

Public surface (a test checks it)::

    with shoal.Pilot() as pilot:            # worker processes, one per usable CPU
        fut = pilot.submit(fn, *args)       # shoal.Future (a concurrent.futures.Future)
        for y in pilot.map(fn, items): ...  # lazy, adaptively batched
        pilot.options(retries=2, timeout=60).submit(fn, *args)   # per-task options
    shoal.spawn(fn, *args)                  # inside a task: a child on this worker's deque
    shoal.allocation()                      # the SLURM/PBS job this process runs in, or None
    shoal.publish("train", epoch=3, loss=0.4)  # a progress record for the dashboard
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ._backoff import Backoff
from ._errors import (
    BackendUnavailable,
    BrokenPilot,
    PicklingError,
    PilotClosed,
    RemoteTraceback,
    SerializationError,
    ShoalError,
    TaskTimeout,
    TopologyError,
    UnpicklingError,
    WorkerLost,
)
from .pilot import Pilot
from .runtime import context as _context
from .runtime.allocation import Allocation
from .runtime.allocation import current as allocation
from .runtime.api import BackendKind
from .runtime.future import Future
from .runtime.progress import publish
from .runtime.shared import BestCell, Channel, Sense, SharedArray
from .runtime.topology import NumaNode, Topology, topology


def __getattr__(name: str):
    # __version__ is looked up lazily: importlib.metadata costs ~10 ms, paid by
    # every worker process at start-up otherwise.
    if name == "__version__":
        try:
            from importlib.metadata import version

            return version("shoal")
        except Exception:  # pragma: no cover - running from a source tree
            return "0+unknown"
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")


@dataclass(frozen=True)
class WorkerInfo:
    """Where the calling task runs, and how deep: a snapshot taken by ``current_worker()``.

    ``nesting``: tasks on this worker's stack at the call, the calling one included.
    A task the worker took from its deque or a thief's loot is at 1; a task it runs
    while another task waits in a help-first join (``result()`` of a spawned child
    inside a task) is one more than that task.  ``max_nesting``: how many nested
    tasks this worker's (raised) recursion limit affords, 256 in a shoal worker.  A
    task that splits work should stop splitting at ``nesting >= max_nesting`` and
    finish sequentially: its children would otherwise nest joins deeper still.
    ``hungry()`` is a live read, not part of the snapshot.
    """

    id: int  # endpoint number, 1..N
    cpu: int
    node: int  # NUMA node
    pid: int
    workers: int  # N: the workers of this runtime (on dask: of this worker's machine)
    nesting: int = 1
    max_nesting: int = 256

    def hungry(self) -> int:
        """How many of the other ``workers`` are idle right now: looking for work or asleep
        after asking every victim in vain (a read of their status words, ~0.1 us each).

        Only in the worker this describes (a task running there): elsewhere it is a
        RuntimeError, since the answer would be about another process's peers.
        """
        worker = _context.worker
        if worker is None or worker.ep != self.id or os.getpid() != self.pid:
            raise RuntimeError(
                f"WorkerInfo.hungry() reads the status of worker {self.id} (pid {self.pid})'s "
                "peers live; call it in a task running on that worker")
        return worker.hungry_peers()


def cached(path, *, pickle: bool = False):
    """A decorator: each call's result is kept in the folder ``path``, keyed by the function's
    code by value (with the code of the helpers of your own modules it calls) and its arguments
    as data; a later call with the same key -- in this process or another run -- returns it
    without running.  Values are stored in the ensemble journal's data format; ``pickle=True``
    stores any picklable value, for folders only you can write (docs/guide.md "Caching
    results").  ``pilot.options(cache=path).submit(fn, ...)`` is the same for pilot tasks::

        @shoal.cached("cache/")
        def simulate(n, seed):
            ...
    """
    from .cache import cached as decorate  # needs the ensemble's data format: imported on use

    return decorate(path, pickle=pickle)


def spawn(fn, /, *args, **kwargs) -> Future:
    """Run ``fn(*args, **kwargs)`` as a child task.

    Inside a task: pushed on this worker's own deque (idle workers steal it);
    ``.result()`` on it runs other tasks while it waits.  Outside a task: like
    ``submit`` on the innermost open pilot.
    """
    worker = _context.worker
    if worker is not None:
        if not callable(fn):
            raise TypeError(f"spawn() needs a callable, got {type(fn).__name__} {fn!r}")
        return worker.spawn(fn, args, kwargs)
    return _context.current_pilot().submit(fn, *args, **kwargs)


def current_worker() -> WorkerInfo | None:
    """The worker running the calling task, or None in the driver."""
    worker = _context.worker
    if worker is None:
        return None
    return WorkerInfo(worker.ep, worker.cpu, worker.node, os.getpid(), len(worker.node_of),
                      worker.depth, worker.max_nesting())


__all__ = [
    "Pilot",
    "cached",
    "Future",
    "Backoff",
    "spawn",
    "current_worker",
    "publish",
    "WorkerInfo",
    "SharedArray",
    "BestCell",
    "Channel",
    "Sense",
    "topology",
    "Topology",
    "allocation",
    "Allocation",
    "NumaNode",
    "BackendKind",
    "ShoalError",
    "BackendUnavailable",
    "TopologyError",
    "PilotClosed",
    "TaskTimeout",
    "WorkerLost",
    "SerializationError",
    "PicklingError",
    "UnpicklingError",
    "BrokenPilot",
    "RemoteTraceback",
]
