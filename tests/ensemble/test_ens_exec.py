"""Executable tasks: exit codes, captured stdout/stderr, sandboxes, timeouts, pinning, GPUs, bad input."""

from __future__ import annotations

import os

import psutil

from shoal.ensemble import FailureKind, Pipeline, Stage, Task, TaskState, run


def _run(tmp_path, tasks, **kw):
    return run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"), **kw)


def _sandbox(tmp_path, uid):
    return tmp_path.joinpath("run.sandbox", *uid.split("."))


def _failure(report, uid):
    return next(f for f in report.failures if f["uid"] == uid)


def test_exit_codes_stdout_and_sandbox(tmp_path):
    tasks = [
        Task(executable="/bin/sh", arguments=["-c", "echo out-$0; echo err >&2; pwd > where", "x"], name="ok"),
        Task(executable="/bin/sh", arguments=["-c", "echo bad >&2; exit 7"], name="seven"),
        Task(executable="/bin/sh", arguments=["-c", "kill -TERM $$"], name="signalled"),
    ]
    report = _run(tmp_path, tasks)
    assert report.counts == {TaskState.DONE: 1, TaskState.FAILED: 2}
    sb = _sandbox(tmp_path, "p.s0.ok")
    assert (sb / "stdout").read_text() == "out-x\n" and (sb / "stderr").read_text() == "err\n"
    assert (sb / "where").read_text().strip() == str(sb)
    seven = _failure(report, "p.s0.seven")
    assert seven["kind"] is FailureKind.EXIT_CODE and seven["exit_code"] == 7
    assert "bad" in seven["stderr_tail"]
    assert _failure(report, "p.s0.signalled")["exit_code"] == -15
    assert report.result("p.s0.ok") == 0
    assert "exit code 7" in report.table() and "| bad" in report.table()


def test_missing_and_non_executable(tmp_path):
    script = tmp_path / "noexec.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    tasks = [Task(executable="no-such-program-xyz", name="a"), Task(executable=str(script), name="b"),
             Task(executable=str(tmp_path / "missing"), name="c")]
    report = _run(tmp_path, tasks)
    assert report.failed == 3
    assert "not found on PATH" in _failure(report, "p.s0.a")["reason"]
    assert "not executable" in _failure(report, "p.s0.b")["reason"]
    assert "does not exist" in _failure(report, "p.s0.c")["reason"]
    assert all(f["kind"] is FailureKind.SPAWN for f in report.failures)


def test_timeout_kills_process_group(tmp_path):
    marker = tmp_path / "late"
    tasks = [Task(executable="/bin/sh", arguments=["-c", f"sleep 30 & sleep 30; touch {marker}"],
                  timeout=0.3, name="slow"),
             Task(executable="/bin/true", name="fast")]
    report = _run(tmp_path, tasks)
    f = _failure(report, "p.s0.slow")
    assert f["kind"] is FailureKind.TIMEOUT and f["exit_code"] == -9
    assert report.done == 1 and not marker.exists()
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "30"]
                 and p.ppid() in (1, os.getpid())]
    assert not leftovers


def test_pre_post_exec_environment_stdin(tmp_path):
    (tmp_path / "in.txt").write_text("from stdin\n")
    task = Task(executable="/bin/sh", arguments=["-c", 'cat; echo "$GREETING $OMP_NUM_THREADS"'],
                environment={"GREETING": "hello"}, stdin=str(tmp_path / "in.txt"),
                pre_exec=["echo pre > pre.txt"], post_exec=["echo post-$rc > post.txt"], cores=2, name="t")
    failing_pre = Task(executable="/bin/true", pre_exec=["exit 3"], name="badpre")
    report = _run(tmp_path, [task, failing_pre], cores=2)
    sb = _sandbox(tmp_path, "p.s0.t")
    assert (sb / "stdout").read_text() == "from stdin\nhello 2\n"
    assert (sb / "pre.txt").read_text() == "pre\n" and (sb / "post.txt").read_text() == "post-0\n"
    assert _failure(report, "p.s0.badpre")["exit_code"] == 3


def test_cores_pinned_and_gpus_assigned(tmp_path):
    usable = sorted(os.sched_getaffinity(0))
    cmd = "grep Cpus_allowed_list /proc/self/status; echo gpus=$CUDA_VISIBLE_DEVICES"
    tasks = [Task(executable="/bin/sh", arguments=["-c", cmd], cores=len(usable), gpus=2, name="wide"),
             Task(executable="/bin/sh", arguments=["-c", cmd], cores=1, gpus=1, name="narrow")]
    report = _run(tmp_path, tasks, gpus=3)
    assert report.ok, report
    wide = (_sandbox(tmp_path, "p.s0.wide") / "stdout").read_text()
    narrow = (_sandbox(tmp_path, "p.s0.narrow") / "stdout").read_text()
    def cpus(text):
        spec = text.split("Cpus_allowed_list:")[1].split()[0]
        out = set()
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
        return out
    assert cpus(wide) == set(usable) and len(cpus(narrow)) == 1
    assert "gpus=0,1" in wide or "gpus=1,2" in wide or "gpus=0,2" in wide
    assert len(narrow.split("gpus=")[1].strip().split(",")) == 1
    assert os.sched_getaffinity(0) == set(usable)  # the driver's own mask is restored


def test_big_stdout_goes_to_file(tmp_path):
    task = Task(executable="/bin/sh", arguments=["-c", "head -c 50000000 /dev/zero; echo tail >&2; exit 1"],
                name="loud")
    report = _run(tmp_path, [task])
    assert os.path.getsize(_sandbox(tmp_path, "p.s0.loud") / "stdout") == 50_000_000
    assert _failure(report, "p.s0.loud")["stderr_tail"] == "tail\n"


def test_sandbox_cannot_be_created(tmp_path):
    (tmp_path / "run.sandbox").mkdir()
    (tmp_path / "run.sandbox" / "p").write_text("a file where the pipeline's directory should be")
    report = run([Pipeline([Stage([Task(executable="/bin/true")])], name="p"),
                  Pipeline([Stage([Task(executable="/bin/true")])], name="q")],
                 journal=str(tmp_path / "run.db"))
    f = _failure(report, "p.s0.t0")
    assert f["kind"] is FailureKind.SANDBOX and "cannot create sandbox" in f["reason"]
    assert report.done == 1  # the unrelated pipeline ran


def test_many_true_tasks(tmp_path):
    report = _run(tmp_path, [Task(executable="/bin/true") for _ in range(200)])
    assert report.ok and report.done == 200


def _intervals(tmp_path):
    import sqlite3

    db = sqlite3.connect(str(tmp_path / "run.db"))
    try:
        return {uid.rsplit(".", 1)[1]: (s, f) for uid, s, f in db.execute("SELECT uid, started, finished FROM tasks")}
    finally:
        db.close()


def test_memory_is_not_overcommitted(tmp_path):
    tasks = [Task(executable="/bin/sleep", arguments=["0.2"], memory="600M", name=f"m{i}") for i in range(3)]
    assert _run(tmp_path, tasks, cores=2, memory="1G").ok
    spans = sorted(_intervals(tmp_path).values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # one at a time


def test_engine_backfills_around_a_wide_task(tmp_path):
    tasks = [Task(executable="/bin/sleep", arguments=["0.3"], name="a"),
             Task(executable="/bin/true", cores=2, name="wide"),
             Task(executable="/bin/true", name="small")]
    assert _run(tmp_path, tasks, cores=2).ok
    t = _intervals(tmp_path)
    assert t["small"][0] < t["wide"][0]  # the small task filled the free core first
    assert t["wide"][0] >= t["a"][1]
