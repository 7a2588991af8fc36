"""Priorities and retry delays of ensemble tasks, checked on real runs from the journal's
timestamps: higher priority starts first among ready tasks (stage order and after= still
hold); a retry waits its retry_delay (fixed or shoal.Backoff) after the failed attempt."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

import shoal
from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run
from shoal.patterns.ensemble.yamlfile import load_yaml as load_workflow

NAP = ["-c", "sleep 0.02"]


def _rows(db):
    with contextlib.closing(sqlite3.connect(db)) as c:
        return {uid: (started, finished) for uid, started, finished in
                c.execute("SELECT uid, started, finished FROM tasks")}


def test_ten_high_priority_tasks_start_before_a_hundred_low_ones(tmp_path):
    db = str(tmp_path / "run.db")
    low = [Task(executable="/bin/sh", arguments=NAP, name=f"low{i}") for i in range(100)]
    high = [Task(executable="/bin/sh", arguments=NAP, name=f"high{i}", priority=10) for i in range(10)]
    # the high ones come last in the stage: arrival order alone would start them last
    report = run(Pipeline([Stage(low + high)]), journal=db, cores=2, window=256)
    assert report.ok and report.done == 110
    rows = _rows(db)
    high_starts = [rows[f"p0.s0.high{i}"][0] for i in range(10)]
    low_starts = [rows[f"p0.s0.low{i}"][0] for i in range(100)]
    assert max(high_starts) <= min(low_starts)


def test_stage_priority_orders_pipelines_and_the_stage_barrier_still_holds(tmp_path):
    db = str(tmp_path / "run.db")
    first = Pipeline([Stage([Task(executable="/bin/sh", arguments=NAP) for _ in range(4)]),
                      Stage([Task(executable="/bin/sh", arguments=NAP) for _ in range(4)], priority=100)],
                     name="a")
    urgent = Pipeline([Stage([Task(executable="/bin/sh", arguments=NAP) for _ in range(6)], priority=5)],
                      name="b")
    gate = Task(executable="/bin/sh", arguments=NAP, name="gate")
    follower = Task(executable="/bin/sh", arguments=NAP, name="follower", priority=1000, after=["c.s0.gate"])
    third = Pipeline([Stage([gate, follower])], name="c")
    report = run([first, urgent, third], journal=db, cores=2)
    assert report.ok and report.done == 16
    rows = _rows(db)
    b = [rows[f"b.s0.t{i}"][0] for i in range(6)]
    a0 = [rows[f"a.s0.t{i}"] for i in range(4)]
    a1 = [rows[f"a.s1.t{i}"][0] for i in range(4)]
    assert max(b) <= min(s for s, _ in a0)  # stage priority 5 before the default 0
    assert min(a1) >= max(f for _, f in a0)  # priority 100 never jumps its stage barrier
    assert rows["c.s0.follower"][0] >= rows["c.s0.gate"][1]  # nor an after=


def _flaky(tmp_path, fail_times: int):
    """An executable that fails ``fail_times`` times, then succeeds."""
    count = tmp_path / "count"
    return ["-c", f'n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; '
                  f'[ "$n" -gt {fail_times} ]']


def _attempts(db, uid):
    """[(started, finished)] of each attempt: the failed ones' rows, then the task's own."""
    with contextlib.closing(sqlite3.connect(db)) as c:
        failed = c.execute("SELECT started, finished FROM failed_attempts WHERE uid=? AND attempt < "
                           "(SELECT attempt FROM tasks WHERE uid=?) ORDER BY attempt", (uid, uid)).fetchall()
        last = c.execute("SELECT started, finished FROM tasks WHERE uid=?", (uid,)).fetchone()
    return failed + [last]


@pytest.mark.parametrize("delay, waits", [
    (0.3, [0.3, 0.3]),
    (shoal.Backoff(base=0.2, factor=2, cap=5), [0.2, 0.4]),
])
def test_retry_waits_its_delay_after_each_failed_attempt(tmp_path, delay, waits):
    db = str(tmp_path / "run.db")
    task = Task(executable="/bin/sh", arguments=_flaky(tmp_path, 2), retries=2, retry_delay=delay, name="f")
    report = run(Pipeline([Stage([task])]), journal=db, cores=1)
    assert report.ok and report.retries == 2
    attempts = _attempts(db, "p0.s0.f")
    assert len(attempts) == 3
    for (_, ended), (started, _), wait in zip(attempts, attempts[1:], waits, strict=False):
        assert started - ended >= wait - 0.005  # journal timestamps, written before each start
        assert started - ended < wait + 30  # sanity only: no wall-clock bound is asserted


def test_run_and_stage_defaults_and_what_a_task_says_wins(tmp_path):
    db = str(tmp_path / "run.db")
    wf = Pipeline([Stage([Task(executable="/bin/sh", arguments=_flaky(tmp_path, 1), name="staged"),
                          Task(executable="/bin/false", name="own", retries=0)],
                         retries=1, retry_delay=0.2)])
    report = run(wf, journal=db, cores=2)
    assert report.done == 1 and report.failed == 1 and report.retries == 1
    (_, ended), (started, _) = _attempts(db, "p0.s0.staged")
    assert started - ended >= 0.2 - 0.005
    report = run(Pipeline([Stage([Task(executable="/bin/false", name="x")])]), journal=str(tmp_path / "b.db"),
                 cores=1, retries=2, retry_delay=0.1)
    assert report.failed == 1 and report.retries == 2
    assert len(_attempts(str(tmp_path / "b.db"), "p0.s0.x")) == 3


def test_function_task_retry_delay_on_a_pilot(tmp_path):
    from ens_tasks import flaky

    db = str(tmp_path / "run.db")
    with shoal.Pilot(workers=2) as pilot:
        task = Task(function=flaky, args=(str(tmp_path / "counter"), 2), retries=2, retry_delay=0.2, name="fn")
        report = run(Pipeline([Stage([task])]), pilot=pilot, journal=db)
    assert report.ok and report.retries == 2
    attempts = _attempts(db, "p0.s0.fn")
    assert all(b[0] - a[1] >= 0.2 - 0.005 for a, b in zip(attempts, attempts[1:], strict=False))


@pytest.mark.parametrize("field, value, word", [
    ("priority", 1.5, "priority"), ("priority", "high", "priority"),
    ("retry_delay", -1, "retry_delay"), ("retry_delay", "2s", "retry_delay")])
def test_bad_policy_fields_name_the_task(field, value, word):
    t = Task(executable="/bin/true", name="t", **{field: value})
    with pytest.raises(EnsembleError, match=f"task t: {word}"):
        t.validate()


def test_yaml_priority_and_retry_delay(tmp_path):
    wf = tmp_path / "wf.yaml"
    wf.write_text("""
