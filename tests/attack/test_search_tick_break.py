"""Attacks on the ticked count loop (patterns/search/ticked.py, shoal/_tick.py,
shoal/_ticker.c): hostile environments a task's own code makes (signal handlers, wakeup
fds, threads, forks, nested searches, a low recursion limit), errors at every depth, and
references for the counts (a plain recursion, OEIS).  Findings: /work/wt/notes/r-break6.md."""

from __future__ import annotations

import functools
import signal
import socket
import sys
import threading
import time

import numpy as np
import pytest

from shoal import _tick
from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import model as M
from shoal.patterns.search import ticked as T

needs_ticker = pytest.mark.skipif(
    not T.available(), reason="shoal._ticker not built (no C compiler at install time): "
    "the search falls back to its countdown loop; `pip install -e .` with gcc builds it")


def count_inproc(children, root=(), accept=None, ctl_rows: int = 1, split: bool = False):
    """(count, nodes, ran the ticked loop) of an in-process Explorer in this main thread."""
    ctl = np.zeros((ctl_rows, C.CONTROL_COLUMNS), dtype=np.int64)
    spec = M.SearchSpec(root=root, children=children, goal=M.Goal.COUNT, control=None,
                        accept=accept)
    ex = E.Explorer(spec, (), ctl, 0, split=split)
    ex.dfs(spec.root)
    return ex.tally.count, ex.tally.nodes, ex.tick_run is not None


def plain_nodes(children, node) -> int:
    return 1 + sum(plain_nodes(children, c) for c in children(node))


def wait_for(cond, limit_s: float = 20.0) -> bool:
    """Run Python bytecode (ticks land between two of them) until ``cond()`` (bounded)."""
    end = time.monotonic() + limit_s
    while not cond() and time.monotonic() < end:
        pass
    return cond()


def quad(depth: int, node):
    if len(node) < depth:
        for i in range(4):
            yield node + (i,)


@pytest.fixture
def counted_polls(monkeypatch):
    polls = []
    real = E.Explorer.poll
    monkeypatch.setattr(E.Explorer, "poll", lambda self, f: polls.append(1) or real(self, f))
    return polls


# -- F1: a task's own SIGRTMAX handler ---------------------------------------------------


@needs_ticker
def test_a_users_sigrtmax_handler_gets_no_phantom_calls_and_polls_go_on(counted_polls):
    """F1: the first ticker ran SIGRTMAX's Python handler per tick.  A children() that
    installs its own SIGRTMAX handler mid-search got a call per tick for a signal nobody
    sent, and the loop got no poll after it (no stop, no split until the unit ended)."""
    if not hasattr(signal, "SIGRTMAX"):
        pytest.skip("no SIGRTMAX on this platform")
    got = []
    old = signal.getsignal(signal.SIGRTMAX)
    at = []  # polls when the wait ended

    def hostile(node):
        if node == (0,):
            signal.signal(signal.SIGRTMAX, lambda s, f: got.append(s))
        if node == (3,):  # ticks come while this runs: the next level entry polls
            t0 = _tick._ticker.ticks()
            wait_for(lambda: _tick._ticker.ticks() >= t0 + 3)
            at.append(len(counted_polls))
        yield from quad(6, node)

    try:
        count, nodes, ticked = count_inproc(hostile)
    finally:
        signal.signal(signal.SIGRTMAX, old if old is not None else signal.SIG_DFL)
    assert ticked and len(at) == 1
    assert nodes == count == plain_nodes(functools.partial(quad, 6), ())
    assert got == []  # nobody sent SIGRTMAX
    assert len(counted_polls) > at[0]  # a tick armed the loop after the handler went in


@needs_ticker
def test_ticks_write_nothing_to_a_signal_wakeup_fd():
    """F2: each tick (PyErr_SetInterruptEx) wrote a byte to signal.set_wakeup_fd's
    descriptor -- an asyncio loop's self-pipe woke every 5 ms for a signal that never came,
    and a loop not reading it filled it ("Exception ignored when trying to write to the
    signal wakeup fd" per tick)."""
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    old = signal.set_wakeup_fd(a.fileno())
    ticks = [0]

    def waits(node):  # runs until a few ticks came
        if node == ():
            ticks[0] = _tick._ticker.ticks()
            wait_for(lambda: _tick._ticker.ticks() >= ticks[0] + 5)
        yield from quad(3, node)

    try:
        _, nodes, ticked = count_inproc(waits)
    finally:
        signal.set_wakeup_fd(old)
    try:
        data = b.recv(1 << 16)
    except BlockingIOError:
        data = b""
    finally:
        a.close()
        b.close()
    assert ticked and nodes == 85
    assert data == b""
