"""HPC allocations without a batch system: the pure parts (walltime, job policy, node lists,
scontrol and cgroup parsing, resource descriptions) and the errors users see first.
The same features against a real SLURM: test_slurm_*.py (marker ``slurm``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import shoal
from shoal.backends.dask.jobs import (
    Fail,
    JobPolicy,
    JobState,
    Note,
    Replace,
    Seen,
    Warn,
    fold_state,
)
from shoal.backends.dask.provider import batch_time, walltime_seconds
from shoal.ensemble import EnsembleError, parse_walltime
from shoal.patterns.ensemble.resource import Resource, ResourceKind, merge, time_left
from shoal.runtime import allocation as al

# -- one meaning of a walltime -------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [
    (45, 45), ("45", 45), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1:30", 90),
    ("01:00:00", 3600), (2.5, 2.5),
    # SLURM's day forms: the clock after the day starts at hours.  The provider read "1-12" as
    # a day and 12 seconds (and asked SLURM for 24 h where the user wrote 36 h).
    ("1-12", 129600), ("1-12:30", 131400), ("1-00:00:01", 86401), ("2-0", 172800),
])
def test_the_provider_and_the_ensemble_read_a_walltime_alike(text, seconds):
    assert walltime_seconds(text) == parse_walltime(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "-5", 0, -1, "1:2:3:4", "1-2:3:4:5", float("nan"),
                                 float("inf"), "", True])
def test_the_provider_and_the_ensemble_refuse_a_bad_walltime_alike(bad):
    with pytest.raises(ValueError, match="walltime"):
        walltime_seconds(bad)
    with pytest.raises(EnsembleError, match="walltime"):
        parse_walltime(bad)


def test_batch_time_is_what_slurm_reads_as_the_same_length():
    assert batch_time(30) == "00:00:30"
    assert batch_time(90.2) == "00:01:31"  # rounded up: never shorter than asked
    assert batch_time(36 * 3600) == "36:00:00"
    assert walltime_seconds(batch_time(12345)) == 12345


# -- the job watch's policy ------------------------------------------------------------


def test_fold_state():
    assert fold_state("PENDING") is JobState.PENDING
    assert fold_state("CONFIGURING") is fold_state("RUNNING") is JobState.RUNNING
    assert fold_state("COMPLETING") is JobState.ENDING
    for ended in ("COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "FAILED", None):
        assert fold_state(ended) is JobState.GONE


def test_policy_notes_state_changes_and_warns_about_a_long_wait():
    pol = JobPolicy(warn_after_s=10, warn_every_s=60)
    acts = pol.step(0, {"w0": "7"}, {"7": Seen("PENDING", "Priority")}, set())
    assert [type(a) for a in acts] == [Note] and "PENDING (Priority)" in acts[0].text
    assert pol.step(5, {"w0": "7"}, {"7": Seen("PENDING", "Priority")}, set()) == []
    (warn,) = pol.step(11, {"w0": "7"}, {"7": Seen("PENDING", "Resources")}, set())
    assert isinstance(warn, Warn) and "Resources" in warn.text and "11 s" in warn.text
    assert pol.step(20, {"w0": "7"}, {"7": Seen("PENDING", "Resources")}, set()) == []
    assert isinstance(pol.step(72, {"w0": "7"}, {"7": Seen("PENDING", "Resources")}, set())[0],
                      Warn)  # then once a minute
    acts = pol.step(80, {"w0": "7"}, {"7": Seen("RUNNING", "None", 79.0, 139.0)}, {"w0"})
    assert [type(a) for a in acts] == [Note]
    assert pol.jobs["w0"].view()["end"] == 139.0


def test_policy_fails_on_a_reason_that_never_clears():
    pol = JobPolicy()
    acts = pol.step(0, {"w0": "8"}, {"8": Seen("PENDING", "DependencyNeverSatisfied")}, set())
    (fail,) = [a for a in acts if isinstance(a, Fail)]
    assert "DependencyNeverSatisfied" in fail.message and "job 8" in fail.message
    assert pol.step(1, {"w0": "8"}, {"8": Seen("PENDING", "DependencyNeverSatisfied")},
                    set()) == []  # once


def test_policy_replaces_an_ended_job_and_gives_up_on_a_crash_loop():
    pol = JobPolicy(max_start_failures=3)
    pol.step(0, {"w0": "1"}, {"1": Seen("RUNNING")}, {"w0"})
    acts = pol.step(1, {"w0": "1"}, {}, set())  # scancel'd: gone from squeue
    assert [a for a in acts if isinstance(a, Replace)] == [Replace("w0", "SLURM job 1 ended")]
    assert pol.start_failures == 0  # its worker had connected
    for n, job in enumerate(["2", "3", "4"], start=1):  # new jobs that die before connecting
        pol.step(2 * n, {"w0": job}, {job: Seen("RUNNING")}, set())
        acts = pol.step(2 * n + 1, {"w0": job}, {}, set())
    assert isinstance(acts[-1], Fail) and "3 SLURM jobs in a row" in acts[-1].message
    assert "slurm-4.out" in acts[-1].message


def test_policy_replaces_a_job_the_cluster_dropped_once():
    """dask-jobqueue closes a job whose worker was lost for 15 s (a requeued job waiting
    in the queue) and leaves its name without a job: replaced, once, with a readable why."""
    from shoal.backends.dask.jobs import DROPPED

    pol = JobPolicy()
    pol.step(0, {"w0": "5"}, {"5": Seen("PENDING", "BeginTime")}, set())
    acts = pol.step(1, {"w0": DROPPED}, {}, set())
    assert acts == [Replace("w0", "SLURM job 5 (w0) was closed after its worker was lost")]
    assert pol.step(2, {"w0": DROPPED}, {}, set()) == []  # the replacement is on its way
    acts = pol.step(3, {"w0": "6"}, {"6": Seen("RUNNING")}, {"w0"})
    assert [type(a) for a in acts] == [Note] and "job 6" in acts[0].text


def test_policy_changes_nothing_while_closing():
    pol = JobPolicy()
    pol.step(0, {"w0": "1"}, {"1": Seen("RUNNING")}, {"w0"})
    acts = pol.step(1, {"w0": "1"}, {}, set(), closing=True)
    assert not [a for a in acts if isinstance(a, Replace | Fail)]


# -- inside an allocation --------------------------------------------------------------


@pytest.mark.parametrize("text, names", [
    ("vm", ("vm",)),
    ("n[01-03,7],gpu5", ("n01", "n02", "n03", "n7", "gpu5")),
    ("r[1-2]n[1,3]", ("r1n1", "r1n3", "r2n1", "r2n3")),  # groups multiply (was: silently wrong)
    ("n[1-2", None),
    ("n[3-1]", None),
    ("n[a]", None),
    ("a[8-10]", ("a8", "a9", "a10")),
])
def test_expand_nodelist(text, names):
    if names is None:
        with pytest.raises(ValueError):
            al.expand_nodelist(text)
    else:
        assert al.expand_nodelist(text) == names


def test_current_allocation_from_the_environment():
    env = {"SLURM_JOB_ID": "42", "SLURM_CPUS_ON_NODE": "4", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURMD_NODENAME": "n2"}
    a = al.current(env)
    assert (a.scheduler, a.job_id, a.cpus, a.nodes, a.node) == (al.Scheduler.SLURM, "42", 4,
                                                                ("n1", "n2"), "n2")
    assert a.memory is None
    assert al.current({**env, "SLURM_MEM_PER_NODE": "954"}).memory == 954 * 2**20
    assert al.current({**env, "SLURM_MEM_PER_CPU": "100"}).memory == 400 * 2**20
    assert al.current({"SLURM_JOB_ID": "1", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"}).cpus == 8
    assert al.current({"PBS_JOBID": "7.pbs", "PBS_NUM_PPN": "3"}).cpus == 3
    assert al.current({}) is None


def test_parse_scontrol():
    text = ("JobId=5 JobName=x\n   StartTime=2026-01-02T03:04:05 EndTime=2026-01-02T04:04:05\n"
            "     Nodes=n[1-2] CPU_IDs=0-1,4 Mem=100 GRES=\n     Nodes=n3 CPU_IDs=2 Mem=1\n")
    got = al.parse_scontrol(text, "n2")
    assert got["cpu_ids"] == (0, 1, 4)
    assert got["end"] - got["start"] == 3600
    assert al.parse_scontrol(text, "n3")["cpu_ids"] == (2,)
    assert "cpu_ids" not in al.parse_scontrol(text, "elsewhere")


def test_an_ensemble_inside_a_job_places_within_its_memory(tmp_path, monkeypatch):
    """SLURM_MEM_PER_NODE bounds what the engine hands out: a task asking more than the
    job has is refused with the reason, instead of being OOM-killed later."""
    from shoal.ensemble import Pipeline, Stage, Task, TaskState, run

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "64")  # MB
    small = Task(executable="/bin/true", memory="32M", name="small")
    report = run(Pipeline([Stage([small], name="s")], name="p"), journal=str(tmp_path / "a.db"))
    assert report.counts[TaskState.DONE] == 1
    big = Task(executable="/bin/true", memory="128M", name="big")
    with pytest.raises(EnsembleError, match="p.s.big asks for 134217728 bytes of memory but "
                                            "the pilot has 67108864"):
        run(Pipeline([Stage([big], name="s")], name="p"), journal=str(tmp_path / "b.db"))


def test_cpu_limit_takes_the_jobs_cpus(monkeypatch):
    monkeypatch.setattr(al, "cgroup_cpus", lambda: None)
    env = {"SLURM_JOB_ID": "9", "SLURM_CPUS_ON_NODE": "2"}  # no node name: scontrol not asked
    assert al.cpu_limit((0, 1, 2, 3), env) == ((0, 1), "slurm job 9: 2 CPUs")
    assert al.cpu_limit((0, 1), env) == ((0, 1), None)
    assert al.cpu_limit((0, 1, 2), {}) == ((0, 1, 2), None)
    monkeypatch.setattr(al, "slurm_job_details", lambda job, node: {"cpu_ids": (2, 3)})
    cpus, why = al.cpu_limit((0, 1, 2, 3), {**env, "SLURMD_NODENAME": "vm"})
    assert cpus == (2, 3) and "CPU_IDs 2,3" in why
    monkeypatch.setattr(al, "cgroup_cpus", lambda: 1.5)
    assert al.cpu_limit((0, 1, 2, 3), {}) == ((0, 1), "cgroup CPU quota 1.5")


def test_cgroup_quota_v1_and_v2(tmp_path, monkeypatch):
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "cpu.max").write_text("150000 100000\n")
    real_read = al.Path.read_text

    def fake(self, *a, **k):
        if str(self) == "/proc/self/cgroup":
            return fake.text
        return real_read(self, *a, **k)

    monkeypatch.setattr(al.Path, "read_text", fake)
    fake.text = "0::/job\n"
    assert al.cgroup_cpus(v2) == 1.5
    (v2 / "job" / "cpu.max").write_text("max 100000\n")
    assert al.cgroup_cpus(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "slurm").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us").write_text("200000")
    (v1 / "cpu,cpuacct" / "slurm" / "cpu.cfs_period_us").write_text("100000")
    fake.text = "4:cpu,cpuacct:/slurm\n1:memory:/x\n"
    assert al.cgroup_cpus(v1) == 2.0


# -- resource descriptions -------------------------------------------------------------


def test_resource_of_a_mapping():
    r = Resource.of({"backend": "slurm", "nodes": 2, "cores": 4, "queue": "short",
                     "project": "p1", "walltime": "30m", "job_extra": ["--exclusive"]})
    assert (r.backend, r.nodes, r.cores, r.partition, r.account, r.walltime) == (
        ResourceKind.SLURM, 2, 4, "short", "p1", 1800)
    kw = r.pilot_options()  # two nodes: ONE job of two nodes
    assert kw["provider"] == "slurm" and kw["nodes"] == 2 and kw["cores_per_node"] == 4
    assert "jobs" not in kw and "memory" not in kw  # SLURM's default memory unless asked
    assert kw["queue"] == "short" and kw["job_extra"] == ["--exclusive"]
    one = Resource.of({"cores": 4, "walltime": "30m"}).pilot_options()  # one node: dask-jobqueue
    assert one["jobs"] == 1 and one["cores"] == 4 and one["memory"] == "8GB"
    assert one["drain_margin_s"] < 1800 / 10  # workers retire after the engine has stopped


@pytest.mark.parametrize("bad, message", [
    ({"cpus": 4}, "unknown key 'cpus'"),
    ({"walltim": 5}, "did you mean 'walltime'"),
    ({"cores": 0}, "cores must be an integer >= 1"),
    ({"backend": "lsf"}, "backend 'lsf'"),
    ({"walltime": "soon"}, "walltime 'soon'"),
    ({"job_extra": "--exclusive"}, "job_extra must be a list"),
    ({"queue": "a", "partition": "b"}, "given twice"),
    ("slurm", "resource must be a mapping"),
])
def test_resource_errors_name_the_culprit(bad, message):
    with pytest.raises(EnsembleError, match=message):
        Resource.of(bad)


def test_an_entk_resource_description():
    """EnTK's resource_desc (walltime in minutes) -> a Resource (seconds); local.* -> None."""
    r = Resource.from_entk({"resource": "xsede.stampede2", "walltime": 30, "cpus": 16,
                            "queue": "normal", "project": "TG-1"})
    assert (r.backend, r.cores, r.walltime, r.partition, r.account) == (
        ResourceKind.SLURM, 16, 1800, "normal", "TG-1")
    assert Resource.from_entk({"resource": "local.localhost", "cpus": 2, "walltime": 5}) is None
    with pytest.raises(EnsembleError, match="did you mean 'cpus'"):
        Resource.from_entk({"resource": "x.y", "cpu": 2})
    with pytest.raises(EnsembleError, match="walltime is in minutes"):
        Resource.from_entk({"resource": "x.y", "walltime": "1h"})


