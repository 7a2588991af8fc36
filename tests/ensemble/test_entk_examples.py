"""The shapes of RADICAL-EnTK's own examples (radical.entk's examples/ folder), on shoal.

CI has no internet and EnTK is not installed, so each test here mirrors one upstream script:
the same EnTK calls in the same order (names with '.' and spaces, duplicate names, uids used in
references before the run, ``Task(dict)``, ``t.stdout``/``t.sandbox``, ``$SHARED``, shell
redirection in arguments, ``post_exec`` adaptivity, ``suspend()``/``resume()``), scaled down
(fewer tasks, shorter sleeps).  docs/entk.md keeps the table of every example and its status;
a test's docstring names its example.  Before the EnTK classes existed (entk_model.py) each of
these failed: names were refused, uids were None, arguments reached no shell, and
``shared_data``, ``Task(dict)``, ``stdout``/``sandbox`` and ``suspend`` did not exist.
"""

from __future__ import annotations

import functools
import random
import threading
import time

import pytest

from shoal.ensemble import EnsembleError, RunStatus, TaskState
from shoal.entk import AppManager, Pipeline, Stage, Task, states

LOCAL = {"resource": "local.localhost", "walltime": 10, "cpus": 2}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _run(pipelines, desc=None, **kw):
    appman = AppManager(**kw)
    appman.resource_desc = desc or LOCAL
    appman.workflow = pipelines
    appman.run()
    return appman


def _echo_task(name, text):
    t = Task()
    if name is not None:
        t.name = name
    t.executable = "/bin/echo"
    t.arguments = [text]
    return t


# -- user_guide/ -------------------------------------------------------------------------------
def test_get_started_a_task_named_with_dots(tmp_path):
    """user_guide/get_started.py: t.name = 'my.first.task' (refused before: no '.' in names)."""
    p, s = Pipeline(), Stage()
    s.add_tasks(_echo_task("my.first.task", "Hello World"))
    p.add_stages(s)
    _run(set([p]), {"resource": "local.localhost", "walltime": 10, "cpus": 1})
    # the name's journal key: '.' -> '~2E' (model.name_key); its sandbox is that directory
    assert (tmp_path / "entk.sandbox/p0/s0/my~2Efirst~2Etask/stdout").read_text() == "Hello World\n"
    status = RunStatus.load(str(tmp_path / "entk.db"))
    assert status.counts[TaskState.DONE] == 1


def test_add_tasks_ten_tasks_with_one_name(tmp_path):
    """user_guide/add_tasks.py: ten tasks all named 'my.task' (duplicates were refused)."""
    p, s = Pipeline(), Stage()
    for cnt in range(10):
        s.add_tasks(_echo_task("my.task", "I am task %s" % cnt))
    p.add_stages(s)
    _run(set([p]))
    dirs = sorted((tmp_path / "entk.sandbox/p0/s0").iterdir())
    assert len(dirs) == 10  # 'my~2Etask', then 'my~2Etask#1' ... by position: stable on resume
    outs = sorted(d.joinpath("stdout").read_text() for d in dirs)
    assert outs == sorted("I am task %s\n" % i for i in range(10))


def test_add_stages_stage_names_with_dots(tmp_path):
    """user_guide/add_stages.py: stages 'Stage.1' and 'Stage.2', tasks all 'my.task'."""
    p = Pipeline()
    for sname, n in (("Stage.1", 4), ("Stage.2", 2)):
        s = Stage()
        s.name = sname
        for cnt in range(n):
            s.add_tasks(_echo_task("my.task", "I am task %s in %s" % (cnt, s.name)))
        p.add_stages(s)
    _run(set([p]))
    status = RunStatus.load(str(tmp_path / "entk.db"))
    assert [st.uid for st in status.pipelines[0].stages] == ["p0.Stage~2E1", "p0.Stage~2E2"]
    assert status.counts[TaskState.DONE] == 6


def test_add_pipelines_names_with_spaces(tmp_path):
    """user_guide/add_pipelines.py: pipelines 'Pipeline 1' and 'Pipeline 2' in a set."""
    def generate_pipeline(name, stages):
        p = Pipeline()
        p.name = name
        for s_cnt in range(stages):
            s = Stage()
            s.name = "Stage.%s" % s_cnt
            for t_cnt in range(2):
                s.add_tasks(_echo_task("my.task", "I am task %s in %s in %s" % (t_cnt, s_cnt, name)))
            p.add_stages(s)
        return p

    p1, p2 = generate_pipeline("Pipeline 1", 1), generate_pipeline("Pipeline 2", 2)
    _run(set([p1, p2]))
    assert (p1.state, p2.state) == (states.DONE, states.DONE)
    out = (tmp_path / "entk.sandbox/Pipeline~201/Stage~2E0/my~2Etask/stdout").read_text()
    assert out == "I am task 0 in 0 in Pipeline 1\n"


