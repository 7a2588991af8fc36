"""Attacks on the ticked count loop (patterns/search/ticked.py, shoal/_tick.py,
shoal/_ticker.c): hostile environments a task's own code makes (signal handlers, wakeup
fds, threads, forks, nested searches, a low recursion limit), errors at every depth, and
references for the counts (a plain recursion, OEIS)."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from shoal import _tick
from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import model as M
from shoal.patterns.search import polling as P
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
    return ex.tally.count, ex.tally.nodes, ex.ticked_runs > 0


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


# -- F3: live node counts across the deep hand-over ----------------------------------------


def spine_with_bushes(node):
    """A 100-level spine (past the recursion's 64-level cap) with 2**8-node bushes hanging
    from levels 10, 30, 50 (in the recursion) and 70, 90 (in the iterative loop)."""
    d, kind, b = node
    if kind == "spine" and d < 100:
        yield (d + 1, "spine", 0)
    if (kind == "spine" and d % 20 == 10) or (kind == "bush" and b < 7):
        for _ in range(2):
            yield (d + 1, "bush", b + 1)


@pytest.mark.parametrize("ticked", [True, False], ids=["ticked", "countdown"])
def test_live_node_counts_never_go_backwards_across_the_deep_hand_over(monkeypatch, ticked):
    """F3: below the 64-level cap the iterative loop's polls set ``seen`` to its own nodes
    only, dropping the recursion's in-flight count: progress= and the dashboard showed the
    node count fall by all the unit had visited (millions in a long unit) and climb again."""
    if ticked and not T.available():
        pytest.skip("shoal._ticker not built")
    monkeypatch.setattr(_tick, "ENABLED", ticked)
    monkeypatch.setattr(P, "POLL_S", 0)  # (deterministic: every polling.TICK-th entry polls)
    monkeypatch.setattr(T, "LIVE_EVERY", 1)
    monkeypatch.setattr(sys, "getrecursionlimit", lambda: 10_000)  # (room for 100 levels)
    ctl = np.zeros((1, C.CONTROL_COLUMNS), dtype=np.int64)
    seen = []
    real = E.Explorer.report

    def report(self):
        real(self)
        seen.append(int(ctl[0, C.NODES]))

    monkeypatch.setattr(E.Explorer, "report", report)
    spec = M.SearchSpec(root=(0, "spine", 0), children=spine_with_bushes, goal=M.Goal.COUNT,
                        control=None)
    ex = E.Explorer(spec, (), ctl, 0, split=False)
    ex.dfs(spec.root)
    ex.report()
    assert (ex.ticked_runs > 0) == ticked
    assert ex.tally.nodes == seen[-1] == plain_nodes(spine_with_bushes, spec.root)
    assert len(seen) > 10
    assert seen == sorted(seen)  # never backwards


# -- guards (no bug found; each held in the attack) ----------------------------------------


@needs_ticker
def test_polls_come_while_threads_run_python_all_the_time(counted_polls):
    """Other threads' eval-breaker recomputations (GIL hand-overs every 5 ms) clear the flag
    the ticker set; the main thread recomputes it when it takes the GIL back: polls come."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    at = []

    def busy(node):
        if node == (1,):
            for t in threads:
                t.start()
        if node == (2,):  # ticks come while the threads run: the next level entry polls
            t0 = _tick._ticker.ticks()
            wait_for(lambda: _tick._ticker.ticks() >= t0 + 3)
            at.append(len(counted_polls))
        yield from quad(5, node)

    try:
        count, nodes, ticked = count_inproc(busy)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert ticked and nodes == count == plain_nodes(functools.partial(quad, 5), ())
    assert len(counted_polls) > at[0]


def nesting(depth: int, node):
    if len(node) == 2:
        assert count_inproc(functools.partial(quad, 3)) == (85, 85, True)
    yield from quad(depth, node)


def test_a_nested_search_in_children_counts_both_exactly():
    """children() runs an in-process search of the same shape (the same generated code,
    ``children(children_a0, child)``): the inner run gets a build of its own while the
    outer one holds its build (F5's reuse), its hook is innermost, and its frames end at the
    user's generator."""
    count, nodes, ticked = count_inproc(functools.partial(nesting, 3))
    assert (count, nodes, ticked) == (85, 85, T.available())


def test_errors_name_the_true_path_at_every_depth_past_the_cap(monkeypatch):
    """A children() raising at depth 1, 40 and 70 (the iterative loop past the 64-level cap):
    the message names the node's true path, the cause is the user's exception."""
    from shoal.patterns.search.model import SearchError

    monkeypatch.setattr(sys, "getrecursionlimit", lambda: 10_000)

    for depth in (1, 40, 70):
        def bad(node, depth=depth):
            if len(node) == depth and node[-1] == 1:
                raise ValueError("bad node")
            if len(node) < depth + 1:
                yield node + (0,)
                yield node + (1,)

        with pytest.raises(SearchError) as info:
            count_inproc(bad)
        want = (0,) * (depth - 1) + (1,)
        assert f"path {want}" in str(info.value)
        tb = info.value.__cause__.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        assert isinstance(info.value.__cause__, ValueError)
        assert tb.tb_frame.f_code is bad.__code__  # raised in the user's own frame


# -- F4: ticks reach a busy main thread on every supported Python --------------------------

TICKER_C = Path(__file__).resolve().parents[2] / "shoal" / "_ticker.c"
PROBE = """
import importlib.machinery, importlib.util, sys, time
loader = importlib.machinery.ExtensionFileLoader("_ticker", sys.argv[1])
m = importlib.util.module_from_spec(importlib.util.spec_from_loader("_ticker", loader))
loader.exec_module(m)
calls = []
m.start(0.001, lambda frame: calls.append(frame))
end = time.monotonic() + 20
while len(calls) < 3 and time.monotonic() < end:
    pass  # a busy main thread: only the eval breaker makes it look
m.stop()
print(len(calls), all(f is not None for f in calls))
"""


def _interpreters() -> dict:
    """{(major, minor): path} of the CPythons >= 3.10 here: this one, python3.X on PATH,
    pyenv's versions."""
    found = {sys.version_info[:2]: sys.executable}
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    cands = [shutil.which(f"python3.{m}") for m in range(10, 20)]
    cands += sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))
    for exe in filter(None, cands):
        try:
            out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            ver = tuple(int(x) for x in out.stdout.split())
            if ver >= (3, 10) and "free-threading" not in exe:
                found.setdefault(ver, exe)
    return found


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc: cannot build the ticker "
                    "(apt-get install gcc)")