def test_merge_lets_the_command_line_win():
    r = merge({"cores": 2, "walltime": 60}, cores=4, partition=None, walltime="2m")
    assert (r.cores, r.walltime, r.partition) == (4, 120, None)
    assert merge(None, nodes=None) is None
    assert merge(None, backend="slurm").backend is ResourceKind.SLURM
    with pytest.raises(EnsembleError, match="cores must be an integer >= 1"):
        merge({"cores": 2}, cores=0)


def test_time_left_counts_from_the_jobs_start_and_never_past_its_end():
    # asked 30 s; SLURM granted 60 (whole minutes); the job started 5 s before "now"
    assert time_left(30, now=105, start=100, end=160) == pytest.approx(30 - 5 - 3)
    # the allocation ends before start + walltime (a shorter grant): its end wins
    assert time_left(3600, now=0, start=0, end=600) == pytest.approx(600 - 300)
    assert time_left(None, now=0, start=None, end=None) is None
    assert time_left(None, now=0, start=0, end=1000) == pytest.approx(1000 - 100)


def test_yaml_resource_block_errors_carry_the_line(tmp_path):
    from shoal.patterns.ensemble.yamlfile import load_yaml, yaml_resource

    path = tmp_path / "wf.yaml"
    path.write_text("resource:\n  backend: slurm\n  core: 2\npipelines:\n"
                    "  - stages:\n      - tasks:\n          - {executable: /bin/true}\n")
    with pytest.raises(EnsembleError, match=r"wf.yaml:3: resource: unknown key 'core' "
                                            r"\(did you mean 'cores'\?\)"):
        load_yaml(str(path))
    with pytest.raises(EnsembleError, match=r"wf.yaml:3: resource: unknown key 'core'"):
        yaml_resource(str(path))
    path.write_text(path.read_text().replace("core: 2", "cores: 2\n  walltime: 2m"))
    assert len(load_yaml(str(path))) == 1
    res = yaml_resource(str(path))
    assert (res.cores, res.walltime) == (2, 120)
    (tmp_path / "none.yaml").write_text("pipelines: []\n")
    assert yaml_resource(str(tmp_path / "none.yaml")) is None