def test_add_data_reference_by_unset_names_is_refused_and_by_uids_runs(tmp_path):
    """user_guide/add_data.py builds '$Pipeline_%s_Stage_%s_Task_%s' from p.name, s1.name,
    t1.name that were never set ('None'; EnTK cannot resolve it either).  The named change:
    build it from the uids, which exist from construction as in EnTK."""
    p, s1, t1 = Pipeline(), Stage(), Task()
    t1.executable = "/bin/bash"
    t1.arguments = ["-l", "-c", "head -c 3000 /dev/zero | base64 > output.txt"]
    s1.add_tasks(t1)
    p.add_stages(s1)
    s2 = Stage()
    s2.name = "Stage.2"
    t2 = Task()
    t2.executable = "/bin/bash"
    t2.arguments = ["-l", "-c", "grep -o . output.txt | sort | uniq -c > ccount.txt"]
    with pytest.raises(EnsembleError, match="names no pipeline and no stage"):
        t2.copy_input_data = ["$Pipeline_%s_Stage_%s_Task_%s/output.txt" % (p.name, s1.name, t1.name)]
    t2.copy_input_data = ["$Pipeline_%s_Stage_%s_Task_%s/output.txt" % (p.uid, s1.uid, t1.uid)]
    t2.download_output_data = ["ccount.txt"]
    s2.add_tasks(t2)
    p.add_stages(s2)
    _run(set([p]), {"resource": "local.localhost", "walltime": 10, "cpus": 1})
    counts = (tmp_path / "ccount.txt").read_text().split()
    assert "A" in counts  # uniq -c over the base64 of zeros
    assert int(counts[0]) > 0 and t2.state == states.DONE and t2.exit_code == 0


def test_add_shared_data_and_a_bare_redirection_argument(tmp_path):
    """user_guide/add_shared_data.py: appman.shared_data, '$SHARED/file' inputs, and
    arguments ['file1.txt', 'file2.txt', '>', 'output.txt'] that only a shell makes work."""
    (tmp_path / "file1.txt").write_text("Hello\n")
    (tmp_path / "file2.txt").write_text("World\n")
    p1, s1 = Pipeline(), Stage()
    for i in range(4):
        t1 = Task()
        t1.executable = "cat"
        t1.arguments = ["file1.txt", "file2.txt", ">", "output.txt"]
        t1.copy_input_data = ["$SHARED/file1.txt", "$SHARED/file2.txt"]
        t1.download_output_data = ["output.txt > %s/output_%s.txt" % (tmp_path, i + 1)]
        s1.add_tasks(t1)
    p1.add_stages(s1)
    appman = AppManager()
    appman.resource_desc = {"resource": "local.localhost", "walltime": 1, "cpus": 1}
    appman.shared_data = ["%s/file1.txt" % tmp_path, "%s/file2.txt" % tmp_path]
    appman.workflow = [p1]
    appman.run()
    for x in range(4):
        assert (tmp_path / f"output_{x + 1}.txt").read_text() == "Hello\nWorld\n"


def test_change_target_schema_is_access_schema_and_a_remote_resource_says_what_to_do():
    """user_guide/change_target.py: 'schema': 'gsissh' (an alias of access_schema) on
    'xsede.comet'; a remote machine is not what AppManager runs on (shoal run --slurm is)."""
    appman = AppManager()
    appman.resource_desc = {"resource": "local.localhost", "walltime": 10, "cpus": 2, "project": "unc100",
                            "schema": "gsissh"}
    assert appman.resource_desc["access_schema"] == "gsissh" and "schema" not in appman.resource_desc
    with pytest.raises(EnsembleError, match="--slurm"):
        appman.resource_desc = {"resource": "xsede.comet", "walltime": 10, "cpus": 16, "schema": "gsissh"}
    with pytest.raises(EnsembleError, match="another name of 'access_schema'"):
        appman.resource_desc = {"resource": "local.localhost", "schema": "ssh", "access_schema": "gsissh"}


