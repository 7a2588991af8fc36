"""The workers view's pure derivation: busy % from the workers' own counters, states from
status words, replacement of a worker's process, totals."""

from __future__ import annotations

from shoal.dashboard.workers import Workers, WorkerState, state_of, totals


def _stats(pid, uptime, idle, tasks=0, local=0, remote=0, msgs=0, at=0.0):
    return {"pid": pid, "uptime_s": uptime, "idle_s": idle, "tasks_run": tasks, "stolen_local": local,
            "stolen_remote": remote, "messages_in": msgs, "messages_out": 0, "at": at, "queued": 0}


def _sample(*rows):
    return {"backend": "local", "workers": list(rows)}


def _row(worker, pid, stats, running=0, hungry=False, parked=False, gen=0):
    return {"worker": worker, "pid": pid, "cpu": worker - 1, "node": 0, "generation": gen,
            "running": running, "hungry": hungry, "parked": parked, "stats": stats}


def test_busy_percent_comes_from_idle_and_uptime_deltas():
    v = Workers(interval=1.0)
    rows = v.update(_sample(_row(1, 10, _stats(10, 1.0, 0.5, tasks=5, at=1.0))), now=1.0)
    assert rows[0]["busy"] is None  # one answer: no difference yet
    rows = v.update(_sample(_row(1, 10, _stats(10, 2.0, 0.75, tasks=9, local=2, remote=1, msgs=100,
                                               at=2.0))), now=2.0)
    r = rows[0]
    assert r["busy"] == 75.0 and r["tasks"] == 9 and r["state"] == WorkerState.BUSY.value
    assert r["ring_msgs_per_s"] == 100.0
    assert r["history"][-1][1:] == [0.75, 3]  # busy fraction, steals in this interval


def test_no_new_answer_while_running_a_long_task_counts_as_busy():
    v = Workers(interval=1.0)
    old = _stats(10, 1.0, 0.9, at=1.0)
    v.update(_sample(_row(1, 10, old)), now=1.0)
    rows = v.update(_sample(_row(1, 10, old, running=1)), now=5.0)  # the same stale answer
    assert rows[0]["busy"] == 100.0 and rows[0]["state"] == "busy"


def test_a_replaced_worker_shows_its_new_pid_and_keeps_the_tasks_of_the_dead_one():
    v = Workers(interval=1.0)
    v.update(_sample(_row(1, 10, _stats(10, 1.0, 0.0, tasks=40, at=1.0))), now=1.0)
    rows = v.update(_sample(_row(1, 11, None, gen=1)), now=2.0)  # the replacement has not answered
    r = rows[0]
    assert r["pid"] == 11 and r["replaced"] == 1 and r["previous_pids"] == [10]
    assert r["state"] == WorkerState.STARTING.value and r["tasks_total"] == 40
    rows = v.update(_sample(_row(1, 11, _stats(11, 0.5, 0.0, tasks=3, at=2.5), gen=1)), now=3.0)
    assert rows[0]["tasks_total"] == 43 and rows[0]["tasks"] == 3


def test_an_answer_from_the_previous_process_is_ignored():
    v = Workers(interval=1.0)
    v.update(_sample(_row(1, 10, _stats(10, 1.0, 0.0, tasks=4, at=1.0))), now=1.0)
    rows = v.update(_sample(_row(1, 11, _stats(10, 2.0, 0.0, tasks=8, at=2.0), gen=1)), now=2.0)
    assert rows[0]["pid"] == 11 and rows[0]["tasks"] == 0


def test_state_priority():
    assert state_of(1, False, True, None, True) is WorkerState.PARKED
    assert state_of(1, True, False, 0.0, True) is WorkerState.BUSY
    assert state_of(0, True, False, None, True) is WorkerState.STEALING
    assert state_of(0, False, False, None, False) is WorkerState.STARTING
    assert state_of(0, False, False, 0.9, True) is WorkerState.BUSY
    assert state_of(0, False, False, 0.1, True) is WorkerState.IDLE
    assert state_of(1, False, True, 1.0, True, down=True) is WorkerState.DOWN
    assert state_of(1, False, False, 1.0, True, stopped=True) is WorkerState.STOPPED


def test_stats_shaped_samples_without_status_words_work_too():
    """A backend without monitor() (dask): rows straight from stats(), grouped by machine."""
    v = Workers(interval=1.0)
    sample = {"backend": "dask", "workers": [
        {**_stats(20, 1.0, 0.5, tasks=3), "worker": 1, "cpu": 0, "node": 0, "dask_worker": "tcp://a:1"},
        {"worker": 1, "unresponsive": True, "dask_worker": "tcp://b:1"},
    ]}
    rows = v.update(sample, now=1.0)
    assert [r["dask_worker"] for r in rows] == ["tcp://a:1", "tcp://b:1"]
    assert rows[0]["pid"] == 20 and rows[0]["tasks"] == 3
    assert rows[1]["state"] == WorkerState.STARTING.value
    t = totals(rows)
    assert t["tasks"] == 3 and t["replaced"] == 0


def test_history_keeps_one_minute():
    v = Workers(interval=1.0)
    for i in range(100):
        rows = v.update(_sample(_row(1, 10, _stats(10, i + 1.0, 0.0, at=i))), now=float(i))
    assert len(rows[0]["history"]) == 60
