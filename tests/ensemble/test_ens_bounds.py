"""Bounded driver memory for lazily generated workflows, and nothing left behind after errors."""

from __future__ import annotations

import os
import time
import tracemalloc

import psutil
import pytest
from ens_tasks import square

from shoal.ensemble import Pipeline, RunStatus, Stage, Task, TaskState, run


def _lazy(n):
    for i in range(n):
        yield Task(function=square, args=(i,))


def _peak(tmp_path, n, **kw):
    tracemalloc.start()
    try:
        report = run(Pipeline([Stage(_lazy(n))]), journal=str(tmp_path / f"m{n}.db"), **kw)
        return report, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_task_count(tmp_path):
    small_report, small = _peak(tmp_path, 1000)
    big_report, big = _peak(tmp_path, 6000)
    assert small_report.done == 1000 and big_report.done == 6000
    assert big < small + 256 * 1024, f"peak grew from {small} to {big} bytes with 6x the tasks"


def test_lazy_pipelines(tmp_path):
    def pipelines():
        for k in range(300):
            yield Pipeline([Stage([Task(executable="/bin/true")]), Stage([Task(function=square, args=(k,))])])
    report = run(pipelines(), journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 600


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_million_lazy_tasks_bounded(tmp_path):
    report, peak = _peak(tmp_path, 1_000_000)
    assert report.done == 1_000_000
    assert peak < 8 << 20, f"peak traced memory {peak} bytes"


def test_error_in_callback_leaves_no_processes_and_stays_resumable(tmp_path):
    fixed = []

    def explode(ctx):
        if not fixed:
            raise RuntimeError("callback bug")

    def wf():
        return [Pipeline([Stage([Task(executable="/bin/true")], post_exec=explode)], name="a"),
                Pipeline([Stage([Task(executable="/bin/sleep", arguments=["30"], name="long")])], name="b"),
                Pipeline([Stage([Task(function=square, args=(3,))])], name="c")]
    j = str(tmp_path / "run.db")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    fds = len(os.listdir("/proc/self/fd"))  # relative: earlier tests' module fixtures hold some
    with pytest.raises(RuntimeError, match="callback bug"):
        run(wf, journal=j)
    deadline = time.monotonic() + 10  # a cancelled pilot's workers exit asynchronously
    def extra():
        return {p.pid for p in psutil.Process().children(recursive=True)} - before
    while extra() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not extra()
    assert len(os.listdir("/proc/self/fd")) <= fds + 2, "the failed run leaked descriptors"

    fixed.append(True)  # the user fixes the bug and resumes; b's sleep is re-run, then drained
    report = run(wf(), journal=j, resume=True, walltime=1)
    assert report.drained and report.stages["b.s0"] == {TaskState.PENDING: 1}
    # every task not run counts as pending, journaled or not, as shoal status counts it
    assert report.counts[TaskState.PENDING] == RunStatus.load(j).counts[TaskState.PENDING] >= 1
    assert report.result("a.s0.t0") == 0