def test_profiling_uids_collected_before_the_run(tmp_path):
    """user_guide/profiling.py: the script collects t.uid into lists before the run (EnTK's
    Profiler, which reads those uids from EnTK's session files, is not provided)."""
    p, s1 = Pipeline(), Stage()
    uids = []
    for cnt in range(3):
        t = _echo_task(None, "I am task %s in %s" % (cnt, s1.name))
        s1.add_tasks(t)
        uids.append(t.uid)
    p.add_stages(s1)
    assert len(set(uids)) == 3 and all(u.startswith("task.") and len(u) == len("task.000000") for u in uids)
    _run(set([p]), {"resource": "local.localhost", "walltime": 10, "cpus": 1, "project": ""})
    assert [t.state for t in s1.tasks] == [states.DONE] * 3
    assert [t.uid for t in s1.tasks] == uids  # EnTK's uids never change; the run's keys are luid
    assert [t.luid for t in s1.tasks] == ["p0.s0.t0", "p0.s0.t1", "p0.s0.t2"]


# -- simple/ ------------------------------------------------------------------------------------
def test_bag_of_pipelines_positional_task_dict(tmp_path):
    """simple/bag_of_pipelines.py: re.Task(td) with td = {'executable': 'true'}, AppManager(rts=...,
    autoterminate=True), set(pipelines), am.terminate()."""
    import shoal.entk as re

    td = {"executable": "true"}
    am = re.AppManager(rts="local", autoterminate=True)
    pipelines = []
    for _ in range(2):
        pipeline = re.Pipeline()
        pipelines.append(pipeline)
        for _ in range(2):
            stage = re.Stage()
            pipeline.add_stages([stage])
            for _ in range(3):
                stage.add_tasks([re.Task(td)])
    am.workflow = set(pipelines)
    am.resource_desc = {"resource": "local.localhost", "cpus": 32, "walltime": 15}
    am.run()
    am.terminate()
    assert am.report.done == 12


def _eop_pipeline(cnt, typo="Pipline"):
    p, s1, t1 = Pipeline(), Stage(), Task()
    t1.executable = "/bin/bash"
    t1.arguments = ["-c", "head -c 2000 /dev/urandom | base64 > output.txt"]
    s1.add_tasks(t1)
    p.add_stages(s1)
    s2, t2 = Stage(), Task()
    t2.executable = "/bin/bash"
    t2.arguments = ["-c", "grep -o . output.txt | sort | uniq -c > ccount.txt"]
    t2.copy_input_data = [f"${typo}_%s_Stage_%s_Task_%s/output.txt" % (p.uid, s1.uid, t1.uid)]
    s2.add_tasks(t2)
    p.add_stages(s2)
    s3, t3 = Stage(), Task()
    t3.executable = "/bin/bash"
    t3.arguments = ["-c", "sha1sum ccount.txt > chksum.txt"]
    t3.copy_input_data = [f"${typo}_%s_Stage_%s_Task_%s/ccount.txt" % (p.uid, s2.uid, t2.uid)]
    t3.download_output_data = ["chksum.txt > chksum_%s.txt" % cnt]
    s3.add_tasks(t3)
    p.add_stages(s3)
    return p


def test_eop_references_from_uids_with_the_examples_typo(tmp_path):
    """simple/eop.py (bash without -l here: a login shell per task only costs time): pipelines
    whose references are built from uids, spelled
    '$Pipline_...' (sic) — EnTK reads only the 2nd/4th/6th '_' parts, and so does shoal."""
    _run(set(_eop_pipeline(cnt) for cnt in range(3)), {"resource": "local.localhost", "walltime": 10,
                                                        "cpus": 1})
    for cnt in range(3):
        assert len((tmp_path / f"chksum_{cnt}.txt").read_text().split()[0]) == 40


