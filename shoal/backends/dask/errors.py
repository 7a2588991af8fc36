"""How failures on the dask side become shoal's exceptions (the dask backend's driver side):
a task's own exception with the shoal worker's traceback, dask's ``KilledWorker`` as
``WorkerLost``, a vanished cluster as ``BackendUnavailable``, and an argument dask cannot
serialise as the local backend's ``PicklingError`` naming the argument."""

from __future__ import annotations

import traceback

from ..._errors import BackendUnavailable, PicklingError, RemoteTraceback, WorkerLost
from .node import TB_ATTR


def unpicklable(name: str, batch: bool, args: tuple, exc: Exception) -> PicklingError:
    """The local backend's error for an argument that cannot be pickled, naming the
    culprit (dask's own message names only the object dask wraps the task in)."""
    import cloudpickle

    if batch:
        parts = [(f"map item {i}", item) for i, item in enumerate(args[3])]
    else:
        user_args, user_kwargs = args[2], args[3]
        parts = [(f"argument {i}", a) for i, a in enumerate(user_args)]
        parts += [(f"keyword argument {k!r}", v) for k, v in user_kwargs.items()]
    for where, value in parts:
        try:
            cloudpickle.dumps(value)
        except Exception as err:  # noqa: BLE001 - named below
            return PicklingError(f"cannot pickle the arguments of {name}: {where} "
                                 f"({type(value).__name__}): {err}")
    return PicklingError(f"cannot pickle the arguments of {name}: {exc}")


def unwrap(exc: BaseException, tb, key: str) -> BaseException:
    """The task's own exception with the shoal worker's traceback as ``__cause__``."""
    from distributed.scheduler import KilledWorker

    if isinstance(exc, KilledWorker):
        err = WorkerLost(f"dask workers died while running task {key}, more often than "
                         f"distributed.scheduler.allowed-failures allows; the last was "
                         f"{last_worker(exc)}: {exc}")
        err.__cause__ = exc
        return err
    text = exc.__dict__.pop(TB_ATTR, None) if hasattr(exc, "__dict__") else None
    if text is None and tb is not None:
        text = "".join(traceback.format_tb(tb))
    if text:
        exc.__cause__ = RemoteTraceback(text)
    return exc


def last_worker(exc) -> str:
    """``dask worker NAME at ADDRESS (host HOST)`` of a ``KilledWorker``'s last worker (the
    host is what a user looks for: a dask worker's address is an ip and a port)."""
    ws = getattr(exc, "last_worker", None)
    addr = getattr(ws, "address", None) or str(ws)
    name = getattr(ws, "name", None)
    host = getattr(ws, "host", None) or addr.rsplit("//", 1)[-1].rsplit(":", 1)[0]
    named = f"{name!s} " if name is not None and str(name) != addr else ""
    return f"dask worker {named}at {addr} (host {host})"


def gone(key: str, why) -> BackendUnavailable:
    return BackendUnavailable(f"task {key}: the dask cluster went away before it finished ({why})")
