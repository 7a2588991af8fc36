"""The local backend's components: their state is their own, and its locks keep one order.

* Ownership (ast over shoal/backends/local/): a component's state is private (``self._x``
  assigned in its own class), and no other class or module reads or writes it; the
  backend and its parts use the component's methods only.
* Lock order (locks.py): a backend made inside ``locks.checking()`` records every lock
  taken while another is held; run through submit (both paths), a task graph, map,
  retries with a delay, cancel of queued tasks, done-callbacks that submit and cancel,
  stats, monitor, export and give_back, a ``timeout=`` overrun (a worker killed and
  replaced), and close, no acquisition breaks the order, and the nestings the design
  names (a drain's ``consume_lock`` then ``lock``) are among those seen.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import threading
import time
from pathlib import Path

import pytest
from rt_tasks import boom, inc, sleep

import shoal.backends.local as local_pkg
from shoal import TaskTimeout
from shoal.backends.local import locks
from shoal.backends.local.backend import LocalBackend
from shoal.backends.local.recent import RecentlyCancelled
from shoal.backends.local.replies import Replies
from shoal.backends.local.timers import Deadlines, Retries

PACKAGE = Path(local_pkg.__file__).parent
COMPONENTS = {"Replies", "Deadlines", "Retries", "Processes", "RecentlyCancelled"}


def _classes():
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        yield path, tree


def _state_of(cls: ast.ClassDef) -> set[str]:
    out = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for t in targets:
            for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return out


def _ownership_problems() -> list[str]:
    owners: dict[str, str] = {}  # a component's state -> the component
    own: dict[str, set] = {}  # every class of the package -> its own state
    problems = []
    for path, tree in _classes():
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
            own[cls.name] = _state_of(cls)
            if cls.name not in COMPONENTS:
                continue
            for name in own[cls.name]:
                if not name.startswith("_"):
                    problems.append(f"{path.name}: {cls.name}.{name} is state but not private")
                owners.setdefault(name, cls.name)
    def visit(node, cls_name, where):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.ClassDef) else cls_name
            if isinstance(child, ast.Attribute) and child.attr in owners:
                mine = (child.attr in own.get(cls_name, ()) and isinstance(child.value, ast.Name)
                        and child.value.id == "self")
                if not mine:
                    problems.append(f"{where}:{child.lineno}: {cls_name or 'module'} touches "
                                    f"{owners[child.attr]}'s {child.attr}")
            visit(child, inner, where)

    for path, tree in _classes():
        visit(tree, None, path.name)
    return problems


def test_no_part_of_the_local_backend_touches_a_components_state():
    assert _ownership_problems() == []


def test_the_ownership_check_sees_a_reach_into_a_component(tmp_path, monkeypatch):
    bad = PACKAGE / "replies.py"
    src = bad.read_text() + "\n\ndef peek(b):\n    return b.replies._latest\n"
    fake = tmp_path / "replies.py"
    fake.write_text(src)
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    assert any("touches Replies's _latest" in p for p in _ownership_problems())


# -- the components alone ----------------------------------------------------------------


def test_deadlines_pop_in_time_order_and_kill_once_per_worker():
    d = Deadlines()
    assert d.next_due() is None and d.due(1e9) == []
    d.started(7, 1, 5.0)
    d.started(8, 2, 3.0)
    assert d.next_due() == 3.0
    assert d.due(4.0) == [(8, 2)] and d.next_due() == 5.0
    assert d.claim_kill(2, 8) and not d.claim_kill(2, 9)
    assert d.overran(2) == 8 and d.overran(2) is None and d.claim_kill(2, 9)


def test_retries_count_attempts_follow_a_rename_and_wait_in_due_order():
    r = Retries()
    assert not r.any() and r.next_delay(1) == 0.0
    r.remember(1, 0.5)
    assert r.any() and r.next_delay(1) == 0.5
    r.rename(1, 2)
    assert r.next_delay(1) == 0.0 and r.next_delay(2) == 0.5
    r.forget(2)
    assert not r.any()
    r.defer(3, 2.0)
    r.defer(4, 1.0)
    assert r.next_due() == 1.0 and r.pop_due(1.5) == [4] and r.pop_due(9.0) == [3]
    assert r.next_due() is None


def test_recently_cancelled_forgets_the_oldest_first():
    recent = RecentlyCancelled()
    for tid in range(RecentlyCancelled.LIMIT + 2):
        recent.add(tid)
    recent.add(5)  # again: it keeps its place
    assert 0 not in recent and 1 not in recent and 2 in recent and RecentlyCancelled.LIMIT + 1 in recent
    assert len(recent) == RecentlyCancelled.LIMIT


def test_replies_keep_the_latest_and_refuse_a_late_loot():
    r = Replies()
    r.ask_stats()
    r.stats_arrived(1, {"worker": 1})
    assert r.wait_stats(1, 0.0) == {1: r.latest([1])[1]} and "at" in r.latest([1])[1]
    r.ask_stats()
    assert r.wait_stats(1, 0.0) == {} and r.latest([1, 2])[2] is None
    r.forget(1)
    assert r.latest([1]) == {1: None}
    r.expect_loot([1, 2])
    assert r.loot_arrived(1, [b"a"]) and not r.loot_arrived(1, [b"b"])
    threading.Timer(0.05, r.loot_arrived, (2, [b"c"])).start()
    assert r.collect_loot(30.0) == [b"a", b"c"]
    assert not r.loot_arrived(2, [b"d"])  # export() is over: the pump runs it


# -- the lock order -------------------------------------------------------------------


def test_the_checker_records_a_lock_taken_against_the_order():
    with locks.checking() as order:
        table = locks.make("lock", locks.Rank.TABLE)
        consume = locks.make("consume_lock", locks.Rank.CONSUME, reentrant=True)
        with consume, consume, table:
            pass
        assert order.violations == [] and ("consume_lock", "lock") in order.pairs
        with table:
            assert not consume.acquire(blocking=False) or consume.release() is None  # a try-lock: fine
            assert order.violations == []
            with consume:
                pass
        assert order.violations == [("lock", "consume_lock")]
    assert type(locks.make("x", locks.Rank.LEAF)) is type(threading.Lock())  # plain outside


def test_a_backend_through_its_paths_takes_its_locks_in_order():
    with locks.checking() as order:
        backend = LocalBackend(2)
    try:
        assert isinstance(backend.lock, locks._Checked)
        futs = [backend.submit(inc, (i,), {}) for i in range(300)]
        graph = backend.submit(inc, (futs[0],), {})
        mapped = list(backend.map(inc, [range(50)]))
        assert mapped == list(range(1, 51))
        retried = backend.submit(boom, (), {}, retries=1, retry_delay=0.01)
        slow = [backend.submit(sleep, (0.05,), {}) for _ in range(20)]
        cancelled = [f.cancel() for f in slow[10:]]
        chained = []

        def on_done(f):
            chained.append(backend.submit(inc, (1,), {}))
            chained.append(backend.submit(sleep, (0.05,), {}))
            chained[-1].cancel()

        futs[-1].add_done_callback(on_done)
        assert backend.stats()["backend"] == "local" and backend.monitor()["workers"]
        backend.give_back(backend.export(timeout=0.2))
        overrun = backend.submit(sleep, (30.0,), {}, timeout=0.2)
        with pytest.raises(TaskTimeout):
            overrun.result(timeout=60)
        assert [f.result(timeout=60) for f in futs] == list(range(1, 301))
        assert graph.result(timeout=60) == 2
        with pytest.raises(ValueError):
            retried.result(timeout=60)
        cf.wait([f for f in slow if not f.cancelled()], timeout=60)
        deadline = time.monotonic() + 30
        while len(chained) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert chained[0].result(timeout=60) == 2
        assert len(cancelled) == 10  # whether each cancel won depends on timing; the locks do not
    finally:
        backend.close()
    assert order.violations == []
    assert ("consume_lock", "lock") in order.pairs  # a drain settles results under lock
    assert ("export_lock", "lock") in order.pairs
    assert ("close_lock", "lock") in order.pairs