def test_poe_thirty_named_tasks_referenced_by_uid(tmp_path):
    """simple/poe.py (bash without -l, as in eop): stage s2's tasks t1..tN copy t1's output by uid; s3's tasks reference
    s2's tasks through the uids collected in s2_task_uids."""
    p = Pipeline()
    p.name = "p1"
    s1, t1 = Stage(), Task()
    s1.name, t1.name = "s1", "t1"
    t1.executable = "/bin/bash"
    t1.arguments = ["-c", "head -c 1000 /dev/urandom | base64 > output.txt"]
    s1.add_tasks(t1)
    p.add_stages(s1)
    s2 = Stage()
    s2.name = "s2"
    s2_task_uids = []
    for cnt in range(4):
        t2 = Task()
        t2.name = "t%s" % (cnt + 1)
        t2.executable = "/bin/bash"
        t2.arguments = ["-c", "grep -o . output.txt | sort | uniq -c > ccount.txt"]
        t2.copy_input_data = ["$Pipeline_%s_Stage_%s_Task_%s/output.txt" % (p.uid, s1.uid, t1.uid)]
        s2.add_tasks(t2)
        s2_task_uids.append(t2.uid)
    p.add_stages(s2)
    s3 = Stage()
    s3.name = "s3"
    for cnt in range(4):
        t3 = Task()
        t3.name = "t%s" % (cnt + 1)
        t3.executable = "/bin/bash"
        t3.arguments = ["-c", "sha1sum ccount.txt > chksum.txt"]
        t3.copy_input_data = ["$Pipeline_%s_Stage_%s_Task_%s/ccount.txt" % (p.uid, s2.uid, s2_task_uids[cnt])]
        t3.download_output_data = ["chksum.txt > chksum_%s.txt" % cnt]
        s3.add_tasks(t3)
    p.add_stages(s3)
    _run(set([p]))
    sums = {(tmp_path / f"chksum_{cnt}.txt").read_text().split()[0] for cnt in range(4)}
    assert len(sums) == 1  # every s2 task counted the same output.txt


def test_sow_two_runs_of_one_appmanager(tmp_path):
    """simple/sow.py: appman.run() twice with new pipelines, then terminate()."""
    def generate_pipeline():
        p = Pipeline()
        for _ in range(3):
            s, t = Stage(), Task()
            t.executable, t.arguments = "/bin/sleep", ["0.05"]
            s.add_tasks(t)
            p.add_stages(s)
        return p

    appman = AppManager()
    appman.resource_desc = {"resource": "local.localhost", "walltime": 10, "cpus": 8}
    appman.workflow = set([generate_pipeline() for _ in range(2)])
    appman.run()
    appman.workflow = set([generate_pipeline() for _ in range(2)])
    appman.run()
    appman.terminate()
    assert appman.report.done == 6 and len(list(tmp_path.glob("entk.*.db"))) == 1


# -- tutorial/ ----------------------------------------------------------------------------------
def _tutorial_pipeline(pname, n_simulations=3):
    sandbox = pname
    t1 = Task()
    t1.executable = "/bin/sh"
    t1.arguments = ["-c", "od -An -N1 -i /dev/random"]
    t1.stdout = "random.txt"
    t1.sandbox = sandbox
    s1 = Stage()
    s1.add_tasks(t1)
    s2 = Stage()
    for i in range(n_simulations):
        t2 = Task()
        t2.executable = "/bin/sh"
        t2.arguments = ["-c", 'echo "$(cat random.txt) ^ %d" | bc' % i]
        t2.stdout = "power.%03d.txt" % i
        t2.sandbox = sandbox
        s2.add_tasks(t2)
    t3 = Task()
    t3.executable = "/bin/sh"
    t3.arguments = ["-c", "cat power.*.txt | paste -sd+ | bc"]
    t3.stdout = "sum.txt"
    t3.sandbox = sandbox
    s3 = Stage()
    s3.add_tasks(t3)
    t4 = Task()
    t4.executable = "/bin/sh"
    t4.arguments = ["-c", 'echo "sqrt($(cat sum.txt))" | bc']
    t4.stdout = "sqrt.txt"
    t4.sandbox = sandbox
    t4.download_output_data = ["sqrt.txt > %s.sqrt.txt" % pname]
    s4 = Stage()
    s4.add_tasks(t4)
    p = Pipeline()
    for s in (s1, s2, s3, s4):
        p.add_stages(s)
    return p


def test_radical_entk_1_stdout_files_in_a_shared_sandbox(tmp_path):
    """tutorial/radical_entk_1.py: t.stdout = 'random.txt' and t.sandbox = pname shared by a
    pipeline's tasks; the last task's stdout is downloaded as '<pname>.sqrt.txt'."""
    ensemble = set()
    for cnt in range(3):
        ensemble.add(_tutorial_pipeline(pname="pipe.%03d" % cnt))
    _run(ensemble, {"resource": "local.localhost", "walltime": 10, "cpus": 1})
    for cnt in range(3):
        box = tmp_path / "entk.sandbox" / ("pipe.%03d" % cnt)
        seed = int(box.joinpath("random.txt").read_text())
        total = sum(seed ** i for i in range(3))
        assert int(box.joinpath("sum.txt").read_text()) == total
        assert int(float((tmp_path / ("pipe.%03d.sqrt.txt" % cnt)).read_text())) == int(total ** 0.5)


