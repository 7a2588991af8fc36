"""Queueing behind (engine.py ``_may_queue``, scheduler.py ``place(queue=True)``): while a run's
tasks are short, each CPU's runner gets its next task before the current one ends.  Real
processes and a real journal; ``QUEUE_BELOW_S`` is raised so that queueing happens whatever
the machine's load (the policy that decides *when* to queue is not what is tested here)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3

import pytest

from shoal.ensemble import Pipeline, Stage, Task, TaskState, run
from shoal.patterns.ensemble import engine


@pytest.fixture
def always_queue(monkeypatch):
    monkeypatch.setattr(engine, "QUEUE_BELOW_S", 1e9)


def _rows(journal):
    with contextlib.closing(sqlite3.connect(journal)) as db:
        return {uid: (state, started, finished) for uid, state, started, finished in
                db.execute("SELECT uid, state, started, finished FROM tasks")}


def test_a_task_bounced_from_behind_a_long_one_runs_once_with_its_own_timeout(tmp_path, always_queue,
                                                                           monkeypatch):
    """B (0.3 s of work, timeout 1 s) is queued behind A (1.5 s) on the only CPU; once A outlives
    the quick window, B is bounced back, waits for A in the engine (nothing queues behind a long
    task), then runs with its attempt count unchanged and its timeout counted from its own
    start (it would be killed at once if its clock had started when it was first placed)."""
    from shoal.patterns.ensemble import runners

    bounced = []
    real = engine.Engine._take_event

    def spy(self, kind, item, a, *rest):
        if a is runners.BOUNCED:
            bounced.append(item.uid)
        return real(self, kind, item, a, *rest)

    monkeypatch.setattr(engine.Engine, "_take_event", spy)
    quick = [Task(executable="/bin/true", name=f"q{i}") for i in range(3)]
    a = Task(executable="/bin/sleep", arguments=["1.5"], name="a")
    b = Task(executable="/bin/sleep", arguments=["0.3"], name="b", timeout=1.0)
    journal = str(tmp_path / "run.db")
    report = run(Pipeline([Stage(quick + [a, b])], name="p"), journal=journal, cores=1)
    assert report.ok and report.done == 5, report.failures
    assert bounced == ["p.s0.b"], bounced
    with contextlib.closing(sqlite3.connect(journal)) as db:
        assert db.execute("SELECT attempt FROM tasks WHERE uid='p.s0.b'").fetchone() == (1,)
    rows = _rows(journal)
    assert rows["p.s0.b"][1] >= rows["p.s0.a"][2] - 0.01, "b started before a ended on the only CPU"


def _interrupt(results) -> bool:  # a when=, evaluated by the driver right before the task may start
    os.kill(os.getpid(), signal.SIGINT)  # the run drains as after Ctrl-C
    return True


def test_a_drain_leaves_queued_tasks_pending_and_each_task_runs_once(tmp_path, always_queue):
    """Ctrl-C while tasks wait behind others: those were never started (their runner answers
    NOT_STARTED, nothing of theirs ran), they go back to PENDING, and a resume runs each of
    them once; the tasks journaled DONE by the first run never run again.  (A task that was
    running when the drain came is killed and left PENDING, so it may run twice: the drain's
    rule for running tasks, queued or not.)"""
    log = tmp_path / "ran.log"
    line = f"echo $SHOAL_TASK >> {log}"

    def workflow():
        tasks = [Task(executable="/bin/sh", arguments=["-c", line], name=f"t{i}") for i in range(120)]
        tasks[60].when = _interrupt
        return Pipeline([Stage(tasks)], name="p")

    journal = str(tmp_path / "run.db")
    first = run(workflow(), journal=journal, cores=2)
    assert first.drained and first.interrupted == "SIGINT", first
    rows = _rows(journal)
    assert TaskState.RUNNING.value not in {s for s, _, _ in rows.values()}
    done_first = {uid for uid, (s, _, _) in rows.items() if s == TaskState.DONE.value}
    ran_first = set(log.read_text().split())
    second = run(workflow(), journal=journal, cores=2, resume=True)
    assert second.ok, second.failures
    ran = log.read_text().split()
    every = {f"p.s0.t{i}" for i in range(120)}
    assert set(ran) == every
    again = [uid for uid in ran[len(ran_first):] if uid in ran_first]
    assert not set(again) & done_first, "a task journaled DONE ran again"
    assert len(again) <= 2, f"more tasks ran twice than were running at the drain (2 CPUs): {again}"
    assert len(ran_first) < 120, "the drain came after everything had run: the test proves nothing"
    assert {s for s, _, _ in _rows(journal).values()} == {TaskState.DONE.value}


def test_no_queueing_under_a_walltime_or_for_long_tasks(tmp_path):
    """The default policy: with a walltime set, or tasks averaging QUEUE_BELOW_S or more, every
    task is placed only on a free CPU (a queued one would show as running before it starts)."""
    tasks = [Task(executable="/bin/sleep", arguments=["0.12"], name=f"t{i}") for i in range(6)]
    journal = str(tmp_path / "run.db")
    report = run(Pipeline([Stage(tasks)], name="p"), journal=journal, cores=1)
    assert report.ok
    rows = sorted(_rows(journal).values(), key=lambda r: r[1])
    for before, after in zip(rows, rows[1:], strict=False):
        assert after[1] >= before[2] - 0.01, "a task was journaled running before the one ahead ended"


def test_nothing_waits_behind_a_long_task_while_another_cpu_works(tmp_path, always_queue):
    """A task queued behind one that turns out long (it outlives the runner's 5 ms quick
    window) is bounced back and placed again, and nothing more queues behind the long one:
    the 20 short tasks and B all end before A (2 s) does, on the other CPU."""
    first = [Task(executable="/bin/true", name=f"q{i}") for i in range(2)]  # the run's mean: short
    a = Task(executable="/bin/sleep", arguments=["2"], name="a")
    short = [Task(executable="/bin/true", name=f"s{i}") for i in range(20)]
    b = Task(executable="/bin/sleep", arguments=["0.2"], name="b")
    journal = str(tmp_path / "run.db")
    report = run(Pipeline([Stage(first + [a] + short + [b])], name="p"), journal=journal, cores=2)
    assert report.ok and report.done == 24, report.failures
    rows = _rows(journal)
    late = {uid: f - rows["p.s0.a"][2] for uid, (_, _, f) in rows.items() if uid != "p.s0.a" and f > rows["p.s0.a"][2]}
    assert not late, f"tasks that waited behind the long one: {late}"
