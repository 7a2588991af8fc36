"""pilot.options(retries=, retry_delay=, priority=) on the local backend, with real workers:
a retry waits its delay (the gaps between attempts, from timestamps the task writes), a
retry waiting out its delay can be cancelled, and what the local backend cannot honour
(priority: nothing waits there to be ordered) is refused in one line saying why."""

from __future__ import annotations

import os

import pytest
import rt_tasks as t

import shoal


def _starts(path):
    with open(path) as f:
        return [float(x) for x in f.read().split()]


@pytest.mark.parametrize("delay, waits", [
    (0.3, [0.3, 0.3]),
    (shoal.Backoff(base=0.2, factor=2, cap=5), [0.2, 0.4]),
])
def test_each_retry_waits_its_delay(tmp_path, delay, waits):
    stamps = str(tmp_path / "stamps")
    with shoal.Pilot(workers=2) as pilot:
        fut = pilot.options(retries=2, retry_delay=delay).submit(t.stamp_until, stamps, 3)
        assert fut.result(timeout=60) == 3
    starts = _starts(stamps)
    assert len(starts) == 3
    for (a, b), wait in zip(zip(starts, starts[1:], strict=False), waits, strict=True):
        assert b - a >= wait  # the attempt itself takes time too: the gap is at least the delay


def test_without_retry_delay_the_retry_is_immediate_and_results_are_unchanged(tmp_path):
    stamps = str(tmp_path / "stamps")
    with shoal.Pilot(workers=1) as pilot:
        assert pilot.options(retries=1).submit(t.stamp_until, stamps, 2).result(timeout=60) == 2
        with pytest.raises(RuntimeError, match="attempt 2"):  # retries run out: the last error
            pilot.options(retries=1, retry_delay=0.05).submit(t.stamp_until, stamps + "2", 10).result(timeout=60)
        assert pilot.submit(t.inc, 1).result(timeout=60) == 2


def test_a_retry_waiting_out_its_delay_is_cancelled_and_never_runs(tmp_path):
    stamps = str(tmp_path / "stamps")
    with shoal.Pilot(workers=1) as pilot:
        fut = pilot.options(retries=3, retry_delay=30).submit(t.stamp_until, stamps, 99)
        t.until(lambda: os.path.exists(stamps), what="the first attempt")
        t.until(lambda: not fut.running(), what="the first attempt to fail")
        assert fut.cancel()
        assert fut.cancelled()
        assert pilot.submit(t.inc, 1).result(timeout=60) == 2
    assert len(_starts(stamps)) == 1


def test_a_stale_status_cell_does_not_make_a_delayed_retry_running(tmp_path):
    """A worker clears its status cell only after the result is in its ring, so the driver may
    read the failed attempt's id there after it has deferred the retry.  Such a read once made
    the future RUNNING for the whole delay: ``running()`` said True, ``cancel()`` said False
    and the retry ran (a flaky failure of the test above under load).  Here the stale cell is
    written on purpose, after the retry is deferred."""
    from shoal.runtime.worker import STATUS_DEPTH, STATUS_RUNNING

    stamps = str(tmp_path / "stamps")
    with shoal.Pilot(workers=1) as pilot:
        backend = pilot._backend
        fut = pilot.options(retries=3, retry_delay=30).submit(t.stamp_until, stamps, 99)
        t.until(lambda: backend.retries.next_due() is not None, what="the retry to be deferred")
        (ep,) = backend.endpoints
        cell = backend.matrix.status(ep)
        cell[STATUS_RUNNING] = fut.task_id  # what the worker showed while the attempt ran
        cell[STATUS_DEPTH] = 1
        try:
            assert not fut.running()
            assert fut.cancel()
        finally:
            cell[STATUS_DEPTH] = 0
        assert fut.cancelled()
        assert pilot.submit(t.inc, 1).result(timeout=60) == 2
    assert len(_starts(stamps)) == 1


def test_local_backend_refuses_a_priority_and_says_why():
    with shoal.Pilot(workers=1) as pilot:
        with pytest.raises(ValueError, match="priority=5: the local backend sends each task"):
            pilot.options(priority=5).submit(t.inc, 1)
        assert pilot.options(priority=0).submit(t.inc, 1).result(timeout=60) == 2
        with pytest.raises(ValueError, match="apply to submit"):
            pilot.options(retries=1, retry_delay=1).map(t.inc, [1, 2])


@pytest.mark.parametrize("kwargs, word", [
    ({"retry_delay": -1}, "retry_delay"), ({"retry_delay": "1s"}, "retry_delay"),
    ({"priority": 1.5}, "priority"), ({"priority": True}, "priority")])
def test_bad_options_name_the_culprit(kwargs, word):
    with shoal.Pilot(workers=1) as pilot:
        with pytest.raises(ValueError, match=word):
            pilot.options(retries=1, **kwargs)