def test_radical_entk_2_partial_post_exec_and_pipeline_attributes(tmp_path):
    """tutorial/radical_entk_2.py: post_exec = functools.partial(f, stage, pname); a pipeline
    attribute the script keeps (pipeline.iteration); post_exec reads task.stdout of stage.tasks
    and adds stages (reseed, iterate or finish)."""
    n_sims, max_iter, limit = 2, 2, 100 * 1000 * 1000
    ensemble = {}
    seen = []

    def get_stage_1(sandbox, pname):
        t1 = Task()
        t1.executable, t1.arguments = "/bin/sh", ["-c", "od -An -N1 -i /dev/random"]
        t1.stdout, t1.sandbox = "random.txt", sandbox
        t1.download_output_data = ["random.txt > %s.random.txt" % pname]
        s1 = Stage()
        s1.add_tasks(t1)

        def post_exec(_stage, _pname):
            seen.append((_pname, int(open("%s.random.txt" % _pname).read().split()[-1])))
        s1.post_exec = functools.partial(post_exec, s1, pname)
        return s1

    def get_stage_2(sandbox, pname, iteration=0):
        pipeline = ensemble[pname]
        sim = 'echo "($(tail -qn 1 random.txt) + %(iteration)d) ^ %(ensemble_id)d" | bc'
        s2 = Stage()
        pipeline.iteration = iteration
        for i in range(n_sims):
            t2 = Task()
            t2.executable = "/bin/sh"
            t2.arguments = ["-c", sim % {"iteration": iteration, "ensemble_id": i}]
            t2.stdout, t2.sandbox = "power.%03d.txt" % i, sandbox
            t2.download_output_data = ["%s > %s.%s" % (t2.stdout, pname, t2.stdout)]
            s2.add_tasks(t2)

        def post_exec(stage, pname):
            pipeline = ensemble[pname]
            result = sum(int(open("%s.%s" % (pname, task.stdout)).read().split()[-1]) for task in stage.tasks)
            if result > limit:
                pipeline.add_stages(get_stage_1(sandbox, pname))
                pipeline.add_stages(get_stage_2(sandbox, pname))
            elif pipeline.iteration > max_iter:
                pipeline.add_stages(get_stage_3(sandbox, pname))
            else:
                pipeline.add_stages(get_stage_2(sandbox, pname, pipeline.iteration + 1))
        s2.post_exec = functools.partial(post_exec, s2, pname)
        return s2

    def get_stage_3(sandbox, pname):
        t3 = Task()
        t3.executable, t3.arguments = "/bin/sh", ["-c", "tail -qn 1 power.*.txt | paste -sd+ | bc"]
        t3.stdout, t3.sandbox = "sum.txt", sandbox
        t3.download_output_data = ["sum.txt > %s.sum.txt" % pname]
        s3 = Stage()
        s3.add_tasks(t3)
        return s3

    for cnt in range(2):
        p = Pipeline()
        p.name = "pipe.%03d" % cnt
        ensemble[p.name] = p
        p.add_stages(get_stage_1(p.name, p.name))
        p.add_stages(get_stage_2(p.name, p.name))
    _run(set(ensemble.values()), {"resource": "local.localhost", "walltime": 10, "cpus": 1})
    for cnt in range(2):
        assert int(open("pipe.%03d.sum.txt" % cnt).read()) > 0
    assert {name for name, _ in seen} == {"pipe.000", "pipe.001"}


# -- advanced/ ----------------------------------------------------------------------------------
def test_adapt_ta_post_exec_changes_the_next_stages_arguments(tmp_path):
    """advanced/adapt_ta.py, with its named changes (CUR_TASKS and randint defined — a NameError
    on EnTK too — and the index kept in range): post_exec sets the arguments of the next stage."""
    state = {"cur": 0}
    max_new = 2
    p = Pipeline()

    def func_post():
        if state["cur"] < max_new:
            state["cur"] += 1
            for t in p.stages[state["cur"]].tasks:
                t.arguments = ["-c", "echo %d > n.txt" % random.randint(10, 30)]

    for _ in range(max_new + 1):
        s1 = Stage()
        for _ in range(2):
            t1 = Task()
            t1.executable, t1.arguments = "/bin/sh", ["-c", "echo 0 > n.txt"]
            s1.add_tasks(t1)
        s1.post_exec = func_post
        p.add_stages(s1)
    _run([p])
    for j in (1, 2):
        assert 10 <= int((tmp_path / f"entk.sandbox/p0/s{j}/t0/n.txt").read_text()) <= 30


