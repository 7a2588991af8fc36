"""Where the calling code runs: inside a worker's task, or in a driver with pilots.

``worker`` is the worker loop of this process (set once by the worker main, never
in a driver).  ``pilots`` is the stack of pilots entered with ``with`` (or
started) in this driver process; ``shoal.spawn`` outside a task submits to the
innermost one.  Module globals rather than thread-locals: a worker is
single-threaded and the driver's pilots are process-wide objects.
"""

from __future__ import annotations

worker = None  # the Worker loop when this process is a shoal worker
pilots: list = []  # open pilots of this driver process, innermost last


def current_pilot():
    if pilots:
        return pilots[-1]
    raise RuntimeError(
        "shoal.spawn() was called outside a task and no shoal.Pilot is open; "
        "open one with `with shoal.Pilot() as pilot:` first"
    )