def test_cli_allocation_flags_need_slurm(tmp_path):
    (tmp_path / "wf.py").write_text("from shoal.ensemble import Pipeline, Stage, Task\n"
                                    "workflow = Pipeline([Stage([Task(executable='/bin/true')])])\n")
    out = subprocess.run([sys.executable, "-m", "shoal", "run", "wf.py", "--cores", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--cores describe a batch allocation: add --slurm" in out.stderr
    out = subprocess.run([sys.executable, "-m", "shoal", "run", "wf.py", "--slurm", "--dask",
                          "tcp://127.0.0.1:1"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "give one of them" in out.stderr


def test_run_refuses_pilot_and_resource_together():
    with pytest.raises(EnsembleError, match="pilot= or resource="):
        shoal.ensemble.run([], pilot=object(), resource={"cores": 1})


def test_unknown_provider_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown provider='lsf'"):
        shoal.Pilot(backend="dask", provider="lsf", cores=1, memory="1GB")


def test_a_silent_squeue_changes_nothing_and_is_said_once():
    """squeue not answering (slurmctld restarting): no job is taken for gone, and the
    warning is not repeated every poll."""
    import types

    from slurm_helpers import LogLines

    from shoal.backends.dask.jobs import JobWatch

    job = types.SimpleNamespace(job_id="3")
    cluster = types.SimpleNamespace(workers={"w0": job}, worker_spec={"w0": {}})
    answers = [{"3": Seen("RUNNING")}, None, None, None, {"3": Seen("RUNNING")}]
    watch = JobWatch(cluster, types.SimpleNamespace(scheduler_info=lambda: {"workers": {}}),
                     on_fail=lambda m: pytest.fail(m), poll_s=3600,
                     list_jobs=lambda: answers.pop(0))
    try:
        with LogLines("shoal.jobs") as log:
            for _ in range(5):
                watch.poll()
    finally:
        watch.stop()
    assert log.text.count("squeue does not answer") == 1
    assert watch.replaced == 0 and watch.policy.jobs["w0"].state is JobState.RUNNING