def test_adapt_tc_post_exec_adds_stages(tmp_path):
    """advanced/adapt_tc.py, with its named change (the add under the if: as written it raises
    UnboundLocalError on EnTK too): a no-argument post_exec adds stages until a limit."""
    state = {"cur": 0}
    p = Pipeline()

    def func_post():
        if state["cur"] <= 2:
            state["cur"] += 1
            s = Stage()
            for _ in range(2):
                t = Task()
                t.executable, t.arguments = "/bin/sleep", ["0.01"]
                s.add_tasks(t)
            s.post_exec = func_post
            p.add_stages(s)

    s1 = Stage()
    for _ in range(2):
        t1 = Task()
        t1.executable, t1.arguments = "sleep", ["0.01"]
        s1.add_tasks(t1)
    s1.post_exec = func_post
    p.add_stages(s1)
    appman = _run([p])
    assert len(p.stages) == 4 and appman.report.done == 8


def test_adapt_to_shuffling_a_copy_of_the_stages_changes_nothing(tmp_path):
    """advanced/adapt_to.py (CUR_TASKS defined): shuffle(p.stages[k:]) shuffles a copy, as in
    EnTK; every stage runs once, in order."""
    from random import shuffle
    state = {"cur": 0}
    p = Pipeline()

    def func_post():
        if state["cur"] <= 2:
            state["cur"] += 1
            shuffle(p.stages[state["cur"]:])

    for _ in range(3):
        s1 = Stage()
        t1 = Task()
        t1.executable, t1.arguments = "/bin/sleep", ["0.01"]
        s1.add_tasks(t1)
        s1.post_exec = func_post
        p.add_stages(s1)
    assert _run([p]).report.done == 3


# -- misc/ --------------------------------------------------------------------------------------
def test_suspend_pipelines_the_master_holds_the_others(tmp_path):
    """misc/suspend_pipelines.py: the master pipeline's first post_exec suspends the others,
    its second resumes them; their second stages start only after the resume."""
    pipes, events = [], []

    def generate_pipeline(master=False):
        def func_post_1():
            for p in pipes[1:]:
                p.suspend()
            events.append(("suspended", time.monotonic()))

        def func_post_2():
            events.append(("resumed", time.monotonic()))
            for p in pipes[1:]:
                p.resume()
            return [p.uid for p in pipes[1:]]

        t1 = Task()
        t1.executable = "/bin/sleep"
        t1.arguments = [" 0.05"] if master else ["0.6"]
        s1 = Stage()
        s1.add_tasks(t1)
        if master:
            s1.post_exec = func_post_1
        t2 = Task()
        t2.executable = "/bin/sh"
        t2.arguments = ["-c", "sleep 0.3; date +%s.%N > started.txt"]
        s2 = Stage()
        s2.add_tasks(t2)
        if master:
            s2.post_exec = func_post_2
        p = Pipeline()
        p.add_stages(s1)
        p.add_stages(s2)
        return p

    pipes.append(generate_pipeline(True))
    pipes.append(generate_pipeline(False))
    pipes.append(generate_pipeline(False))
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append([p.state for p in pipes])
            time.sleep(0.02)
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    try:
        _run(pipes, {"resource": "local.localhost", "walltime": 15, "cpus": 4})
    finally:
        stop.set()
        th.join()
    assert [e for e, _ in events] == ["suspended", "resumed"]
    assert any(states.SUSPENDED in row for row in seen)
    assert [p.state for p in pipes] == [states.DONE] * 3
    for i in (1, 2):  # the others' second stages started after the master's second stage ended
        other = float((tmp_path / f"entk.sandbox/p{i}/s1/t0/started.txt").read_text())
        master = float((tmp_path / "entk.sandbox/p0/s1/t0/started.txt").read_text())
        assert other > master
    assert states.SUSPENDED in pipes[1].state_history


def test_a_run_whose_pipelines_all_wait_suspended_says_so(tmp_path):
    p = Pipeline()
    s = Stage()
    s.add_tasks(_echo_task(None, "x"))
    s.post_exec = p.suspend  # suspends itself; nothing is left to resume it
    p.add_stages(s)
    s2 = Stage()
    s2.add_tasks(_echo_task(None, "y"))
    p.add_stages(s2)
    with pytest.raises(EnsembleError, match=r"pipelines p0 are suspended"):
        _run([p])


