"""A periodic call into a hot loop's main thread that costs the loop nothing per step:
``ticking(hook, period_s)`` (leaf module: stdlib and the optional ``shoal._ticker`` only).

Why: a loop that must look at the outside world now and then (the search loops: is a
worker hungry, is the search stopped?) pays for *deciding when* on every step.  The
generated count loop's countdown (``if tick: tick -= 1``) cost ~3% of an N-Queens node
and the depth argument it checked ~1%; a hand-written recursion pays neither, and that
was the whole gap to a static ``multiprocessing.Pool`` split (docs/search.md).

How: a helper thread in C (``shoal/_ticker.c``) queues a *pending call*
(``Py_AddPendingCall``) every ``period_s`` and sets the eval breaker, so the main thread
calls ``_dispatch`` at its next backward jump or call -- with no kernel signal (no
``EINTR`` for anyone), no GIL hand-over (the helper never takes the GIL) and nothing done
by the loop in between.  ``_dispatch`` calls the innermost active ``hook``: the search
loop's rebinds its recursion's closure cells to polling twins, so the *next level entry*
polls, at a point where the loop's state is whole (shapes.py).  A hook runs between any
two bytecodes of the main thread, so it must only flip state the loop reads at safe
points.  No signal handler is involved: a task's own handlers (of any signal, SIGRTMAX
included) and its ``signal.set_wakeup_fd`` descriptor see nothing of the ticks.

``available()`` is False, and callers keep their countdown, where the extension is not
built, in a thread other than the main one (dask's worker threads: only the main thread
runs pending calls), or when ``SHOAL_SEARCH_TICK=0`` (read at import: benchmarks' A/B).

Alternatives rejected: ``PyErr_SetInterruptEx(SIGRTMAX)`` and a Python handler of that
signal (the first version: a task that installed its own SIGRTMAX handler mid-search got
a phantom call per tick and the loop no polls -- no stop, no split -- and every tick wrote
a byte to an asyncio loop's wakeup fd: tests/attack/test_search_tick_break.py);
``setitimer`` (a kernel signal per tick: ``ITIMER_REAL`` at 0.2 ms cost 14% of the loop, ``ITIMER_VIRTUAL`` ticks only every 4 ms, both interrupt
system calls and are process-wide state a user may own); a Python thread that sets a
flag (the flag must be read per step, and each wake-up hands the GIL over, waiting up
to the 5 ms switch interval); ``sys.setprofile``/``settrace`` (a call per event).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

try:
    import shoal._ticker as _ticker
except ImportError:  # the optional extension was not built (no C compiler)
    _ticker = None

ENABLED = os.environ.get("SHOAL_SEARCH_TICK", "1") != "0"
_hooks: list = []  # the active loops' hooks, innermost last (main thread only)


def _dispatch(frame) -> None:
    """The tick (a pending call from the helper thread, in the main thread)."""
    if _hooks:
        _hooks[-1](frame)


def available() -> bool:
    """Can ``ticking`` run here (this thread, this process)?"""
    if not ENABLED or _ticker is None:
        return False
    return threading.current_thread() is threading.main_thread()


def nudge(frame=None) -> None:
    """Call the innermost active hook now, as a tick would (main thread only; nothing when
    no block is active).  The worker's SIGURG handler calls it: a thief's steal request
    reaches a running loop at once, not at the next tick."""
    if _hooks:
        _hooks[-1](frame)


@contextmanager
def ticking(hook, period_s: float):
    """Call ``hook(frame)`` in this (main) thread about every ``period_s`` while the block
    runs (``frame``: the one interrupted; ``available()`` must be True).  Nested blocks:
    only the innermost hook is called."""
    _hooks.append(hook)
    _ticker.start(period_s, _dispatch)
    try:
        yield
    finally:
        _hooks.pop()
        if not _hooks:
            _ticker.stop()
