"""The elastic pilot's grow/shrink policy (shoal/backends/dask/elastic.py), pure: Hypothesis
drives ``decide`` with random snapshots and a random run of bursts; default suite."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.backends.dask.elastic import Action, Bounds, Job, View, decide, parse_jobs

bounds_st = st.integers(0, 4).flatmap(
    lambda low: st.builds(Bounds, st.just(low), st.integers(max(low, 1), 9), st.integers(1, 4),
                          st.sampled_from([0.0, 5.0, 10.0]), st.sampled_from([0.0, 30.0, 60.0])))


@st.composite
def views(draw):
    running = draw(st.lists(st.tuples(st.floats(0, 200), st.integers(0, 2)), max_size=9))
    pending = draw(st.integers(0, 9 - len(running)))
    return View(waiting=draw(st.lists(st.floats(0, 100), max_size=40)),
                running=[Job(f"r{i}", idle, tasks) for i, (idle, tasks) in enumerate(running)],
                pending=[f"p{i}" for i in range(pending)])


def after(view: View, d) -> int:
    return len(view.running) + len(view.pending) + d.submit - len(d.cancel) - len(d.retire)


@given(views(), bounds_st)
def test_never_past_the_maximum_nor_below_the_minimum(view, bounds):
    d = decide(view, bounds)
    before = len(view.running) + len(view.pending)
    n = after(view, d)
    assert n <= max(bounds.high, before)  # never grows past high (a pilot already past it: no growth)
    if d.submit:
        assert n <= bounds.high
    assert n >= min(bounds.low, before) or d.submit  # shrinks never cross low
    if before < bounds.low:
        assert n >= bounds.low


@given(views(), bounds_st)
def test_every_step_is_legal_and_has_a_reason(view, bounds):
    d = decide(view, bounds)
    pending, running = set(view.pending), {j.job_id: j for j in view.running}
    assert set(d.cancel) <= pending and len(set(d.cancel)) == len(d.cancel)
    assert set(d.retire) <= set(running) and len(set(d.retire)) == len(d.retire)
    for job_id in d.retire:  # only idle jobs are given back, and only while nothing waits
        job = running[job_id]
        assert job.tasks == 0 and job.idle_s >= bounds.idle_after_s and not view.waiting
    assert not d.cancel or not view.waiting
    assert all(s.reason for s in d.steps)
    assert not (d.submit and (d.retire or d.cancel)) or len(view.running) + len(view.pending) < bounds.low


@given(views(), bounds_st)
def test_tasks_waiting_past_the_threshold_get_the_jobs_they_need(view, bounds):
    d = decide(view, bounds)
    if view.waiting and max(view.waiting) >= bounds.grow_after_s:
        need = math.ceil(len(view.waiting) / bounds.slots_per_job)
        total = len(view.running) + len(view.pending) + d.submit
        assert len(view.pending) + d.submit >= need or total >= bounds.high
        assert not d.retire and not d.cancel


@given(views(), bounds_st)
def test_a_decision_applied_is_stable(view, bounds):
    """Apply the decision (submitted jobs pending, cancelled gone, retired gone): deciding again
    on the same queue asks for nothing more of the same kind (no flapping)."""
    d = decide(view, bounds)
    retired, cancelled = set(d.retire), set(d.cancel)
    nxt = View(view.waiting, [j for j in view.running if j.job_id not in retired],
               [p for p in view.pending if p not in cancelled] + [f"new{i}" for i in range(d.submit)])
    d2 = decide(nxt, bounds)
    assert d2.submit == 0 and not d2.cancel and not d2.retire


@settings(max_examples=60)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), bounds_st)
def test_a_run_of_bursts_grows_then_shrinks_to_the_minimum(bursts, bounds):
    """A toy cluster stepped in 10 s periods: jobs start one period after submission, a task
    takes one period; the pilot stays within bounds and ends at the minimum once idle."""
    waiting: list[float] = []
    pending: list[str] = []
    running: dict[str, float] = {}
    busy: set[str] = set()
    serial = 0
    for period in range(len(bursts) + sum(bursts) + 40):
        waiting = [a + 10 for a in waiting] + [0.0] * (bursts[period] if period < len(bursts) else 0)
        for job in pending:  # pending jobs start
            running[job] = 0.0
        pending = []
        busy.clear()
        for job in list(running):  # each running job takes slots_per_job tasks for a period
            took = waiting[:bounds.slots_per_job]
            waiting = waiting[len(took):]
            if took:
                busy.add(job)
                running[job] = 0.0
            else:
                running[job] += 10
        d = decide(View(waiting, [Job(j, i, int(j in busy)) for j, i in running.items()], pending),
                   bounds)
        assert set(d.retire).isdisjoint(busy)
        for job in d.retire:
            del running[job]
        pending = [p for p in pending if p not in d.cancel]
        for _ in range(d.submit):
            pending.append(f"j{serial}")
            serial += 1
        assert len(running) + len(pending) <= max(bounds.high, bounds.low)
    assert not waiting
    if bounds.idle_after_s <= 300:  # 40 idle periods are 400 s
        assert len(running) + len(pending) == bounds.low


def test_the_reasons_say_why():
    b = Bounds(1, 3, grow_after_s=10, idle_after_s=60)
    d = decide(View(waiting=[12.0] * 5, running=[Job("7")]), b)
    assert d.submit == 2 and "5 tasks waiting, the oldest for 12 s (>= 10 s)" in d.steps[0].reason
    d = decide(View(running=[Job("7", 100.0), Job("8", 70.0), Job("9", 5.0)], pending=["10"]), b)
    assert d.cancel == ("10",) and d.retire == ("7", "8")
    assert "idle for 100 s (>= 60 s) and no task waits" in d.steps[1].reason
    assert [s.action for s in d.steps] == [Action.CANCEL, Action.RETIRE, Action.RETIRE]


@pytest.mark.parametrize("value, pair", [(4, (4, 4)), ((1, 8), (1, 8)), ("1:8", (1, 8)), ("3", (3, 3)),
                                         ([0, 2], (0, 2))])
def test_parse_jobs(value, pair):
    assert parse_jobs(value) == pair


@pytest.mark.parametrize("value", [(8, 1), "1-8", 0, True, (1, 2, 3), "a:b"])
def test_parse_jobs_refuses_nonsense(value):
    with pytest.raises(ValueError, match="jobs="):
        parse_jobs(value)