def test_async_repex_appmanager_and_pipeline_subclasses(tmp_path):
    """misc/async_repex.py, with its named changes (radical.utils' Logger and the dump file
    left out, resource_terminate -> terminate): an AppManager subclass that runs in __init__,
    Replica(Pipeline) subclasses whose bound-method post_execs suspend themselves and resume
    the others of an exchange.  One more change: replicas wait for a partner of their own
    cycle.  The example pairs them in arrival order, so a replica a full cycle behind the
    others (random sleeps, a loaded machine) waited for a partner that had finished: shoal
    reported the deadlock ("pipelines p~2E3 are suspended ... nothing runs whose post_exec
    could resume() them"), about one run in six."""
    import shoal.entk as re

    class ReplicaExchange(re.AppManager):
        glyphs = {re.states.INITIAL: "+", re.states.SCHEDULING: "|", re.states.SUSPENDED: "-",
                  re.states.DONE: " ", re.states.FAILED: "!", re.states.CANCELED: "X"}

        def __init__(self, ensemble_size, exchange_size, md_cycles):
            self._en_size, self._ex_size, self._cycles = ensemble_size, exchange_size, md_cycles
            self._lock = threading.Lock()
            self._trace = []
            re.AppManager.__init__(self, autoterminate=False, port=5672)
            self.resource_desc = {"resource": "local.localhost", "walltime": 30, "cpus": 4}
            self._replicas = [Replica(self._check_exchange, self._check_resume, i)
                              for i in range(self._en_size)]
            self._waitlist = {}  # by cycle (see the docstring)
            self.workflow = set(self._replicas)
            self.run()

        def _dump(self):
            self._trace.append("".join(self.glyphs[r.state] for r in self._replicas))

        def _check_exchange(self, replica):
            with self._lock:
                waiting = self._waitlist.setdefault(replica.cycle, [])
                waiting.append(replica)
                if len(waiting) < self._ex_size:
                    replica.suspend()
                    self._dump()
                    return
                exchange_list = waiting
                del self._waitlist[replica.cycle]
                replica.add_ex_stage(exchange_list)

        def _check_resume(self, replica):
            self._dump()
            for r in replica.exchange_list:
                if r.cycle <= self._cycles:
                    r.add_md_stage()
                if r.rid != replica.rid:
                    r.resume()

    class Replica(re.Pipeline):
        def __init__(self, check_ex, check_res, rid):
            self._check_ex, self._check_res, self._rid = check_ex, check_res, rid
            self._cycle, self._ex_list = 0, None
            re.Pipeline.__init__(self)
            self.name = "p.%s" % self.rid
            self.add_md_stage()

        rid = property(lambda self: self._rid)
        cycle = property(lambda self: self._cycle)
        exchange_list = property(lambda self: self._ex_list)

        def add_md_stage(self):
            task = re.Task()
            task.name = "mdtsk.%s.%s" % (self.rid, self.cycle)
            task.executable = "sleep"
            task.arguments = [str(random.randint(0, 5) / 100.0)]
            stage = re.Stage()
            stage.add_tasks(task)
            stage.post_exec = self.check_exchange
            self.add_stages(stage)

        def check_exchange(self):
            self._cycle += 1
            self._check_ex(self)

        def add_ex_stage(self, exchange_list):
            self._ex_list = exchange_list
            task = re.Task()
            task.name, task.executable = "extsk", "date"
            stage = re.Stage()
            stage.add_tasks(task)
            stage.post_exec = self.check_resume
            self.add_stages(stage)

        def check_resume(self):
            return self._check_res(self)

    exchange = ReplicaExchange(ensemble_size=4, exchange_size=2, md_cycles=2)
    exchange.terminate()
    assert all(r.state == re.states.DONE for r in exchange._replicas)
    assert any("-" in row for row in exchange._trace)
    assert all(r.cycle >= 3 for r in exchange._replicas)


def test_lfs_tagging_dd_lfs_is_refused_with_the_reason_and_runs_without(tmp_path):
    """misc/lfs_tagging_dd.py: lfs_per_process and `tag` are refused with the reason (the
    named change: drop those lines); tags={'colocate': uid} is kept as metadata (one machine)."""
    t = Task()
    with pytest.raises(EnsembleError, match="lfs_per_process: not supported"):
        t.lfs_per_process = 10
    with pytest.raises(EnsembleError, match="tag: not supported"):
        t.tag = {"colocate": "task.000000"}
    pipelines = []
    for x in range(2):
        pipeline = Pipeline()
        pipeline.name = "p.%04d" % x
        first = None
        for k in (1, 2, 3):
            stage = Stage()
            stage.name = "stage%d" % k
            task = Task()
            task.name = "task%d.%04d" % (k, x)
            task.executable = "hostname"
            task.cpu_reqs = {"cpu_processes": 1, "cpu_threads": 1, "cpu_process_type": None,
                             "cpu_thread_type": None}
            if first is None:
                first = task
            else:
                task.tags = {"colocate": first.uid}
            stage.add_tasks(task)
            pipeline.add_stages(stage)
        pipelines.append(pipeline)
    assert _run(set(pipelines), {"resource": "local.localhost", "walltime": 20, "cpus": 2}).report.done == 6


