"""What a worker's SIGURG handler may do inside a running task: answer thieves, never
settle a future.

The handler (``Worker.on_signal``) runs between any two bytecodes of a task, also inside
``concurrent.futures.Future.add_done_callback`` between its check of the state and its
append of the callback.  A result settled there ran the callbacks the future had, then
the new one was appended and never called: a dask graph walked by ``pilot.get``
(``_run_graph``: spawn a node, add a done-callback that wakes the walker, wait) hung.

``test_a_poke_inside_add_done_callback_loses_no_callback`` puts the poke exactly in that
window, every run: the task holds pokes back while the child's result travels home, then
runs the handler from inside the property the standard library reads after its state
check (``_done_callbacks``).  The stress test runs the reproducer's shape
(a chain walked by callbacks, as dask's ``test_get_stack_limit`` is) many times, and
dask's own ``GetFunctionTestMixin`` runs through ``pilot.get`` in tests/integrations.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

import shoal
from shoal.runtime import context
from shoal.runtime.future import Future

pytestmark = pytest.mark.timeout(120)

SCALE = float(os.environ.get("SHOAL_STRESS_SCALE", "1"))


def _leaf(i):
    return i


def _until(cond, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.001)


def _callback_after_a_poke_in_the_window() -> list:
    """Runs in a worker: a child stolen and finished, its result home in the ring, and the
    poke's handler run inside add_done_callback; returns what the callback saw."""
    worker = context.worker
    child = shoal.spawn(_leaf, 7)
    # the idle peer steals it (the handler answers its poke while this loop runs); on a fast
    # machine the loan can come and go between two looks (its result already handled by the
    # handler and deferred): then this try missed the window and says so
    _until(lambda: child.task_id in worker.book.loans or worker.unsettled,
           "the child was never stolen")
    if child.task_id not in worker.book.loans:
        return None if child.result() == 7 else ["wrong value", child.result()]
    # Pokes now wait (the handler defers them while runtime code runs), so the result
    # message stays in the ring until the handler runs in the window below.  (Blocking
    # SIGURG would not do: the worker's other threads take the signal for the process.)
    worker.in_user = False
    try:
        _until(worker.readable, "the child's result never came home")
        time.sleep(0.05)  # the thief's next steal request may follow it in the ring
    finally:
        worker.in_user = True
    window = Future.__dict__["_done_callbacks"]
    seen: list = []

    def run_the_handler_in_the_window(fut):
        # the stdlib has checked the state (pending) and is about to append: a poke's
        # handler runs here, as it would between these two bytecodes
        worker.on_signal(signal.SIGURG, sys._getframe())
        return window.fget(fut)

    Future._done_callbacks = property(run_the_handler_in_the_window)
    try:
        child.add_done_callback(lambda f: seen.append(f.result()))
    finally:
        Future._done_callbacks = window
    value = child.result()
    return [value, list(seen), worker.c["pokes"]]


def test_a_poke_inside_add_done_callback_loses_no_callback():
    """Three tries that reach the window (up to 30 tries: a try whose loan came and went
    between two looks of the worker's poll reached no window and is not counted)."""
    reached = 0
    with shoal.Pilot(workers=2) as pilot:
        for _ in range(30):
            got = pilot.submit(_callback_after_a_poke_in_the_window).result(timeout=90)
            if got is None:
                continue
            value, seen, pokes = got
            assert value == 7
            assert seen == [7], "the done-callback added while the handler ran was never called"
            assert pokes >= 1
            reached += 1
            if reached == 3:
                break
    if reached == 0:
        pytest.skip("in 30 tries the thief's result always came home before the loan was seen")


def _walk_chain(n: int) -> int:
    """dask's ``_run_graph`` in miniature: spawn a link, a done-callback wakes the walker."""
    got = []
    wake = None

    def done(fut):
        got.append(fut.result())
        if wake is not None and not wake.done():
            wake.set_result(None)

    for i in range(n):
        shoal.spawn(_leaf, i).add_done_callback(done)
        if len(got) <= i:
            wake = Future()
            if len(got) <= i:
                wake.result()  # help-first: runs and steals until the callback wakes us
            wake = None
    return len(got)


def test_a_chain_walked_by_done_callbacks_finishes():
    with shoal.Pilot(workers=2) as pilot:
        for _ in range(3):
            assert pilot.submit(_walk_chain, 300).result(timeout=100) == 300


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_reproducer_chain_never_loses_a_callback():
    """1,000-link chains, 200 rounds at SHOAL_STRESS_SCALE=1 (before the fix: stuck about 1
    run in 4-10)."""
    rounds = max(5, int(200 * SCALE))
    with shoal.Pilot(workers=2) as pilot:
        for r in range(rounds):
            fut = pilot.submit(_walk_chain, 1000)
            assert fut.result(timeout=120) == 1000, f"round {r}"


# -- the driver's own signal handlers: they never wait for a lock the main thread may hold

_ENGINE_HANDLER_UNDER_ITS_LOCK = """
import os, signal, threading, types
from shoal.patterns.ensemble.engine import Engine
r, w = os.pipe()
state = types.SimpleNamespace(interrupted=None, wake_lock=threading.Lock(), wake_closed=False,
                              wake_w=w)
restore = Engine._catch_signals(state)   # the real handler, over the engine's wake-up state
with state.wake_lock:                    # the main thread in _poke or _close_resources
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):                # bytecodes: the handler runs among them
        pass
restore()
print(state.interrupted)
"""


def test_the_ensemble_engines_handler_does_not_wait_for_the_wake_lock():
    """SIGINT/SIGTERM landing while the main thread held the engine's wake-up lock: the
    handler's ``with wake_lock`` deadlocked the run (Ctrl-C then did nothing)."""
    import subprocess

    from conftest import run_script

    try:
        done = run_script(_ENGINE_HANDLER_UNDER_ITS_LOCK, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the handler deadlocked on the lock its own thread held")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SIGTERM"]


_DASHBOARD_SIGTERM = """
import os, signal, threading, time
from shoal.dashboard import commands

class Closing:
    closed = False
    def close(self):
        self.closed = True

stop = threading.Event()
real_wait = stop.wait

def wait_with_the_signal_inside(timeout=None):
    # a SIGTERM landing while this thread holds the Event's own lock (inside Event.wait)
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    return real_wait(timeout)

stop.wait = wait_with_the_signal_inside
dash = Closing()
commands._serve_forever(dash, stop)
print("closed" if dash.closed else "open")
"""


def test_the_dashboards_sigterm_handler_does_not_take_the_events_lock():
    """``shoal dashboard``'s SIGTERM handler called ``stop.set()``; landing while the main
    thread held the Event's lock (inside ``wait``) it deadlocked the server's exit."""
    import subprocess

    from conftest import run_script

    try:
        done = run_script(_DASHBOARD_SIGTERM, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the SIGTERM handler deadlocked on the Event's lock")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["closed"]
