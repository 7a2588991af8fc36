"""The pure placement policy: never over-commits, backfills, reserves for wide tasks, NUMA best fit."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.ensemble import EnsembleError  # noqa: F401 - the facade imports cleanly
from shoal.patterns.ensemble import Request, Scheduler

requests = st.lists(
    st.tuples(st.integers(1, 8), st.integers(0, 2), st.integers(0, 300)), min_size=1, max_size=40
)


@settings(max_examples=200, deadline=None)
@given(requests, st.integers(1, 8), st.integers(0, 3), st.integers(0, 2), st.integers(0, 2**32 - 1))
def test_never_overcommits_and_progresses(reqs, ncpu, ngpu, patience, seed):
    rng = random.Random(seed)
    sched = Scheduler(range(ncpu), gpus=ngpu, memory=1000, patience=patience,
                      nodes=[range(0, ncpu, 2), range(1, ncpu, 2)])
    waiting = [Request(i, c, g, m) for i, (c, g, m) in enumerate(reqs) if sched.impossible(Request(i, c, g, m)) is None]
    running = []
    steps = 0
    while waiting or running:
        steps += 1
        assert steps < 10_000
        placed = sched.place(waiting)
        if waiting and sched.fits(waiting[0]) and not placed:
            raise AssertionError("head fits but nothing was placed")
        keys = {p.key for p in placed}
        if waiting and not placed and not running:
            raise AssertionError("idle scheduler placed nothing")
        waiting = [r for r in waiting if r.key not in keys]
        running += placed
        # invariants: disjoint, within the configured sets, memory within the total
        cpus = [c for p in running for c in p.cpus]
        gpus = [g for p in running for g in p.gpus]
        assert len(cpus) == len(set(cpus)) and set(cpus) <= set(range(ncpu))
        assert len(gpus) == len(set(gpus)) and set(gpus) <= set(range(ngpu))
        assert sum(p.memory for p in running) <= 1000
        assert set(cpus).isdisjoint(sched.free_cpus)
        for p in placed:
            req = reqs[p.key]
            assert (len(p.cpus), len(p.gpus), p.memory) == (req[0], req[1], req[2])
        if running:  # finish a random one
            done = running.pop(rng.randrange(len(running)))
            sched.release(done)
    assert sched.idle and sched.free_memory == 1000


def test_backfill_small_tasks_fill_the_gap():
    sched = Scheduler(range(4))
    first = sched.place([Request("a", 3)])
    assert [p.key for p in first] == ["a"]
    # b needs 4 (does not fit); c and d need 1 each: c fills the gap, d waits
    placed = sched.place([Request("b", 4), Request("c", 1), Request("d", 1)])
    assert [p.key for p in placed] == ["c"]


def test_reservation_stops_starvation():
    sched = Scheduler(range(2), patience=2)
    sched.place([Request("x", 1)])
    waiting = [Request("wide", 2)] + [Request(i, 1) for i in range(10)]
    overtook = []
    for _ in range(6):
        placed = sched.place(waiting)
        overtook += [p.key for p in placed]
        waiting = [r for r in waiting if r.key not in {p.key for p in placed}]
        for p in placed:
            sched.release(p)
    assert len(overtook) == 2  # then the reservation holds everything behind "wide"


def test_numa_best_fit_and_pinning():
    sched = Scheduler(range(8), nodes=[range(0, 4), range(4, 8)])
    a = sched.place([Request("a", 2)])[0]
    assert set(a.cpus) <= set(range(4))
    b = sched.place([Request("b", 4)])[0]
    assert b.cpus == (4, 5, 6, 7)  # the node with room for all four
    c = sched.place([Request("c", 2)])[0]
    assert set(c.cpus) == {2, 3}


def test_impossible_says_why():
    sched = Scheduler(range(2), gpus=1, memory=100)
    assert "4 cores but the pilot has 2" in sched.impossible(Request("k", 4))
    assert "2 GPUs" in sched.impossible(Request("k", 1, 2))
    assert "memory" in sched.impossible(Request("k", 1, 0, 101))
    assert sched.impossible(Request("k", 2, 1, 100)) is None


@settings(max_examples=200, deadline=None)
@given(requests, st.lists(st.booleans(), min_size=40, max_size=40), st.integers(1, 6), st.integers(0, 3),
       st.integers(0, 2**32 - 1))
def test_queueing_behind_keeps_one_task_per_cpu(reqs, queueable, ncpu, patience, seed):
    """place(queue=True), as the engine uses it for short local executables: a queueable 1-core
    request may be granted a CPU whose holder is a queueable 1-core grant, at most one per CPU;
    the runner of that CPU starts it when the holder ends (modelled here: a FIFO per CPU).
    A CPU never runs two tasks at once, never hosts a queued grant behind anything else, is
    never free while held, and a queued grant released before it started leaves its holder's
    CPU held (the runner's NOT_STARTED after a drain)."""
    rng = random.Random(seed)
    sched = Scheduler(range(ncpu), gpus=2, memory=1000, patience=patience)
    waiting = []
    for i, (c, g, m) in enumerate(reqs):
        q = queueable[i] and c == 1 and not g and not m
        r = Request(i, c, g, m, q)
        if sched.impossible(r) is None:
            waiting.append(r)
    fifo: dict[int, list] = {c: [] for c in range(ncpu)}  # what each CPU's runner holds, in order
    started = []  # grants whose task runs now
    long = set()  # keys of started grants marked long (their runner bounces what is queued)
    steps = 0
    while waiting or started or any(fifo.values()):
        steps += 1
        assert steps < 10_000
        placed = sched.place(waiting, queue=True)
        if waiting and not placed and not started and not any(fifo.values()):
            raise AssertionError("idle scheduler placed nothing")
        keys = {p.key for p in placed}
        waiting = [r for r in waiting if r.key not in keys]
        for p in placed:
            req = reqs[p.key]
            assert (len(p.cpus), len(p.gpus), p.memory) == (req[0], req[1], req[2])
            if p.queued:
                assert queueable[p.key] and len(p.cpus) == 1
                (c,) = p.cpus
                assert len(fifo[c]) == 1, "queued behind nothing, or two queued on one CPU"
                holder = fifo[c][0]
                assert holder in started and len(holder.cpus) == 1 and queueable[holder.key]
                assert holder.key not in long, "queued behind a task known to be long"
                fifo[c].append(p)
            else:
                for c in p.cpus:
                    assert fifo[c] == [], "a CPU granted while held"
                    fifo[c].append(p)
                started.append(p)
        running_cpus = [c for p in started for c in p.cpus]
        assert len(running_cpus) == len(set(running_cpus)), "two tasks at once on one CPU"
        held = {c for c, q in fifo.items() if q}
        assert held.isdisjoint(sched.free_cpus)
        assert sum(p.memory for p in started) <= 1000
        queued = [q[1] for q in fifo.values() if len(q) > 1]
        singles = [p for p in started if len(p.cpus) == 1 and p.key not in long]
        if singles and rng.random() < 0.2:  # a task outlives the quick window: marked long, and
            p = rng.choice(singles)  # what waits behind it is bounced back to the waiting list
            long.add(p.key)
            sched.mark_long(p)
            q = fifo[p.cpus[0]]
            if len(q) > 1:
                back = q.pop()
                sched.release(back)
                waiting.insert(0, Request(back.key, *reqs[back.key], True))
            continue
        if queued and rng.random() < 0.2:  # a queued grant answered NOT_STARTED (a drain)
            p = rng.choice(queued)
            fifo[p.cpus[0]].remove(p)
            sched.release(p)
        elif started:  # a running task ends; its runner starts what was queued behind it
            done = started.pop(rng.randrange(len(started)))
            sched.release(done)
            for c in done.cpus:
                fifo[c].pop(0)
                if fifo[c]:
                    started.append(fifo[c][0])
    assert sched.idle and sched.free_memory == 1000 and not sched.queued and not sched.single


def test_waiting_orders_by_priority_then_arrival_and_bounced_go_first():
    from shoal.patterns.ensemble.scheduler import Waiting

    class It:
        def __init__(self, name, priority):
            self.name, self.priority = name, priority

    w = Waiting()
    for name, prio in [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -1)]:
        w[name] = It(name, prio)
    assert [i.name for i in w.values()] == ["b", "d", "a", "c", "e"]
    w.move_to_end("c", last=False)  # bounced back: first of its priority, not of all
    assert [i.name for i in w.values()] == ["b", "d", "c", "a", "e"]
    assert w.pop("b").name == "b" and w.pop("zz", None) is None and "b" not in w
    w.pop("d")
    assert w.order == [0, -1] and len(w) == 3
