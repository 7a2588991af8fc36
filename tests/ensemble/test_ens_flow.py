"""Workflow semantics: functions, retries with on_retry, after/when, adaptivity, data, walltime, resume."""

from __future__ import annotations

import os

import pytest
from ens_tasks import add, boom, flaky, nap, square, touch_count

import shoal
from shoal.ensemble import (
    EnsembleError,
    FailureKind,
    Pipeline,
    Stage,
    Staging,
    Task,
    TaskState,
    run,
)


def test_function_tasks_and_results(tmp_path):
    seen = {}

    def check(ctx):
        seen["sum"] = sum(ctx.results[f"p0.s0.t{i}"] for i in range(10))

    wf = Pipeline([Stage([Task(function=square, args=(i,)) for i in range(10)], post_exec=check),
                   Stage([Task(function=boom, args=("nope",), name="bad")])])
    report = run(wf, journal=str(tmp_path / "run.db"), workers=2)
    assert seen["sum"] == 285 and report.done == 10 and report.failed == 1
    f = report.failures[0]
    assert f["kind"] is FailureKind.EXCEPTION and "ValueError: nope" in f["reason"]
    assert "boom" in f["stderr_tail"]  # the remote traceback
    assert report.result("p0.s0.t3") == 9


def test_runs_on_a_given_pilot(tmp_path):
    with shoal.Pilot(workers=2) as pilot:
        report = run(Pipeline([Stage([Task(function=add, args=(i, 1)) for i in range(20)])]),
                     pilot=pilot, journal=str(tmp_path / "run.db"))
        assert pilot.submit(square, 4).result() == 16  # still open: the caller owns it
    assert report.ok and report.done == 20


def test_retries_with_on_retry_changing_the_task(tmp_path):
    calls = []

    def bump(task, failure):
        calls.append((failure.kind, failure.attempt))
        return task.replace(arguments=["-c", "exit 0"])

    counter = tmp_path / "count"
    tasks = [
        Task(executable="/bin/sh", arguments=["-c", "exit 4"], retries=2, on_retry=bump, name="fixed"),
        Task(function=flaky, args=(str(counter), 2), retries=2, name="flaky"),
        Task(executable="/bin/false", retries=1, name="hopeless"),
    ]
    report = run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"))
    assert calls == [(FailureKind.EXIT_CODE, 1)]
    assert report.result("p.s0.flaky") == 3 and report.done == 2
    assert report.failures[0]["uid"] == "p.s0.hopeless" and report.failures[0]["attempts"] == 2
    assert report.retries == 4


def test_after_and_when_and_failure_isolation(tmp_path):
    out = tmp_path / "order"
    log = ["-c", f"echo $SHOAL_TASK >> {out}"]
    a = Pipeline([Stage([Task(executable="/bin/sh", arguments=["-c", f"sleep 0.3; echo $SHOAL_TASK >> {out}"],
                              name="slow")])], name="a")
    b = Pipeline([Stage([Task(executable="/bin/sh", arguments=log, name="after_a",
                              after=["a.s0.slow"])])], name="b")
    c = Pipeline([Stage([Task(executable="/bin/false", name="fails")]),
                  Stage([Task(executable="/bin/sh", arguments=log, name="never")])], name="c")
    d = Pipeline([Stage([Task(executable="/bin/sh", arguments=log, name="dep_failed", after=["c.s0.fails"]),
                         Task(function=square, args=(2,), name="skip_me", when=lambda r: r["a.s0.slow"] != 0,
                              after=["a.s0.slow"]),
                         Task(function=square, args=(4,), name="bad_when", when=lambda r: r["zzz.s0.t0"]),
                         Task(function=square, args=(3,), name="run_me", when=lambda r: r["a.s0.slow"] == 0,
                              after=[a])])], name="d")
    report = run([a, b, c, d], journal=str(tmp_path / "run.db"))
    lines = out.read_text().split()
    assert lines == ["a.s0.slow", "b.s0.after_a"]
    assert report.counts[TaskState.SKIPPED] == 3 and report.failed == 2  # c.s1's task did not start
    assert "when= raised" in next(f for f in report.failures if f["uid"] == "d.s0.bad_when")["reason"]
    assert report.result("d.s0.run_me") == 9
    assert report.stages["c.s0"] == {TaskState.FAILED: 1} and report.stages["c.s1"] == {TaskState.SKIPPED: 1}
    assert "not started (pipeline failed at c.s0)" in report.table()


def test_simulation_analysis_loop(tmp_path):
    """The iteration count is decided at run time by the analysis task's result."""

    def analyse(ctx):
        i = ctx.stage_index // 2
        if ctx.results[f"sal.a{i}.t0"] < 40:
            ctx.append(Stage([Task(function=add, args=(i, 1)) for _ in range(3)], name=f"s{i + 1}"),
                       Stage([Task(function=square, args=(i + 2,))], name=f"a{i + 1}", post_exec=analyse))

    wf = Pipeline([Stage([Task(function=add, args=(0, 1)) for _ in range(3)], name="s0"),
                   Stage([Task(function=square, args=(1,))], name="a0", post_exec=analyse)], name="sal")
    report = run(wf, journal=str(tmp_path / "run.db"))
    # squares 1, 4, 9, 16, 25, 36, 49: stops after a6 (49 >= 40)
    assert report.ok and "sal.a6" in report.stages and "sal.a7" not in report.stages
    assert report.done == 7 * 4


