"""Faults of whole hosts, with real processes (scripts/testbed's crash, partition, heal,
throttle), on a dask pilot over 3 hosts.  Each test repairs the test bed after itself.

What each fault does (docs/dask.md, "Several hosts"):

* crash (every process of the host SIGKILLed): dask's scheduler sees the connections reset at
  once; the host's running and queued tasks go to the other hosts.  The test bed's scheduler
  allows one death per task (``allowed-failures`` 1): a task whose second host dies too
  fails with ``WorkerLost`` naming that dask worker and host.
* partition (the host's link down): nothing resets; the pilot removes the silent dask worker
  after ``silent_after_s`` (its heartbeats stop), and its tasks re-run elsewhere.  Healed, the
  old worker is unknown to the scheduler (what it sends is dropped; each future gets exactly
  one result) and its nanny starts a fresh worker that rejoins.
* throttle (1 Mbit/s both ways): the run finishes with exact answers.

Times measured here are printed (``-s``), never asserted against a wall clock; the bounds
asserted are the generous ones a test needs to end (docs: detection within
``silent_after_s`` + its period).
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time

import mh_tasks as mt
import pytest
import rt_tasks as t
from testbed_helpers import ROOT, testbed, wait_until  # noqa: F401 - fixture

sys.path[:0] = [os.path.join(ROOT, "tests", d) for d in ("dask",)]
import search_tasks as st  # noqa: E402

import shoal  # noqa: E402
from shoal.ensemble import Pipeline, Stage, Task, run  # noqa: E402
from shoal.patterns import all_pairs  # noqa: E402
from shoal.patterns import backtracking as bt  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.no_leak_check, pytest.mark.timeout(400)]


@pytest.fixture
def bed(testbed):  # noqa: F811
    """The test bed, whole before the test; after it: repaired, and no host holds anything
    the closed pilot left (the crashed host's /tmp is a fresh tmpfs: not counted)."""
    testbed.ensure_up()
    before = testbed.snapshot()
    yield testbed
    testbed.repair()
    testbed.assert_clean(before)


def report(what: str, seconds: float) -> None:
    print(f"\n[multihost fault] {what}: {seconds:.2f} s", flush=True)


def started_on(marks: str) -> dict[int, list[str]]:
    """{task: [hosts it started on, in order]} from a marks file."""
    out = collections.defaultdict(list)
    for kind, i, host in mt.marks_of(marks):
        if kind == "start":
            out[i].append(host)
    return out


def test_crash_of_a_host_with_running_and_queued_tasks(bed):
    """6 tasks on 3 one-thread hosts, each blocked on a gate of its own: 3 run (one per host),
    3 queue.  h3 crashes; the others' gates open: h3's running task starts again on another
    host, the queued ones run, every answer is exact, the crashed host's processes are gone.
    Then that host crashes too while it runs the re-run: WorkerLost naming the dask worker and
    its host (the test bed allows one death per task)."""
    folder = bed.shared_dir("crash")
    gates = [os.path.join(folder, f"gate{i}") for i in range(6)]
    marks = os.path.join(folder, "marks")
    with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
        futs = {i: pilot.submit(mt.gated, i, gates[i], marks) for i in range(6)}
        wait_until(lambda: len({h[0] for h in started_on(marks).values()}) == 3, 120,
                   "a task running on each host")
        victim = next(i for i, h in started_on(marks).items() if h[0] == "h3")
        t0 = time.monotonic()
        bed.verb("crash", "h3")
        for i, g in enumerate(gates):
            if i != victim:
                t.release(g)
        wait_until(lambda: len(started_on(marks)[victim]) >= 2, 120,
                   "h3's running task to start on another host")
        report("crash h3 -> its running task restarted elsewhere", time.monotonic() - t0)
        others = {i: f.result(120) for i, f in futs.items() if i != victim}
        report("crash h3 -> every other future settled", time.monotonic() - t0)
        assert others == {i: i * i for i in others}
        again_on = started_on(marks)[victim][1]
        assert again_on in ("h1", "h2")
        t1 = time.monotonic()
        bed.verb("crash", again_on)  # the same task's second death
        with pytest.raises(shoal.WorkerLost, match=rf"dask worker {again_on} at tcp://198\.18\."):
            futs[victim].result(120)
        report(f"second crash ({again_on}) under the re-run -> WorkerLost", time.monotonic() - t1)
        t.release(gates[victim])
        assert all(len(h) <= 2 for h in started_on(marks).values())
        assert not bed.processes("h3")


def test_crash_mid_search_and_mid_map_gives_exact_answers(bed):
    """A host crashes in the middle of an N-Queens count and of a map: the counts (OEIS
    A000170) and the map's results are exact (dask re-runs the lost chunks)."""
    children, leaf = functools.partial(st.queens, 10), functools.partial(st.placed, 10)
    with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
        box = {}
        th = threading.Thread(target=lambda: box.setdefault(
            "n", bt.count(pilot, (), children, accept=leaf, coordination="depth-bounded")))
        th.start()
        time.sleep(1.0)  # the search is under way (exact whenever the crash lands)
        bed.verb("crash", "h2")
        th.join(300)
        assert box.get("n") == st.OEIS_A000170[10]
        bed.repair()
        it = pilot.map(t.slow_item, range(300), chunksize=5)
        got = [next(it) for _ in range(20)]
        bed.verb("crash", "h1")
        got += list(it)
        assert got == [x * x for x in range(300)]


def test_crash_mid_ensemble_journals_every_task_done_once(bed, tmp_path):
    """Executables and functions in an ensemble on the 3 hosts (sandboxes on the shared
    filesystem), a host crashed mid-run: every task ends DONE, once, in the journal."""
    tasks = [Task(executable="/bin/sh", arguments=["-c", f"sleep 0.3; hostname > h; echo {i}"],
                  name=f"x{i}") for i in range(12)]
    tasks += [Task(function=t.add, args=(i,), kwargs={"b": 1}, name=f"f{i}") for i in range(6)]
    wf = Pipeline([Stage(tasks, name="s")], name="p")
    with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
        box = {}
        th = threading.Thread(target=lambda: box.setdefault(
            "r", run(wf, pilot=pilot, journal=str(tmp_path / "run.db"))))
        th.start()
        wait_until(lambda: len(list((tmp_path / "run.sandbox").rglob("h"))) >= 2, 120,
                   "some executables to have run")
        bed.verb("crash", "h1")
        th.join(300)
    rep = box["r"]
    assert rep.ok and rep.done == 18, rep
    assert all(rep.result(f"p.s.f{i}") == i + 1 for i in range(6))
    ran_on = {(tmp_path / f"run.sandbox/p/s/x{i}/h").read_text().strip() for i in range(12)}
    assert ran_on <= {"h1", "h2", "h3"} and len(ran_on) >= 2


@pytest.mark.parametrize("after_s", [5.0])
def test_partition_then_heal(bed, after_s):
    """h2's link goes down while it runs a task: the pilot notices within ``silent_after_s``
    (5 s here; 30 s by default) plus one period, the task re-runs on another host, and its
    future gets exactly one result.  Healed, h2's old dask worker is fenced (the scheduler
    forgot it) and a fresh one rejoins; the pilot keeps working on all 3 hosts."""
    from distributed import Client

    folder = bed.shared_dir("partition")
    gates = [os.path.join(folder, f"gate{i}") for i in range(3)]
    marks = os.path.join(folder, "marks")
    with shoal.Pilot(backend="dask", address=bed.dask, workers=1,
                     silent_after_s=after_s) as pilot, \
            Client(bed.dask, set_as_default=False) as client:
        before = set(client.scheduler_info()["workers"])
        futs = {i: pilot.submit(mt.gated, i, gates[i], marks) for i in range(3)}
        wait_until(lambda: len({h[0] for h in started_on(marks).values()}) == 3, 120,
                   "a task running on each host")
        cut = next(i for i, h in started_on(marks).items() if h[0] == "h2")
        t0 = time.monotonic()
        bed.verb("partition", "h2")
        for i, g in enumerate(gates):
            if i != cut:
                t.release(g)  # the other hosts free: the re-run has a thread to start on
        wait_until(lambda: len(started_on(marks)[cut]) >= 2, 120,
                   "h2's task to start on another host")
        noticed = time.monotonic() - t0
        report(f"partition h2 -> task re-run elsewhere (silent_after_s={after_s})", noticed)
        assert noticed < after_s + 60  # ends the test; the measured time is what counts
        assert pilot._backend.liveness.evicted and pilot._backend.liveness.evicted[0]["name"] == "h2"
        t.release(gates[cut])
        assert {i: f.result(120) for i, f in futs.items()} == {i: i * i for i in range(3)}
        t1 = time.monotonic()
        bed.verb("heal", "h2")
        # fenced: the scheduler forgot the old worker; hearing so, it shuts itself down
        wait_until(lambda: not [p for p in bed.processes_named("h2", "distributed.cli.dask_worker")],
                   120, "h2's fenced dask worker to shut itself down")
        report("heal h2 -> its old dask worker fenced (shut itself down)", time.monotonic() - t1)
        bed.repair()  # the test bed starts a fresh one, as a batch system would a new job
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 3, 120,
                   "a fresh dask worker of h2 to join")
        now = client.scheduler_info()["workers"]
        h2 = [a for a, w in now.items() if w["name"] == "h2"]
        assert h2 and not set(h2) & before  # a fresh worker, not the fenced one
        hosts = {h for h, _ in pilot.map(mt.where, range(60))}
        assert hosts == {"h1", "h2", "h3"}
        assert futs[cut].result(0) == cut * cut  # settled once, with the re-run's result


