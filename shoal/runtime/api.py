"""The backend protocol: everything a backend (local, dask) provides to ``shoal.Pilot``.

Data flow::

    user / patterns ─► shoal.Pilot (pilot.py: the public facade, picks a backend)
                         │ every call forwards to exactly one of the members below
                         ▼
                       Backend  ── submit / map ──► Futures (settled once, by the backend)
                         │        stats / monitor / close / cancel_* / nodes / topology
                         └─ .shared: SharedFactory ─► SharedArray.per_node, BestCell.for_pilot,
                                                      Channel.for_pilot (runtime/shared.py)

``Backend`` is the whole contract: the Pilot calls nothing else on a backend
(no ``getattr(backend, "x", None)`` probing; ``tests/test_layers.py`` forbids
reaching into another module's private attributes and checks that every
backend class has each member here with the same signature).  A capability
a backend lacks is a member that raises ``NotImplementedError`` with the
reason, so the error names the backend instead of being an ``AttributeError``.

``SharedFactory`` is the sub-protocol of the shared objects whose meaning
depends on where the tasks run: locally one memfd that the driver and every
worker map; on dask one replica per machine kept in step through the driver
(backends/dask/cells.py).  The public constructors in ``runtime/shared.py``
take a pilot and call ``pilot.shared``; they never see the backend.

Invariants every backend keeps: a Future it returned settles exactly once
(result, exception, cancelled); after ``closing`` is set, ``submit``/``map``
raise ``PilotClosed`` (or ``BrokenPilot`` with ``broken`` as the message);
``close`` is idempotent and leaves no process, thread or shared segment of the
backend behind; any thread may call any member.

The helpers at the bottom (``check_options``, ``settle``) are shared by the
backends' implementations, so no backend imports another one's private code.

Rejected: optional members discovered with ``getattr`` (a typo or a missing
method becomes a silent fallback, and the contract lives nowhere); an abstract
base class the backends inherit from (the protocol is structural: a test
double or a third backend need not import this module's classes); one
factory function per shared object on the Pilot (three public names for one
concept).
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

from .._backoff import check_retry_delay
from .future import Future

_log = logging.getLogger("shoal.runtime")


class BackendKind(enum.Enum):
    LOCAL = "local"
    DASK = "dask"


@runtime_checkable
class SharedFactory(Protocol):
    """Makes the shared objects of one pilot (``pilot.shared``; any thread).

    Each returns an object with the public interface of its runtime/shared.py
    class (``SharedArray``, ``BestCell``, ``Channel``), valid on every node the
    pilot's tasks run on.
    """

    def node_array(self, shape: tuple[int, ...], dtype, fill) -> Any:
        """``SharedArray.per_node``: an array shared by the driver and the workers of
        each node (one copy per node; the copies are independent)."""

    def best_cell(self, sense, initial: float | None) -> Any:
        """``BestCell.for_pilot``: the best value any task offered, on every node."""

    def channel(self, size: int) -> Any:
        """``Channel.for_pilot``: small messages from tasks to the driver."""


@runtime_checkable
class Backend(Protocol):
    """What a Pilot needs from a backend (any thread may call these)."""

    kind: ClassVar[str]  # BackendKind value of the class
    n: int  # shoal workers, all nodes together
    topology: Any  # this machine's Topology (local), None where each node has its own (dask)
    closing: bool  # set first by close()/shutdown(): submit and map refuse work from then on
    closed: bool  # close() has finished
    broken: str | None  # why the backend can never run tasks (a failed initializer, a batch
    #                     job that cannot start), else None
    shared: SharedFactory

    @property
    def nodes(self) -> int:
        """Machines (node runtimes) the tasks run on now: 1 locally."""

    def submit(self, fn, args: tuple, kwargs: dict, *, retries: int = 0,
               timeout: float | None = None, resources: Mapping[str, float] | None = None,
               retry_delay=None, priority: int = 0) -> Future:
        """Run ``fn(*args, **kwargs)``; Futures among the arguments are dependencies
        (``runtime/graph.py``).  ``retries``/``timeout``/``retry_delay``/``priority``:
        ``Pilot.options``;
        ``resources``: abstract resources the task holds while it runs
        (``{"GPU": 1}``; dask worker resources; the local backend refuses them)."""

    def map(self, fn, iterables: tuple[Iterable, ...], *, ordered: bool = True,
            chunksize: int | None = None, timeout: float | None = None,
            window_bytes: int | None = None, retries: int = 0, task_timeout: float | None = None,
            resources: Mapping[str, float] | None = None) -> Iterator:
        """``Pilot.map`` (``runtime/mapping.py``'s semantics); ``timeout`` is the map's,
        ``retries``/``task_timeout``/``resources`` apply to each batch."""

    def stats(self, timeout: float = 2.0) -> dict[str, Any]:
        """``{"backend", "workers": [...], "driver": {...}, ...}`` (docs/runtime.md)."""

    def monitor(self) -> dict[str, Any]:
        """A monitor's sample (the dashboard's, once a second): ``stats()``'s shape, plus
        per worker ``pid`` and state where the backend knows them without asking, and
        ``dashboard_link`` (the cluster's own dashboard, or None).  Local: never waits for
        a busy worker (the latest answers so far); dask: one ``client.run`` round trip.
        ``{"closing": True, ...}`` once the backend is closing."""

    def cancel_pending(self) -> int:
        """Cancel every task no worker has started; how many were cancelled."""

    def cancel_many(self, futs: list[Future]) -> list[bool]:
        """``Pilot.cancel_many``: each of ``futs``' own ``cancel()`` answer, in order, with
        the round trips shared (dask: one claim round for all of them; local: each
        future's cancel, a shared-memory handshake with nothing to share)."""

    def cancel_children(self, fut: Future) -> None:
        """``fut`` runs on: drop its spawned children that have not started."""

    def force_cancel(self, fut: Future) -> bool:
        """Cancel ``fut`` even while it runs (``Pilot.cancel(force=True)``)."""

    def close(self, cancel_pending: bool = False, wait: bool = True) -> None:
        """Stop after the submitted work (or cancel what has not started); ``wait=False``:
        also stop the running tasks now (their futures fail with PilotClosed); idempotent."""


# -- helpers every backend shares -----------------------------------------------------


def check_options(retries, timeout, resources=None, retry_delay=None, priority=0) -> None:
    """Validate ``Pilot.options(retries=, timeout=, resources=, retry_delay=, priority=)``
    (ValueError naming the culprit)."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got retries={retries!r}")
    check_retry_delay(retry_delay, "Pilot.options")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an int (higher starts first), got priority={priority!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0, got timeout={timeout!r}")
    if resources is not None:
        check_resources(resources)


def check_resources(resources) -> dict[str, float]:
    """``resources={"GPU": 1, ...}``: names (str) to finite amounts > 0, as a plain dict."""
    if not isinstance(resources, Mapping) or not resources:
        raise ValueError(f"resources must be a non-empty mapping of resource name to amount, "
                         f"e.g. {{'GPU': 1}}; got resources={resources!r}")
    out = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"resources: names must be non-empty strings, got {name!r}")
        if (isinstance(amount, bool) or not isinstance(amount, (int, float))
                or not math.isfinite(amount) or amount <= 0):
            raise ValueError(f"resources: the amount of {name!r} must be a number > 0, "
                             f"got {amount!r}")
        out[name] = amount
    return out


def settle(fut: Future, ok: bool, value) -> None:
    """Set ``fut``'s result (``ok``) or exception; a future cancelled meanwhile stays
    cancelled, and a done-callback that raises is logged, never propagated."""
    try:
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
    except cf.InvalidStateError:
        pass  # cancelled meanwhile
    except BaseException:  # noqa: BLE001 - a done-callback raising SystemExit, say
        _log.exception("shoal: a done-callback of %r raised", fut)
