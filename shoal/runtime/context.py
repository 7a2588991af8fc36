"""Where the calling code runs: inside a worker's task, or in a driver with pilots.

``worker`` is the worker loop of this process (set once by the worker main, never
in a driver).  ``pilots`` is the stack of pilots entered with ``with`` (or
started) in this driver process; ``shoal.spawn`` outside a task submits to the
innermost one.  It holds *weak* references: a pilot nobody holds any more is
collected and closed (``Pilot.__del__``), like a dropped ``ProcessPoolExecutor``.
Module globals rather than thread-locals: a worker is single-threaded and the
driver's pilots are process-wide objects.

Interpreter exit (the stdlib executors' semantics): ``_at_exit`` runs before
non-daemon threads are joined; from then on ``exiting`` is True, every open
pilot refuses new work (``RuntimeError``), and its pending work finishes before
the process exits (unless it was cancelled).
"""

from __future__ import annotations

import logging
import threading
import weakref

worker = None  # the Worker loop when this process is a shoal worker
pilots: list = []  # weak references to the open pilots of this driver process, innermost last
backends: weakref.WeakSet = weakref.WeakSet()  # backends of open (or closing) pilots
exiting = False  # the interpreter is shutting down: no new work
# module -> modules a worker imports right after it (``shoal.runtime.post_import``): an
# integration the driver imported registers itself there, e.g. the joblib backend once a
# task imports joblib.parallel (set in the driver, sent with every worker's start spec)
worker_after_import: dict[str, set[str]] = {}
loading: str | None = None  # what this shoal worker is unpickling now (a task's function or
#                             arguments): no pilot may start then (refuse_while_loading)


def refuse_while_loading() -> None:
    """A pilot started while a worker unpickles a task: the module imported for it starts one
    at import time, and would start one in every worker (the driver then waited forever).
    multiprocessing refuses the same with "An attempt has been made to start a new process
    before the current process has finished its bootstrapping phase"."""
    if loading is not None:
        raise RuntimeError(
            f"shoal.Pilot() was called while a shoal worker was loading {loading}: a module "
            f"imported to unpickle it starts a pilot when it is imported. Guard the script's "
            f"entry point with `if __name__ == '__main__':` (multiprocessing needs the same), "
            f"so that importing the module only defines its functions")


def push_pilot(pilot, backend) -> None:
    """``pilot`` opened, running on ``backend`` (closed at interpreter exit if still open)."""
    if exiting:
        raise RuntimeError("cannot start a shoal.Pilot after interpreter shutdown")
    pilots.append(weakref.ref(pilot))
    backends.add(backend)


def drop_pilot(pilot) -> None:
    pilots[:] = [r for r in pilots if r() is not None and r() is not pilot]


def current_pilot():
    while pilots:
        pilot = pilots[-1]()
        if pilot is not None:
            return pilot
        pilots.pop()
    raise RuntimeError(
        "shoal.spawn() was called outside a task and no shoal.Pilot is open; "
        "open one with `with shoal.Pilot() as pilot:` first"
    )


def close_quietly(backend) -> None:
    """Close a backend whose pilot was dropped: its pending work finishes first."""
    try:
        backend.close()
    except Exception:  # noqa: BLE001 - nobody is left to tell but the log
        logging.getLogger("shoal.runtime").exception("shoal: closing a dropped pilot failed")


def _at_exit() -> None:
    global exiting
    exiting = True
    open_ = list(backends)
    for backend in open_:
        backend.closing = True  # refuse new work everywhere first, then wait
    for backend in open_:
        close_quietly(backend)


try:
    threading._register_atexit(_at_exit)  # before non-daemon threads are joined, as the stdlib
except (AttributeError, RuntimeError):  # pragma: no cover - another Python, or already exiting
    import atexit

    atexit.register(_at_exit)
