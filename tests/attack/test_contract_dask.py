"""Attacks on the stdlib cancel contract on a dask pilot (shoal/backends/dask/claims.py,
cancel.py): ``cancel()`` True => the task never runs and the future is CANCELLED; False =>
it runs (or ran) and its result arrives; ``pilot.cancel_many`` answers what each future's
``cancel()`` would; nothing hangs.

Real dask scheduler and worker processes (LocalCluster); every task blocks on a file the
test creates, and writes an O_APPEND mark when it starts (the side effect checked).  No
wall-clock assertion: each wait is bounded only against a hang.
"""

from __future__ import annotations

import dask_contract_tasks as dt
import pytest
import rt_tasks as t
from dask_cluster import local_cluster, wait_until

import shoal
from shoal.backends.dask import cancel as dcancel

pytestmark = pytest.mark.fd_slack(8)


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # a LocalCluster starts it; it is no leak


@pytest.fixture(scope="module")
def cluster():
    c = local_cluster(2)
    yield c
    c.close()


def test_cancel_many_answers_like_cancel_for_foreign_duplicate_and_done_futures(cluster, tmp_path):
    """``pilot.cancel_many`` given a pending future of ANOTHER pilot (a second dask pilot on
    the same cluster, and a local pilot), a duplicate, and a finished future.  Before: the
    foreign pending futures were answered False without being asked (their own ``cancel()``
    says True) and ran."""
    marks, gate = str(tmp_path / "marks"), str(tmp_path / "gate")
    with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as mine, \
            shoal.Pilot(backend="dask", cluster=cluster, workers=1) as other, \
            shoal.Pilot(workers=1) as local:
        done = mine.submit(t.inc, 1)
        assert done.result(60) == 2
        blockers = [other.submit(dt.gated, marks, f"b{i}", gate) for i in range(2)]
        blockers.append(local.submit(dt.gated, marks, "lb", gate))
        wait_until(lambda: {"b0", "b1", "lb"} <= set(dt.started(marks)), 60, "blockers to start")
        foreign = other.submit(dt.gated, marks, "fq", gate)  # both dask workers are busy
        behind = local.submit(dt.gated, marks, "lq", gate)  # behind lb on the one local worker
        own = mine.submit(dt.gated, marks, "own", gate)
        answers = mine.cancel_many([foreign, behind, own, own, done, blockers[0]])
        assert answers == [True, True, True, True, False, False], answers
        assert foreign.cancelled() and behind.cancelled() and own.cancelled()
        t.release(gate)
        assert [b.result(60) for b in blockers] == ["b0", "b1", "lb"]
    ran = dt.started(marks)
    assert not {"fq", "lq", "own"} & set(ran), f"a future cancel_many called cancelled ran: {ran}"


def test_a_holder_answering_late_never_turns_false_into_cancelled(monkeypatch, tmp_path):
    """The dask worker holding queued tasks takes them back (from its node runtime's queue)
    and then answers after the driver gave up waiting (its event loop stalls: a GC pause, a
    SIGSTOP between taking and replying, a slow link).  ``cancel()`` says False, so each
    task must run and deliver its result.  Before: the taken tasks never ran and their
    futures ended CANCELLED after ``cancel()`` had said False (4 of 4 in each run)."""
    monkeypatch.setattr(dcancel, "CLAIM_TIMEOUT_S", 1.0)
    marks, gate = str(tmp_path / "marks"), str(tmp_path / "gate")
    from distributed import LocalCluster

    # one dask worker of 3 threads and 1 shoal worker: the blocker runs, 2 tasks wait in
    # the node runtime's queue (each in a dask thread, inside run_task)
    with LocalCluster(n_workers=1, threads_per_worker=3, processes=True,
                      dashboard_address=None) as c, \
            shoal.Pilot(backend="dask", cluster=c, workers=1) as pilot:
        be = pilot._backend
        blocker = pilot.submit(dt.gated, marks, "b", gate)
        wait_until(lambda: "b" in dt.started(marks), 60, "the blocker to start")
        queued = [pilot.submit(dt.gated, marks, f"q{i}", gate) for i in range(2)]
        keys = [be._dask_of[q].key for q in queued]
        wait_until(lambda: sorted(sum(be.client.run(dt.queued_in_node, be.token, keys).values(),
                                      [])) == sorted(keys), 60, "both queued in the node runtime")
        be.client.run(dt.slow_replies, 2.0)
        try:
            answers = [q.cancel() for q in queued]
        finally:
            be.client.run(dt.prompt_replies)
        assert answers == [False, False]  # the holder's reply came after the 1 s wait
        t.release(gate)
        assert blocker.result(60) == "b"
        outcomes = []
        for q in queued:
            try:
                outcomes.append(q.result(60))
            except BaseException as exc:  # noqa: BLE001 - the bug: CancelledError
                outcomes.append(f"{type(exc).__name__} cancelled={q.cancelled()}")
        assert outcomes == ["q0", "q1"], outcomes
    assert sorted(dt.started(marks)) == ["b", "q0", "q1"]


def test_results_arrive_after_cancel_false_even_on_a_prompt_take(tmp_path):
    """The normal path still takes: the same queued tasks, the holder answering at once:
    True, and they never run (the node's ``run_task`` returns once dask releases the key)."""
    marks, gate = str(tmp_path / "marks"), str(tmp_path / "gate")
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=3, processes=True,
                      dashboard_address=None) as c, \
            shoal.Pilot(backend="dask", cluster=c, workers=1) as pilot:
        be = pilot._backend
        blocker = pilot.submit(dt.gated, marks, "b", gate)
        wait_until(lambda: "b" in dt.started(marks), 60, "the blocker to start")
        queued = [pilot.submit(dt.gated, marks, f"q{i}", gate) for i in range(2)]
        keys = [be._dask_of[q].key for q in queued]
        wait_until(lambda: sorted(sum(be.client.run(dt.queued_in_node, be.token, keys).values(),
                                      [])) == sorted(keys), 60, "both queued in the node runtime")
        assert [q.cancel() for q in queued] == [True, True]
        after = pilot.submit(t.inc, 41)  # the dask threads the taken tasks held come back
        t.release(gate)
        assert blocker.result(60) == "b" and after.result(60) == 42
        assert all(q.cancelled() for q in queued)
    assert dt.started(marks) == ["b"]
