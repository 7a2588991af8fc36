"""EnTK scripts on shoal, written the way an EnTK user writes them (``from shoal.entk import ...``).

Each test here failed before issue 14: ``Stage().add_tasks(t)`` raised, unknown attributes were
ignored, a no-argument post_exec was a bare TypeError, function tasks with cores=2 ran on one CPU.
The migration guide docs/entk.md runs as written, and a SIGKILLed AppManager run resumes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from ens_tasks import ROOT, run_py

from shoal.ensemble import EnsembleError, RunStatus, TaskState, run
from shoal.entk import AppManager, Pipeline, Stage, Task


def _guide_block() -> str:
    text = (ROOT / "docs" / "entk.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "shoal.entk" in b]
    assert len(blocks) == 1
    return blocks[0]


def test_migration_guide_runs_as_written(tmp_path):
    script = tmp_path / "sal.py"
    script.write_text(_guide_block())
    out = run_py(str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done after 3 iterations, total 14" in out.stdout
    # the analysis outputs were downloaded, each the sum of i + k over the four simulations
    assert [(tmp_path / f"total_{k}.txt").read_text().strip() for k in range(3)] == ["6", "10", "14"]
    status = RunStatus.load(str(tmp_path / "entk.db"))
    assert [s.uid for s in status.pipelines[0].stages] == [
        "sal.sim0", "sal.ana0", "sal.sim1", "sal.ana1", "sal.sim2", "sal.ana2"]
    assert status.counts[TaskState.DONE] == 15 and status.finished
    # running the script again is a new session, as in EnTK: the old journal is kept, not an error
    again = run_py(str(script), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(list(tmp_path.glob("entk.*.db"))) == 1


def test_add_tasks_and_add_stages_entk_style(tmp_path):
    s = Stage()
    t = Task()
    t.executable = "/bin/true"
    s.add_tasks(t)  # the first line of every EnTK script (was: "add_tasks needs a list ... tuple")
    s.add_tasks([Task(executable="/bin/true") for _ in range(2)])
    s.add_tasks({Task(executable="/bin/true")})
    p = Pipeline()
    p.add_stages(s)
    p.add_stages([Stage(tasks=[Task(executable="/bin/true")])])
    assert len(s.tasks) == 4 and len(p.stages) == 2
    report = run(p, journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 5
    with pytest.raises(EnsembleError, match="expected a Task"):
        s.add_tasks("not a task")


def test_unknown_attributes_raise_at_assignment_with_did_you_mean():
    t = Task()
    with pytest.raises(EnsembleError, match=r"no attribute 'cpu_req' \(did you mean 'cpu_reqs'\?\)"):
        t.cpu_req = {"cpu_processes": 1}
    with pytest.raises(EnsembleError, match=r"unknown key 'cpu_thread' \(did you mean 'cpu_threads'\?\)"):
        t.cpu_reqs = {"cpu_processes": 1, "cpu_thread": 2}
    with pytest.raises(EnsembleError, match="the ranks come from cpu_reqs"):
        t.gpu_reqs = {"gpu_processes": 1, "gpu_process_type": "MPI"}
    with pytest.raises(EnsembleError, match="lfs_per_process: not supported"):
        t.lfs_per_process = 10
    with pytest.raises(EnsembleError, match=r"did you mean 'add_tasks'|did you mean 'tasks'"):
        Stage().taskz = []
    with pytest.raises(EnsembleError, match="did you mean 'stages'"):
        Pipeline().stage = []
    with pytest.raises(EnsembleError, match=r"did you mean 'workflow'"):
        AppManager().workflows = []
    with pytest.raises(EnsembleError, match=r"unknown key 'cpu' \(did you mean 'cpus'\?\)"):
        AppManager(resource_desc={"resource": "local.localhost", "cpu": 2})
    with pytest.raises(EnsembleError, match="--slurm"):
        AppManager(resource_desc={"resource": "ornl.summit"})


def test_cpu_reqs_give_cores_to_executables_and_functions(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    exe = Task()
    exe.name = "exe"
    exe.executable = "/bin/sh"
    exe.arguments = ["-c", 'echo "$OMP_NUM_THREADS $(nproc)"']
    exe.cpu_reqs = {"cpu_processes": 1, "cpu_process_type": None, "cpu_threads": 2, "cpu_thread_type": "OpenMP"}
    from ens_tasks import cpu_view

    fn = Task(function=cpu_view, name="fn")
    fn.cpu_reqs = {"cpu_processes": 1, "cpu_threads": 2}
    one = Task(function=cpu_view, name="one")
    j = str(tmp_path / "run.db")
    report = run(Pipeline([Stage([exe, fn, one])], name="p"), journal=j)
    assert report.ok, report
    assert (tmp_path / "run.sandbox/p/s0/exe/stdout").read_text().split() == ["2", "2"]
    assert report.result("p.s0.fn") == (2, "2")  # was: one CPU, no OMP_NUM_THREADS
    assert report.result("p.s0.one")[0] == 1


def test_no_argument_post_exec_grows_the_pipeline(tmp_path):
    seen = []
    p = Pipeline()
    p.name = "adapt"

    def grow():  # EnTK style: no argument, appends through the pipeline object
        seen.append(len(p.stages))
        if len(p.stages) < 3:
            s = Stage()
            t = Task()
            t.executable = "/bin/true"
            s.add_tasks(t)
            s.post_exec = grow
            p.add_stages(s)

    s0 = Stage()
    s0.add_tasks(Task(executable="/bin/true"))
    s0.post_exec = grow
    p.add_stages(s0)
    report = run(p, journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 3 and seen == [1, 2, 3]


def test_post_exec_with_two_arguments_names_the_stage(tmp_path):
    s = Stage(name="ana", tasks=[Task(executable="/bin/true")])
    s.post_exec = lambda a, b: None
    with pytest.raises(EnsembleError, match=r"stage p0\.ana: post_exec: .* takes 2 required arguments"):
        run(Pipeline([s]), journal=str(tmp_path / "run.db"))


def test_appmanager_reports_failures_and_resume_retry_failed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flag = tmp_path / "fixed"
    t = Task()
    t.name = "picky"
    t.executable = "/bin/sh"
    t.arguments = ["-c", f"test -e {flag} || {{ echo not yet >&2; exit 3; }}"]
    s = Stage()
    s.add_tasks(t)
    p = Pipeline()
    p.add_stages(s)
    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 1, "cpus": 1})
    appman.workflow = {p}
    with pytest.raises(EnsembleError, match=r"1 task\(s\) failed, first p0\.s0\.picky: exit code 3"):
        appman.run()
    assert appman.report.failures[0]["stderr_tail"].strip() == "not yet"
    flag.write_text("")
    again = AppManager(resource_desc={"resource": "local.localhost", "cpus": 1}, resume=True, retry_failed=True)
    again.workflow = [p]
    assert again.run().ok


KILLED = '''
import os, sys, time
from shoal.entk import AppManager, Pipeline, Stage, Task

SIDE = {side!r}

def make():
    p = Pipeline()
    p.name = "kill"
    for k in range(2):
        s = Stage()
        s.name = f"s{{k}}"
        for i in range(10):
            t = Task()
            t.name = f"t{{i}}"
            t.executable = "/bin/sh"
            t.arguments = ["-c", f"echo 1 >> {{SIDE}}/$SHOAL_TASK; sleep 0.2"]
            s.add_tasks(t)
        p.add_stages(s)
    return p

if __name__ == "__main__":
    appman = AppManager(resource_desc={{"resource": "local.localhost", "cpus": 2}},
                        resume=len(sys.argv) > 1)
    appman.workflow = [make()]
    print(appman.run().done)
'''


def test_appmanager_sigkill_then_resume(tmp_path):
    side = tmp_path / "side"
    side.mkdir()
    script = tmp_path / "wf.py"
    script.write_text(KILLED.format(side=str(side)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(list(side.iterdir())) < 6 and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.02)
    os.kill(driver.pid, signal.SIGKILL)
    driver.communicate()
    status = RunStatus.load(str(tmp_path / "entk.db"))
    assert status.driver.state.value == "dead"  # not "running" forever
    assert status.total == 20 and status.counts[TaskState.DONE] < 20
    assert [s.uid for s in status.pipelines[0].stages] == ["kill.s0", "kill.s1"]  # unstarted one too
    out = run_py(str(script), "resume", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "20"
    runs = {f.name: len(f.read_text().split()) for f in side.iterdir()}
    assert len(runs) == 20
    # a task ran twice only if the kill caught it between its start and its DONE commit (<= 2 slots)
    assert sum(n - 1 for n in runs.values()) <= 2, runs


def test_appmanager_raises_when_the_walltime_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = Task()
    t.executable = "/bin/true"
    t.estimate = 600  # ten minutes, more than the walltime: it must not start
    s = Stage()
    s.add_tasks(t)
    p = Pipeline()
    p.add_stages(s)
    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 0.05, "cpus": 1})
    appman.workflow = [p]
    with pytest.raises(EnsembleError, match=r"stopped before the end \(walltime: .*resume=True"):
        appman.run()
    assert appman.report.drained and appman.report.done == 0


def test_entk_tasks_run_in_a_shell_and_shoal_tasks_keep_argv(tmp_path, monkeypatch):
    """EnTK runs `executable arguments` in a shell (RADICAL-Pilot's task script): '>' redirects
    and $VAR expands; shoal.ensemble's Task gives the program its arguments as they are."""
    from shoal.ensemble import Pipeline as SPipeline
    from shoal.ensemble import Stage as SStage
    from shoal.ensemble import Task as STask

    monkeypatch.setenv("GREETING", "hi there")
    entk = Task()
    entk.name = "entk"
    entk.executable = "/bin/echo"
    entk.arguments = ["$GREETING", ">", "out.txt"]
    plain = STask(executable="/bin/echo", arguments=["$GREETING", ">", "out.txt"], name="plain")
    report = run([Pipeline([Stage([entk])], name="e"), SPipeline([SStage([plain])], name="s")],
                 journal=str(tmp_path / "run.db"))
    assert report.ok, report.failures
    assert (tmp_path / "run.sandbox/e/s0/entk/out.txt").read_text() == "hi there\n"
    assert (tmp_path / "run.sandbox/s/s0/plain/stdout").read_text() == "$GREETING > out.txt\n"


def test_name_keys_are_injective_and_leave_shoal_names_alone():
    from shoal.patterns.ensemble.model import NAME_RE, name_key

    names = ["sim-1_a", "my.task", "my~2Etask", "Pipeline 1", "Pipeline~201", "a.b c", "ü.x", "t0", "%41"]
    keys = [name_key(n) for n in names if NAME_RE.match(n) or "~" not in n]
    assert len(set(keys)) == len(keys)
    assert name_key("sim-1_a") == "sim-1_a" and name_key("%41") == "%41"  # old journals keep their keys
    assert name_key("my.task") == "my~2Etask" and name_key("Pipeline 1") == "Pipeline~201"
    assert all(NAME_RE.match(name_key(n).replace("~", "")) for n in names if "~" not in n)


def test_entk_naming_rule_refuses_what_entk_and_shoal_both_refuse():
    t = Task()
    for ok in ("my.first.task", "Pipeline 1", "sim_1", "a-b", "x,y"):
        t.name = ok
        t.executable = "/bin/true"
        t.validate()
    for bad in ("a/b", "$x", "a;b", "a*b"):
        t.name = bad
        with pytest.raises(EnsembleError, match="EnTK names are letters, digits, '.' and spaces"):
            t.validate()
    from shoal.ensemble import Task as STask

    with pytest.raises(EnsembleError, match=r"must be letters, digits or _-:\+@%=,"):
        STask(executable="/bin/true", name="my.task").validate()  # shoal's own rule is unchanged


def test_entk_dicts_task_positional_and_from_dict_methods():
    """EnTK's Task(dict) (positional from_dict), t.from_dict(d), Stage/Pipeline.from_dict(d)."""
    t = Task({"executable": "/bin/echo", "arguments": [10], "name": "a.b",
              "cpu_reqs": {"cpu_processes": 1, "cpu_threads": 2}, "state": "DONE", "uid": "task.custom"})
    assert (t.uid, t.executable, t.cores, t.name, t.state) == ("task.custom", "/bin/echo", 2, "a.b", "DESCRIBED")
    before = t.uid
    t2 = Task()
    keep = t2.uid
    t2.from_dict({"executable": "true"})
    assert (t2.uid, t2.executable) == (keep, "true") and before != keep
    s, p = Stage(), Pipeline()
    s.from_dict({"name": "Stage 1"})
    p.from_dict({"uid": "pipeline.custom", "name": "pipe.1", "state": "DONE"})
    assert (s.name, p.uid, p.name, p.state) == ("Stage 1", "pipeline.custom", "pipe.1", "DESCRIBED")
    with pytest.raises(EnsembleError, match="holds /"):
        Stage().from_dict({"name": "a/b"})
    with pytest.raises(EnsembleError, match="takes a dict"):
        Task(["/bin/echo"])


def test_a_post_exec_reads_an_entk_tasks_result_by_the_object(tmp_path):
    """ctx.results[t] / ctx.results.path(t, ...) with an EnTK Task: its uid is EnTK's
    ('task.000000'), the journal's key is its luid — the lookup used the uid and found nothing."""
    t = Task()
    t.executable, t.arguments, t.stdout = "/bin/echo", ["hi"], "hi.txt"
    seen = []
    s = Stage()
    s.add_tasks(t)
    s.post_exec = lambda ctx: seen.append((ctx.results[t], open(ctx.results.path(t, t.stdout)).read()))
    p = Pipeline()
    p.add_stages(s)
    assert run(p, journal=str(tmp_path / "run.db")).ok
    assert seen == [(0, "hi\n")]


def test_on_retry_with_an_entk_task(tmp_path):
    """on_retry returning t.replace(...) of an EnTK Task: the engine assigned new.uid = the run's
    key, which an EnTK Task refuses (its uid is EnTK's and never re-assigned)."""
    t = Task()
    t.executable, t.arguments, t.retries = "/bin/sh", ["-c", "exit 3"], 1
    t.on_retry = lambda task, failure: task.replace(arguments=["-c", "exit 0"])
    s = Stage()
    s.add_tasks(t)
    p = Pipeline()
    p.add_stages(s)
    report = run(p, journal=str(tmp_path / "run.db"))
    assert report.ok and report.retries == 1


PROGRESS_SCRIPT = """\
from shoal.entk import AppManager, Pipeline, Stage, Task
p = Pipeline(); p.name = "entk"
s = Stage(); s.name = "sim"
for i in range(4):
    t = Task(); t.name = f"t{i}"; t.executable = "/bin/true"
    s.add_tasks(t)
p.add_stages(s)
appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 10, "cpus": 2})
appman.workflow = [p]
appman.run()
"""


def _stderr_of(script, cwd, *, tty: bool) -> str:
    """``script``'s stderr, written to a real pseudo-terminal (``tty``) or to a pipe."""
    import select

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if not tty:
        out = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stderr
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        chunks = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed its end (EIO on Linux)
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(30) == 0, b"".join(chunks)
    finally:
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_appmanager_run_draws_shoal_runs_progress_line_on_a_terminal(tmp_path):
    """``AppManager.run()`` printed nothing while it ran; on a terminal it now draws the line
    ``shoal run`` draws (redrawn in place), and in a log or a pipe it stays quiet."""
    script = tmp_path / "entk_progress.py"
    script.write_text(PROGRESS_SCRIPT)
    drawn = _stderr_of(script, tmp_path, tty=True)
    final = drawn.replace("\r\n", "\n").split("\r")[-1].strip()
    assert re.match(r"ensemble: \[#{20}\] 4/4 tasks  [\d.,]+ tasks/s  done 4  running 0  failed 0  "
                    r"elapsed \d+:\d\d  ETA 0:00 \(done\)$", final), repr(drawn)
    assert _stderr_of(script, tmp_path, tty=False) == ""
