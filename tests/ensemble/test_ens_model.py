"""Model validation: each bad field gives an EnsembleError naming the task/stage and the field."""

from __future__ import annotations

import pytest
from ens_tasks import square

from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, TaskState, parse_walltime, run


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({}, ["exactly one of executable= or function="]),
        ({"executable": "/bin/true", "function": square}, ["exactly one"]),
        ({"executable": "/bin/true", "cores": 0}, ["cores", ">= 1"]),
        ({"executable": "/bin/true", "gpus": -1}, ["gpus"]),
        ({"executable": "/bin/true", "retries": 1.5}, ["retries"]),
        ({"executable": "/bin/true", "timeout": -3}, ["timeout"]),
        ({"executable": "/bin/true", "memory": "lots"}, ["memory", "2G"]),
        ({"executable": "/bin/true", "arguments": "-l"}, ["arguments", "list"]),
        ({"executable": "/bin/true", "pre_exec": "module load x"}, ["pre_exec"]),
        ({"function": square, "pre_exec": ["x"]}, ["executables only"]),
        ({"function": 3}, ["function must be callable"]),
        ({"executable": "/bin/true", "on_retry": "again"}, ["on_retry"]),
        ({"executable": "/bin/true", "name": "a.b"}, ["name", "a.b"]),
        ({"executable": "/bin/true", "inputs": ["$p.s/x"]}, ["input", "$pipeline.stage.task"]),
        ({"executable": "/bin/true", "inputs": [("a", "../escape")]}, ["inside the sandbox"]),
    ],
)
def test_task_validation_names_field(kwargs, words):
    task = Task(name="culprit", **kwargs) if "name" not in kwargs else Task(**kwargs)
    with pytest.raises(EnsembleError) as info:
        task.validate()
    msg = str(info.value)
    assert "task" in msg
    if "name" not in kwargs:
        assert "culprit" in msg
    for w in words:
        assert w in msg


def test_valid_tasks_pass():
    Task(executable="/bin/echo", arguments=["a", 1], cores=2, memory="512M", timeout=3).validate()
    Task(function=square, args=(3,)).validate()
    assert Task(executable="x", memory="2G").memory_bytes == 2 << 30


def test_run_reports_bad_task_with_uid(tmp_path):
    wf = Pipeline([Stage([Task(executable="/bin/true"), Task(executable="/bin/true", cores=0)])], name="pipe")
    with pytest.raises(EnsembleError, match=r"pipe\.s0\.t1.*cores"):
        run(wf, journal=str(tmp_path / "j.db"))


def test_too_many_cores_rejected_at_submission(tmp_path):
    wf = Pipeline([Stage([Task(executable="/bin/true", cores=64)])])
    with pytest.raises(EnsembleError, match=r"p0\.s0\.t0 asks for 64 cores but the pilot has 2"):
        run(wf, journal=str(tmp_path / "j.db"), cores=2)
    wf = Pipeline([Stage([Task(executable="/bin/true", gpus=1)])])
    with pytest.raises(EnsembleError, match="GPUs"):
        run(wf, journal=str(tmp_path / "k.db"), cores=2)


def test_duplicate_names(tmp_path):
    wf = Pipeline([Stage([Task(executable="/bin/true", name="a"), Task(executable="/bin/true", name="a")])])
    with pytest.raises(EnsembleError, match="'a' is used twice"):
        run(wf, journal=str(tmp_path / "j.db"))
    wf = [Pipeline([], name="x"), Pipeline([], name="x")]
    with pytest.raises(EnsembleError, match="pipeline name 'x'"):
        run(wf, journal=str(tmp_path / "k.db"))


def test_workflow_shapes(tmp_path):
    with pytest.raises(EnsembleError, match="wrap this Stage"):
        run(Stage([]), journal=str(tmp_path / "j.db"))
    with pytest.raises(EnsembleError, match="not a Pipeline"):
        run([3], journal=str(tmp_path / "k.db"))
    with pytest.raises(EnsembleError, match="not a Task"):
        run(Pipeline([Stage(["/bin/true"])]), journal=str(tmp_path / "l.db"))


def test_existing_journal_needs_resume(tmp_path):
    j = str(tmp_path / "j.db")
    assert run(Pipeline([Stage([Task(executable="/bin/true")])]), journal=j).ok
    with pytest.raises(EnsembleError, match="resume=True"):
        run(Pipeline([Stage([Task(executable="/bin/true")])]), journal=j)


def test_states_are_enums():
    assert TaskState.DONE.terminal and not TaskState.RUNNING.terminal


@pytest.mark.parametrize("text, secs", [(90, 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0),
                                        ("1:30:00", 5400.0), ("10:00", 600.0), ("1:05", 65.0)])
def test_walltime_parse(text, secs):
    assert parse_walltime(text) == secs


@pytest.mark.parametrize("bad", ["soon", "-5", 0, "1:2:3:4"])
def test_walltime_bad(bad):
    with pytest.raises(EnsembleError, match="walltime"):
        parse_walltime(bad)