def test_ticks_reach_a_busy_main_thread_on_every_supported_python(tmp_path):
    """F4: the helper thread's call sets the eval breaker only when made from the main
    thread; the first ticker set it by hand for 3.11 only, so on 3.10 and 3.12 (both in
    requires-python) a busy main thread never ran a tick: the ticked loop never polled (no
    stop after an error elsewhere, no split, no progress).  Builds shoal/_ticker.c for
    each CPython found here (pyenv's, python3.X on PATH; at least this one) and runs it."""
    checked = []
    for ver, exe in sorted(_interpreters().items()):
        inc = subprocess.run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        if not os.path.exists(os.path.join(inc, "Python.h")):
            continue  # (no headers for this one)
        so = tmp_path / f"ticker{ver[0]}{ver[1]}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{inc}", str(TICKER_C), "-o", str(so),
                        "-lpthread"], check=True, capture_output=True, timeout=120)
        out = subprocess.run([exe, "-c", PROBE, str(so)], capture_output=True, text=True,
                             timeout=60)
        assert out.stdout.split() == ["3", "True"], (ver, out.stdout, out.stderr)
        checked.append(ver)
    assert sys.version_info[:2] in checked


@needs_ticker
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_pass_through_and_leave_no_hook_behind(exc):
    """A BaseException from children() is no SearchError: it propagates as raised, the
    ticker's hook stack is empty after, and the next search ticks and counts exactly."""

    def raising(node):
        if len(node) == 3:
            raise exc("from children")
        yield from quad(4, node)

    with pytest.raises(exc):
        count_inproc(raising)
    assert _tick._hooks == []
    assert count_inproc(functools.partial(quad, 4)) == (341, 341, True)


# -- F5: the per-task build -----------------------------------------------------------------


class Arg:
    """A bound argument of children (weakref-able: is it kept alive after the search?)."""

    def __init__(self, depth: int):
        self.depth = depth


def arg_kids(arg, node):
    if len(node) < arg.depth:
        for i in range(3):
            yield node + (i,)


@needs_ticker
def test_a_tasks_loop_reuses_a_free_build_and_keeps_no_user_object_alive():
    """F5: every task built its loop anew (2 functions per level, 64 levels: ~85 us a task,
    4x the countdown loop's whole task on a small tree).  A finished run's build is kept
    per shape and rebound for the next task; it must hold none of the user's objects."""
    import gc
    import weakref

    builds, refs = [], []
    for depth in (3, 4):
        arg = Arg(depth)
        refs.append(weakref.ref(arg))
        assert count_inproc(functools.partial(arg_kids, arg))[1:] == ((3 ** (depth + 1) - 1) // 2, True)
        shape = T._shape(types.SimpleNamespace(children=functools.partial(arg_kids, arg),
                                               accept=None))[0]
        builds.append(T._FREE[shape][-1])  # (the last released)
        del arg
    assert builds[0] is builds[1]  # the second task ran on the first one's build
    gc.collect()
    assert [r() for r in refs] == [None, None]  # no user object kept by a free build