def test_scale_a_mock_rts_and_a_test_resource_run_for_real(tmp_path):
    """misc/scale.py: AppManager(autoterminate=True, rts='mock') on 'local.localhost_test'
    (EnTK's mock RTS only pretends; shoal runs the tasks)."""
    pipelines = set()
    for _ in range(2):
        p = Pipeline()
        for _ in range(2):
            s = Stage()
            for _ in range(2):
                t = Task()
                t.executable = "/bin/true"
                s.add_tasks(t)
            p.add_stages(s)
        pipelines.add(p)
    appman = AppManager(autoterminate=True, rts="mock")
    appman.resource_desc = {"resource": "local.localhost_test", "cpus": 8, "walltime": 10}
    appman.workflow = pipelines
    appman.run()
    appman.terminate()
    assert appman.report.done == 8


# -- the journal with EnTK's names ----------------------------------------------------------------
def test_a_resume_finds_tasks_with_dotted_and_duplicate_names_again(tmp_path):
    """Names with '.' and spaces and duplicates get journal keys (name_key, '#<position>') that
    are the same in the next run of the script: a resume re-runs only what did not finish."""
    flag = tmp_path / "fixed"

    def workflow():
        p = Pipeline()
        p.name = "Pipeline 1"
        s = Stage()
        s.name = "Stage.1"
        for cnt in range(3):
            t = Task()
            t.name = "my.task"
            t.executable = "/bin/sh"
            t.arguments = ["-c", f"echo {cnt} >> ../../../../ran.txt; test {cnt} != 1 || test -e {flag}"]
            s.add_tasks(t)
        p.add_stages(s)
        return [p]

    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 5, "cpus": 1})
    appman.workflow = workflow()
    with pytest.raises(EnsembleError, match=r"1 task\(s\) failed, first Pipeline~201\.Stage~2E1\.my~2Etask#1"):
        appman.run()
    flag.touch()
    again = AppManager(resource_desc={"resource": "local.localhost", "walltime": 5, "cpus": 1},
                       resume=True, retry_failed=True)
    again.workflow = workflow()  # new objects, new EnTK uids: the keys are what a resume matches
    report = again.run()
    assert report.ok and report.done == 3
    assert sorted((tmp_path / "ran.txt").read_text().split()) == ["0", "1", "1", "2"]


def test_darshan_enabled_shape_task_dicts_and_shared_outputs(tmp_path):
    """misc/darshan_enabled.py without what is not supported (anl.polaris, the Darshan tools,
    radical.pilot's constants): Task(dict) with upload_input_data and a copy_output_data into
    '$SHARED/...', read by the next stage's copy_input_data from '$SHARED/...'."""
    (tmp_path / "passwd").write_text("a b c\nd e\n")
    task_00 = Task({"executable": "/bin/echo", "arguments": [10],
                    "cpu_reqs": {"cpu_processes": 1, "cpu_threads": 2, "cpu_thread_type": "OpenMP"}})
    task_01 = Task({"executable": "/bin/sh",
                    "arguments": ["-c", "cat input.dat | wc > output_01.dat"],
                    "upload_input_data": ["%s/passwd > input.dat" % tmp_path],
                    "copy_output_data": ["output_01.dat > $SHARED/output_01.dat"]})
    stage_0 = Stage()
    stage_0.add_tasks([task_00, task_01])
    task_10 = Task({"executable": "/bin/sh",
                    "arguments": ["-c", "tr -s ' ' < output_01.dat | cut -d' ' -f2 > lines.txt"],
                    "copy_input_data": ["$SHARED/output_01.dat > output_01.dat"]})
    stage_1 = Stage()
    stage_1.add_tasks([task_10])
    pipeline = Pipeline()
    pipeline.add_stages([stage_0, stage_1])
    _run([pipeline], {"resource": "local.localhost", "cpus": 2, "walltime": 15})
    assert (tmp_path / "entk.sandbox/~shared/output_01.dat").exists()
    assert (tmp_path / "entk.sandbox/p0/s1/t0/lines.txt").read_text().strip() == "2"
    assert (tmp_path / "entk.sandbox/p0/s0/t0/stdout").read_text() == "10\n"