pipelines:
  - name: p
    stages:
      - name: s
        priority: 3
        retries: 2
        retry_delay: {base: 1, factor: 2, cap: 30, jitter: 0.1}
        tasks:
          - {executable: /bin/true, name: a}
          - {executable: /bin/true, name: b, priority: -1, retry_delay: 5}
""")
    (p,) = load_workflow(str(wf))
    s = p.stages[0]
    assert (s.priority, s.retries, s.retry_delay) == (3, 2, shoal.Backoff(1, 2, 30, 0.1))
    a, b = s.tasks
    assert (a.priority, a.retry_delay) == (None, None) and (b.priority, b.retry_delay) == (-1, 5)
    wf.write_text(wf.read_text().replace("jitter: 0.1", "jitter: 0.1, spread: 2"))
    with pytest.raises(EnsembleError, match="retry_delay: unknown key 'spread'"):
        load_workflow(str(wf))


def test_entk_task_priority_and_appmanager_retries(tmp_path):
    from shoal import entk

    def task(name, script, priority=None):
        t = entk.Task()
        t.name, t.executable, t.arguments = name, "/bin/sh", ["-c", script]
        if priority is not None:
            t.priority = priority
        return t

    s = entk.Stage()
    s.add_tasks([task(f"low{i}", "sleep 0.02") for i in range(6)])
    s.add_tasks([task("high", "sleep 0.02", priority=5)])
    script = tmp_path / "flaky.sh"  # a file: EnTK's tasks run through a shell, which would expand $n
    script.write_text(_flaky(tmp_path, 1)[1] + "\n")
    flaky = entk.Task()
    flaky.name, flaky.executable, flaky.arguments = "flaky", "/bin/sh", [str(script)]
    s.add_tasks([flaky])
    p = entk.Pipeline()
    p.name = "p"
    p.add_stages(s)
    db = str(tmp_path / "entk.db")
    appman = entk.AppManager(journal=db, retries=1, retry_delay=0.2, progress=False)
    appman.resource_desc = {"resource": "local.localhost", "walltime": 10, "cpus": 1}
    appman.workflow = [p]
    appman.run()
    assert appman.report.retries == 1
    rows = _rows(db)
    assert rows["p.s0.high"][0] <= min(rows[f"p.s0.low{i}"][0] for i in range(6))
    (_, ended), (started, _) = _attempts(db, "p.s0.flaky")
    assert started - ended >= 0.2 - 0.005


def test_changing_priority_or_retry_delay_and_resuming_is_the_same_workflow(tmp_path):
    db = str(tmp_path / "run.db")

    def wf(prio, delay):
        return Pipeline([Stage([Task(executable="/bin/true", name="a", priority=prio, retry_delay=delay),
                                Task(executable="/bin/false", name="b")])])

    assert run(wf(0, None), journal=db, cores=1).failed == 1
    report = run(wf(9, shoal.Backoff(base=2)), journal=db, cores=1, resume=True, retry_failed=True)
    assert report.done == 1 and report.failed == 1  # resumed (not refused); a stayed DONE