def test_throttled_host_the_run_still_finishes_exactly(bed):
    """h3's link at 1 Mbit/s both ways while 60 tasks with 64 KiB arguments and results run on
    the 3 hosts: every answer exact; the time, and the share h3 ran, are printed."""
    blob = os.urandom(64 << 10)
    bed.verb("throttle", "h3", "1mbit")
    with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
        t0 = time.monotonic()
        got = [f.result(600) for f in [pilot.submit(mt.echo, blob, 0.05) for _ in range(60)]]
        took = time.monotonic() - t0
    assert all(n == len(blob) and b == blob for _, n, b in got)
    share = collections.Counter(h for h, _, _ in got)
    report(f"throttle h3 1mbit: 60 x 64 KiB round trips (ran per host {dict(share)})", took)


def test_all_pairs_with_a_crashed_host_is_still_exact(bed):
    """An all_pairs run over the 3 hosts whose tiles wait on a gate; h3 crashes while it has
    tiles running: its blocks run again on the other hosts (each block's tiles reach the
    driver once, as a task result), and the matrix is exact."""
    import numpy as np

    folder = bed.shared_dir("all-pairs-crash")
    gate, marks = os.path.join(folder, "gate"), os.path.join(folder, "marks")
    items = list(range(24))
    box: dict = {}
    with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
        compare = functools.partial(mt.gated_size_diff, gate, marks)

        def compute():
            try:
                box["result"] = all_pairs.compute(pilot, items, compare, tile=2)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                box["error"] = exc

        runner = threading.Thread(target=compute)
        runner.start()
        try:
            wait_until(lambda: "h3" in {h for _, _, h in mt.marks_of(marks)}, 120,
                       "a tile to start on h3")
            t0 = time.monotonic()
            bed.verb("crash", "h3")
        finally:
            t.release(gate)
            runner.join(300)
        report("all_pairs: crash h3 mid-run -> exact matrix", time.monotonic() - t0)
    assert "error" not in box, box.get("error")
    a = np.array(items, dtype=float)
    np.testing.assert_array_equal(np.asarray(box["result"]), np.abs(a[:, None] - a[None, :]))