def test_stop_and_add_pipeline(tmp_path):
    def control(ctx):
        ctx.add_pipeline(Pipeline([Stage([Task(function=square, args=(5,))])], name="spawned"))
        ctx.stop()

    wf = Pipeline([Stage([Task(function=square, args=(1,))], post_exec=control),
                   Stage([Task(function=square, args=(2,))])], name="main")
    report = run(wf, journal=str(tmp_path / "run.db"))
    assert report.result("spawned.s0.t0") == 25 and report.stages["main.s1"] == {TaskState.SKIPPED: 1}
    assert "not started (pipeline stopped at main.s0)" in report.table()


@pytest.mark.parametrize("mode", list(Staging))
def test_data_references(tmp_path, mode):
    produce = Task(executable="/bin/sh", arguments=["-c", "echo data > out.dat"], outputs=["out.dat"], name="gen")
    consume = Task(executable="/bin/sh", arguments=["-c", "cat in.dat; cat $0", "$p.s0.gen/out.dat"],
                   inputs=[("$p.s0.gen/out.dat", "in.dat", mode)], name="use")
    report = run(Pipeline([Stage([produce]), Stage([consume])], name="p"), journal=str(tmp_path / "run.db"))
    sb = tmp_path / "run.sandbox" / "p"
    if mode is Staging.MOVE:
        assert report.failed == 1  # the move took the file the argument names
        assert (sb / "s1" / "use" / "in.dat").read_text() == "data\n"
    else:
        assert report.ok, report
        assert (sb / "s1" / "use" / "stdout").read_text() == "data\ndata\n"
        assert (sb / "s1" / "use" / "in.dat").is_symlink() == (mode is Staging.LINK)
    assert report.outputs["p.s0.gen"] == [str(sb / "s0" / "gen" / "out.dat")]


def test_missing_input_and_output(tmp_path):
    t1 = Task(executable="/bin/true", outputs=["never.dat"], name="noout")
    t2 = Task(executable="/bin/true", inputs=[str(tmp_path / "absent.txt")], name="noin")
    report = run(Pipeline([Stage([t1, t2])], name="p"), journal=str(tmp_path / "run.db"))
    kinds = {f["uid"]: f["kind"] for f in report.failures}
    assert kinds == {"p.s0.noout": FailureKind.STAGING, "p.s0.noin": FailureKind.STAGING}


def test_walltime_drains_and_resume_finishes(tmp_path):
    counter = tmp_path / "runs"
    def wf():
        return Pipeline([Stage([Task(executable="/bin/sh", arguments=["-c", f"sleep 0.3; echo $SHOAL_TASK >> {counter}"],
                                     estimate=0.4) for _ in range(10)])], name="w")
    j = str(tmp_path / "run.db")
    first = run(wf, journal=j, walltime=1.0, cores=1)
    assert first.drained and not first.ok and 0 < first.done < 10
    second = run(wf, journal=j, resume=True)
    assert second.ok and second.done == 10
    lines = counter.read_text().split()
    assert sorted(lines) == sorted(set(lines)) and len(lines) == 10  # each ran once


def test_walltime_kills_overrunning_task_and_leaves_it_resumable(tmp_path):
    j = str(tmp_path / "run.db")
    wf = Pipeline([Stage([Task(executable="/bin/sleep", arguments=["30"], name="long")])], name="w")
    first = run(wf, journal=j, walltime=0.5)
    assert first.drained and first.counts == {TaskState.PENDING: 1}


def test_resume_skips_done_reruns_rest(tmp_path):
    counter = tmp_path / "c"
    j = str(tmp_path / "run.db")
    good = [Task(function=touch_count, args=(str(counter),)) for _ in range(5)]
    run(Pipeline([Stage(good)], name="r"), journal=j)
    assert len(counter.read_text().split()) == 5
    report = run(Pipeline([Stage([Task(function=touch_count, args=(str(counter),)) for _ in range(5)])],
                          name="r"), journal=j, resume=True)
    assert report.done == 5 and len(counter.read_text().split()) == 5
    # a grown stage is another workflow: refused, saying what differs (it used to merge silently)
    with pytest.raises(EnsembleError, match=r"another workflow .*stage r\.s0 has 7 tasks, was 5"):
        run(Pipeline([Stage([Task(function=touch_count, args=(str(counter),)) for _ in range(7)])],
                     name="r"), journal=j, resume=True)


def test_function_timeout(tmp_path):
    report = run(Pipeline([Stage([Task(function=nap, args=(30,), timeout=0.5)])]),
                 journal=str(tmp_path / "run.db"))
    assert report.failures[0]["kind"] is FailureKind.TIMEOUT


def test_a_directory_output_is_downloaded_as_a_tree(tmp_path, monkeypatch):
    """EnTK's download_output_data of a directory failed with 'Is a directory'.
    It is copied as a tree; a link in it stays a link (nothing outside the sandbox is read)."""
    monkeypatch.chdir(tmp_path)
    t = Task(executable="/bin/sh", name="d",
             arguments=["-c", "mkdir -p res/sub && echo a > res/sub/f && ln -s /etc/hostname res/link"])
    t.download_output_data = ["res > collected"]
    report = run(Pipeline([Stage([t])], name="p"), journal=str(tmp_path / "run.db"))
    assert report.ok, report
    assert (tmp_path / "collected" / "sub" / "f").read_text() == "a\n"
    assert os.readlink(tmp_path / "collected" / "link") == "/etc/hostname"
