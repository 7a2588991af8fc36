"""The public task API of the local pilot: submit, map, graphs, cancel, retries, timeouts, close."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time

import pytest
import rt_tasks as t

import shoal


@pytest.fixture(scope="module")
def pilot():
    with shoal.Pilot(workers=2) as p:
        yield p


@pytest.fixture(autouse=True)
def leak_check():  # a module-scoped pilot outlives single tests; its own test checks leaks
    yield


def test_submit_result(pilot):
    assert pilot.submit(t.inc, 41).result(timeout=30) == 42
    assert pilot.submit(t.add, 1, b=2).result(timeout=30) == 3


def test_future_is_a_concurrent_future(pilot):
    futs = [pilot.submit(t.inc, i) for i in range(100)]
    assert all(isinstance(f, cf.Future) and isinstance(f, shoal.Future) for f in futs)
    done, not_done = cf.wait(futs, timeout=30)
    assert not not_done
    assert sorted(f.result() for f in cf.as_completed(futs)) == list(range(1, 101))

    async def main():
        return await asyncio.wrap_future(pilot.submit(t.inc, 1))

    assert asyncio.run(main()) == 2


def test_many_results_in_order(pilot):
    futs = [pilot.submit(t.inc, i) for i in range(5000)]
    assert [f.result(timeout=60) for f in futs] == list(range(1, 5001))


def test_lambda_and_closure(pilot):
    k = 7
    assert pilot.submit(lambda x: x * k, 6).result(timeout=30) == 42
    assert list(pilot.map(lambda x: x - k, [7, 8])) == [0, 1]


def test_builtin_and_bound_method(pilot):
    assert pilot.submit(pow, 2, 10).result(timeout=30) == 1024
    assert pilot.submit("a-b".split, "-").result(timeout=30) == ["a", "b"]


def test_map_ordered_unordered_chunksize(pilot):
    assert list(pilot.map(t.inc, range(1000))) == list(range(1, 1001))
    assert sorted(pilot.map(t.inc, range(1000), ordered=False)) == list(range(1, 1001))
    assert list(pilot.map(t.add, range(10), range(10), chunksize=3)) == [2 * i for i in range(10)]
    assert list(pilot.map(t.inc, [])) == []


def test_map_is_lazy_and_bounded(pilot):
    pulled = 0

    def items():
        nonlocal pulled
        for i in range(10_000_000):
            pulled += 1
            yield i

    it = pilot.map(t.inc, items())
    first = [next(it) for _ in range(1000)]
    assert first == list(range(1, 1001))
    assert pulled < 1_000_000, f"map pulled {pulled} items to produce 1000 results"
    it.close()


def test_map_errors(pilot):
    with pytest.raises(ValueError, match="boom"):
        list(pilot.map(t.boom, ["boom"]))
    with pytest.raises(TypeError, match="callable"):
        pilot.map(42, [1])
    with pytest.raises(ValueError, match="chunksize"):
        pilot.map(t.inc, [1], chunksize=0)


def test_task_graph(pilot):
    a = pilot.submit(t.inc, 1)
    b = pilot.submit(t.inc, a)
    c = pilot.submit(t.add, a, b=b)
    d = pilot.submit(t.total, [a, b, c])
    e = pilot.submit(t.mapping_sum, {"x": a, "y": d})
    assert (a.result(30), b.result(30), c.result(30), d.result(30), e.result(30)) == (2, 3, 5, 10, 12)


def test_task_graph_failure_propagates(pilot):
    bad = pilot.submit(t.boom, "upstream")
    dep = pilot.submit(t.inc, bad)
    with pytest.raises(ValueError, match="upstream"):
        dep.result(timeout=30)


def test_exception_type_and_remote_traceback(pilot):
    fut = pilot.submit(t.boom, "kaput")
    with pytest.raises(ValueError, match="kaput") as info:
        fut.result(timeout=30)
    cause = info.value.__cause__
    assert isinstance(cause, shoal.RemoteTraceback)
    assert "rt_tasks.py" in cause.tb and "def boom" not in cause.tb and "raise ValueError" in cause.tb
    assert pilot.submit(t.inc, 1).result(timeout=30) == 2  # the worker survived


def test_unpicklable_argument_and_result(pilot):
    fut = pilot.submit(t.inc, t.Unpicklable())
    with pytest.raises(shoal.SerializationError, match="argument"):
        fut.result(timeout=30)
    fut = pilot.submit(t.unpicklable_result)
    with pytest.raises(shoal.SerializationError, match="result"):
        fut.result(timeout=30)


def test_cancel_pending(pilot):
    blockers = [pilot.submit(t.sleep, 0.5) for _ in range(2)]
    queued = [pilot.submit(t.sleep, 0.2) for _ in range(20)]
    cancelled = [f.cancel() for f in queued]
    assert all(cancelled)
    assert all(f.cancelled() for f in queued)
    with pytest.raises(cf.CancelledError):
        queued[0].result()
    assert [b.result(timeout=30) for b in blockers] == [0.5, 0.5]
    assert pilot.submit(t.inc, 1).result(timeout=30) == 2


def test_retries_after_exceptions(pilot, tmp_path):
    marker = str(tmp_path / "count")
    assert pilot.options(retries=2).submit(t.fail_until, marker, 3).result(timeout=30) == 3
    marker2 = str(tmp_path / "count2")
    with pytest.raises(RuntimeError, match="attempt 2"):
        pilot.options(retries=1).submit(t.fail_until, marker2, 5).result(timeout=30)


def test_timeout_kills_and_replaces(pilot):
    fut = pilot.options(timeout=0.5).submit(t.sleep, 30)
    with pytest.raises(shoal.TaskTimeout, match="timeout"):
        fut.result(timeout=30)
    assert [f.result(timeout=30) for f in [pilot.submit(t.inc, i) for i in range(20)]] == list(range(1, 21))


@pytest.mark.parametrize("how", ["exit", "kill", "segfault"])
def test_worker_death_fails_task_and_pilot_goes_on(pilot, how):
    before = {pilot.submit(t.pid).result(30) for _ in range(20)}
    fut = pilot.submit(t.die, how)
    with pytest.raises(shoal.WorkerLost, match="died"):
        fut.result(timeout=30)
    assert [f.result(timeout=30) for f in [pilot.submit(t.inc, i) for i in range(50)]] == list(range(1, 51))
    after = {pilot.submit(t.pid).result(30) for _ in range(50)}
    assert after - before, "a replacement worker should have appeared"


def test_worker_death_with_retries(pilot, tmp_path):
    marker = str(tmp_path / "died")
    assert pilot.options(retries=1).submit(t.die_once, marker).result(timeout=30) == "survived"


def test_stats(pilot):
    pilot.submit(t.inc, 1).result(30)
    stats = pilot.stats()
    assert stats["backend"] == "local"
    assert len(stats["workers"]) == 2
    for w in stats["workers"]:
        for key in ("tasks_run", "spawned", "steal_requests_sent", "stolen_local", "stolen_remote",
                    "idle_s", "messages_in", "messages_out", "cpu", "node"):
            assert key in w
    assert sum(w["tasks_run"] for w in stats["workers"]) > 0


def test_current_worker(pilot):
    info = pilot.submit(t.where).result(30)
    assert isinstance(info, shoal.WorkerInfo) and 1 <= info.id <= 2
    assert shoal.current_worker() is None


def test_bad_input_at_call_site(pilot):
    with pytest.raises(TypeError, match="callable"):
        pilot.submit(42)
    with pytest.raises(ValueError, match="retries"):
        pilot.options(retries=-1)
    with pytest.raises(ValueError, match="timeout"):
        pilot.options(timeout=0)


def test_waiting_semantics_many_threads_and_timeouts(pilot):
    import threading

    slow = pilot.submit(t.sleep, 0.3)
    with pytest.raises(cf.TimeoutError):
        slow.result(timeout=0.01)
    done, not_done = cf.wait([slow], timeout=0.01)
    assert not done and not_done == {slow}
    with pytest.raises(cf.TimeoutError):
        list(cf.as_completed([slow], timeout=0.01))
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(slow.result(30))) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert seen == [0.3] * 8
    called = []
    slow.add_done_callback(lambda f: called.append(f.result()))  # already done: runs at once
    assert called == [0.3]
    assert repr(slow).startswith("<shoal.Future")


def test_cancel_running_future_releases_waiters(pilot):
    """A running task is not cancelled by ``cancel()`` (stdlib); ``force=True`` does it."""
    fut = pilot.submit(t.sleep, 30)
    while not fut.running():
        time.sleep(0.01)
    assert not fut.cancel()
    assert pilot.cancel(fut, force=True)
    done, not_done = cf.wait([fut], timeout=5)
    assert fut in done and not not_done and fut.cancelled()
    assert list(cf.as_completed([fut], timeout=5)) == [fut]


def test_cancel_twice(pilot):
    blockers = [pilot.submit(t.sleep, 30) for _ in range(2)]
    deadline = time.monotonic() + 60
    while not all(b.running() for b in blockers):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fut = pilot.submit(t.sleep, 0.3)  # queued behind the blockers
    assert fut.cancel() and fut.cancel()
    assert fut.cancelled()
    assert all(pilot.cancel(b, force=True) for b in blockers)


@pytest.mark.parametrize("size", [300_000, 5_000_000, 30_000_000])
def test_big_arguments_and_results(pilot, size):
    """Messages bigger than a ring travel in fragments, both ways."""
    assert pilot.submit(len, b"x" * size).result(60) == size
    assert len(pilot.submit(bytes, size).result(60)) == size
