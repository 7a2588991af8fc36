"""The ticked count loop (patterns/search/ticked.py) and its ticker (shoal/_tick.py).

The ticker arms polls from a C thread at arbitrary bytecodes of the main thread; these
tests make it tick very often while every poll splits, and check against references:
the exact node counts of an irregular tree, OEIS's N-Queens counts, and a search that can
only end if a running loop sees the stop another worker's error sets."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import shoal
from shoal import _tick
from shoal.patterns import backtracking
from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import model as M
from shoal.patterns.search import polling as P
from shoal.patterns.search import ticked as T
from shoal.patterns.search.model import SearchError
from shoal.workloads.nqueens import OEIS_A000170

sys.path.append(str(Path(__file__).resolve().parents[2] / "examples"))  # (last: tests/ names win)
import search_nqueens as nq  # noqa: E402

needs_ticker = pytest.mark.skipif(
    not T.available(), reason="shoal._ticker not built (no C compiler at install time): "
    "the search falls back to its countdown loop; `pip install -e .` with gcc builds it")


def _busy_until(cond, limit_s: float = 10.0) -> None:
    """Run Python bytecode (the ticks land between two of them) until ``cond()``."""
    end = time.monotonic() + limit_s
    x = 0
    while not cond() and time.monotonic() < end:
        x += 1


def test_the_ticker_is_built_wherever_the_ring_helper_is():
    """Both are optional C extensions built by the same install: one missing while the other
    is there means its build failed silently (setup.py's optional=True) -- the search would
    run its slower countdown loop with no one told."""
    try:
        import shoal.queues._native  # noqa: F401
    except ImportError:
        pytest.skip("no native extension was built here (no C compiler)")
    from shoal import _ticker  # noqa: F401


@needs_ticker
def test_the_hook_runs_in_the_main_thread_while_it_is_busy_and_stops_after():
    calls = []
    with _tick.ticking(lambda frame: calls.append((threading.current_thread(), frame)), 0.0005):
        _busy_until(lambda: len(calls) >= 5)
    assert len(calls) >= 5
    assert all(t is threading.main_thread() and f is not None for t, f in calls)
    n = len(calls)
    _busy_until(lambda: False, 0.05)
    assert len(calls) == n  # no tick outside the block


@needs_ticker
def test_nested_blocks_call_the_innermost_hook():
    outer, inner = [], []
    with _tick.ticking(lambda f: outer.append(1), 0.0005):
        with _tick.ticking(lambda f: inner.append(1), 0.0005):
            _busy_until(lambda: len(inner) >= 3)
        assert len(inner) >= 3 and not outer
        _busy_until(lambda: len(outer) >= 3)
    assert len(outer) >= 3


def test_not_available_off_the_main_thread_or_when_disabled(monkeypatch):
    got = []
    t = threading.Thread(target=lambda: got.append(_tick.available()))
    t.start()
    t.join()
    assert got == [False]  # (dask's worker threads: the countdown loop)
    monkeypatch.setattr(_tick, "ENABLED", False)  # SHOAL_SEARCH_TICK=0
    assert not _tick.available()


@needs_ticker
def test_a_forked_child_gets_a_ticker_of_its_own():
    with _tick.ticking(lambda f: None, 0.0005):  # the parent's helper thread exists
        _busy_until(lambda: False, 0.01)
    pid = os.fork()
    if pid == 0:  # the child: the helper thread was not copied; start() makes one
        code = 1
        try:
            calls = []
            with _tick.ticking(lambda f: calls.append(1), 0.0005):
                _busy_until(lambda: len(calls) >= 3)
            code = 0 if len(calls) >= 3 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- the loop, in-process: ticks at arbitrary points, every poll splits -------------------


def tree(node):  # an irregular tree (node = its path), from a generator: the count loop
    n = (2 + len(node) + sum(node)) % 4 + 1 if len(node) < 9 else 0
    for i in range(n):
        yield node + (i,)


_listed = [0]


def nudging_tree(node):
    """``tree``, plus a tick's work (``_tick.nudge``) at every 7th listing: polls that
    come however loaded the machine is (the real ticks may not, on a busy core)."""
    _listed[0] += 1
    if _listed[0] % 7 == 0:
        _tick.nudge(sys._getframe())
    yield from tree(node)


def nudging_queens(n, node):
    _listed[0] += 1
    if _listed[0] % 50 == 0:
        _tick.nudge(sys._getframe())
    yield from nq.children(n, node)


def full_count(node) -> int:
    return 1 + sum(full_count(c) for c in tree(node))


def solutions(node) -> int:  # accept: the last index is 1
    return (node[-1:] == (1,)) + sum(solutions(c) for c in tree(node))


def last_is_one(node):
    return node[-1:] == (1,)


@needs_ticker
@pytest.mark.parametrize("accept", [None, last_is_one], ids=["all", "accept"])
def test_ticked_splits_at_arbitrary_ticks_lose_no_node(monkeypatch, accept):
    """Ticks every ~20 us (and nudges) with a hungry peer (every poll splits): every
    split-off unit is named by its true path, and nodes and solutions add up exactly."""
    monkeypatch.setattr(P, "TICK_S", 0.00002)
    shipped = []
    monkeypatch.setattr(E.Explorer, "ship", lambda self, node, path: shipped.append([(path, node)]))
    monkeypatch.setattr(E.Explorer, "ship_bundle", lambda self, units: shipped.append(list(units)))
    polls = []
    real_poll = E.Explorer.poll
    monkeypatch.setattr(E.Explorer, "poll", lambda self, f: polls.append(1) or real_poll(self, f))
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)  # row 1 counts as hungry
    spec = M.SearchSpec(root=(), children=nudging_tree, goal=M.Goal.COUNT, control=None,
                        accept=accept)
    nodes = count = tasks = 0
    todo = [[((), ())]]
    while todo:
        units = todo.pop()
        for path, node in units:
            assert node == path
        ex = E.Explorer(spec, units[0][0], ctl, 0, split=True)
        ex.run_units(units)
        assert ex.ticked_runs > 0  # the ticked loop ran
        nodes += ex.tally.nodes
        count += ex.tally.count
        tasks += 1
        todo.extend(shipped)
        shipped.clear()
    assert nodes == full_count(())
    assert count == (nodes if accept is None else solutions(()))
    assert polls and tasks > 5  # ticks came, and their polls split


@needs_ticker
def test_ticked_and_countdown_loops_agree_on_nqueens(monkeypatch):
    def run(n):
        spec = M.SearchSpec(root=nq.ROOT, children=functools.partial(nq.children, n),
                            goal=M.Goal.COUNT, control=None,
                            accept=functools.partial(nq.is_solution, n))
        ex = E.Explorer(spec, (), np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64), 0, split=False)
        ex.dfs(spec.root)
        return ex.tally.count, ex.tally.nodes, ex.ticked_runs > 0

    for n in (1, 4, 6, 8):
        count, nodes, was_ticked = run(n)
        monkeypatch.setattr(_tick, "ENABLED", False)
        assert run(n) == (count, nodes, False)
        monkeypatch.setattr(_tick, "ENABLED", True)
        assert was_ticked and count == OEIS_A000170[n]


@needs_ticker
def test_live_nodes_reach_the_control_array_before_the_unit_ends(monkeypatch):
    """progress= and the dashboard read Control's NODES: the ticked loop keeps no counter,
    so its polls sum the frames' counts every LIVE_EVERY polls (here: every poll; nudges
    make polls however loaded the machine is)."""
    monkeypatch.setattr(P, "TICK_S", 0.00005)
    monkeypatch.setattr(T, "LIVE_EVERY", 1)
    ctl = np.zeros((1, C.CONTROL_COLUMNS), dtype=np.int64)  # nobody hungry
    seen = []
    real = E.Explorer.report

    def report(self):
        real(self)
        seen.append(int(ctl[0, C.NODES]))

    monkeypatch.setattr(E.Explorer, "report", report)
    n = 9
    spec = M.SearchSpec(root=nq.ROOT, children=functools.partial(nudging_queens, n),
                        goal=M.Goal.COUNT, control=None, accept=functools.partial(nq.is_solution, n))
    ex = E.Explorer(spec, (), ctl, 0, split=True)
    ex.dfs(spec.root)
    ex.report()
    final = ex.tally.nodes
    assert seen[-1] == final
    assert any(0 < s < final for s in seen)  # in flight
    assert seen == sorted(seen)  # never backwards


# -- on a pilot's workers ---------------------------------------------------------------


def _worker_ticks() -> bool:
    return T.available()


@needs_ticker
def test_workers_run_the_ticked_loop_and_split_it():
    with shoal.Pilot(workers=2) as p:
        assert p.submit(_worker_ticks).result(timeout=60)
        for n in (8, 12):
            r = backtracking.count(p, nq.ROOT, functools.partial(nq.children, n),
                                   accept=functools.partial(nq.is_solution, n))
            assert int(r) == OEIS_A000170[n]
        assert r.stats.tasks > 1  # a hungry worker got work from a tick's poll


_calls = [0]


def wide(d: str, node):
    """3**28 nodes within 28 levels (never finishes, always under the recursion's cap).
    Once both worker processes list nodes (files in ``d``), the first to have listed
    20,000 raises; the other never does."""
    _calls[0] += 1
    n = _calls[0]
    if n == 1:
        open(os.path.join(d, f"started.{os.getpid()}"), "w").close()
    if n >= 20_000 and n % 1000 == 0 and sum(f.startswith("started.") for f in os.listdir(d)) >= 2:
        try:
            os.close(os.open(os.path.join(d, "first"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            raise ValueError("boom")
    if len(node) < 28:
        for i in range(3):
            yield node + (i,)


@needs_ticker
def test_an_error_elsewhere_stops_a_running_ticked_loop(tmp_path):
    """The second worker gets work only from a split (a tick's poll), and once both run,
    only a poll can end the one that did not raise (its subtree would take centuries):
    the search raises the error, and the pilot is free for the next task."""
    with shoal.Pilot(workers=2) as p:
        with pytest.raises(SearchError, match=r"boom"):
            backtracking.count(p, (), functools.partial(wide, str(tmp_path)))
        assert p.submit(int, 7).result(timeout=60) == 7


class Model:
    """A search's model object, bound into the loop as a partial's argument."""

    def __init__(self, n: int):
        self.n = n


def model_queens(model, node):
    yield from nq.children(model.n, node)


@needs_ticker
def test_built_loops_are_reused_rebound_and_let_go():
    """A task's loop is taken from the process's free built loops of its shape (building
    costs more than a small task) and rebound to the new search's functions and arguments:
    counts stay exact from one model to the next, and a released loop keeps no reference
    to the last search's model."""
    import gc
    import weakref

    def run(model):
        spec = M.SearchSpec(root=nq.ROOT, children=functools.partial(model_queens, model),
                            goal=M.Goal.COUNT, control=None)
        ex = E.Explorer(spec, (), np.zeros((1, C.CONTROL_COLUMNS), dtype=np.int64), 0,
                        split=False)
        ex.dfs(spec.root)
        assert ex.ticked_runs == 1
        return ex.tally.nodes

    want = {}
    for n in (6, 8, 5):  # nodes of the plain recursion
        stack, k = [nq.ROOT], 0
        while stack:
            k += 1
            stack.extend(nq.children(n, stack.pop()))
        want[n] = k
    built = []
    real = T.Loop.__init__
    T.Loop.__init__ = lambda self, *a: built.append(1) or real(self, *a)
    try:
        models = [Model(n) for n in (6, 8, 5, 8)]
        assert [run(m) for m in models] == [want[6], want[8], want[5], want[8]]
    finally:
        T.Loop.__init__ = real
    assert len(built) <= 1  # one build, then the same loop rebound (none if an earlier test built it)
    gone = weakref.ref(models[-1])
    del models
    gc.collect()
    assert gone() is None  # the free loop holds nothing of the search
