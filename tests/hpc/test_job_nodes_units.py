"""The pure parts of a pilot over a SLURM job's nodes (shoal/backends/dask/job_nodes.py,
step_worker.py): which process spans the job, the job's nodes, the one srun step of workers,
the one sbatch job of N nodes, the per-node worker names.  The real thing runs on the test
bed: tests/multihost/test_multihost_allocation.py."""

from __future__ import annotations

import shlex
import shutil
import sys

import pytest

from shoal.backends.dask import job_nodes as jn
from shoal.backends.dask import step_worker as sw
from shoal.pilot import _backend_kind
from shoal.runtime.api import BackendKind

JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "h[1-3]", "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}


def test_job_nodes_from_the_environment():
    assert jn.job_nodes(JOB) == (jn.JobNode("h1", 2), jn.JobNode("h2", 2), jn.JobNode("h3", 2))
    assert jn.job_nodes({**JOB, "SLURM_JOB_CPUS_PER_NODE": "4,2(x2)"})[0].cores == 4
    assert jn.job_nodes({**JOB, "SLURM_JOB_CPUS_PER_NODE": "3"})[2].cores == 3  # one for all
    assert jn.job_nodes({}) == ()
    with pytest.raises(ValueError, match="names 3 nodes but SLURM_JOB_CPUS_PER_NODE gives 2"):
        jn.job_nodes({**JOB, "SLURM_JOB_CPUS_PER_NODE": "2,2"})


@pytest.mark.parametrize("env, spans", [
    (JOB, True),  # the batch step of a 3-node job (or an salloc shell)
    ({**JOB, "SLURM_STEP_ID": "0"}, False),  # inside a step: the workers themselves, srun
    ({**JOB, "SLURM_JOB_NODELIST": "h1"}, False),  # one node: the local backend
    ({**JOB, "SHOAL_ALL_NODES": "0"}, False),  # opted out
    ({**JOB, "SHOAL_ALL_NODES": "1"}, True),
    ({**JOB, "SLURM_JOB_NODELIST": "h[3-1]"}, False),  # unreadable: not spanned
    ({k: v for k, v in JOB.items() if k != "SLURM_JOB_ID"}, False),
    ({}, False),
])
def test_which_process_spans_the_job(env, spans):
    assert jn.spans_job(env) is spans


def test_the_pilot_picks_dask_for_a_source_and_local_when_asked(monkeypatch):
    for key in ("SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(key, raising=False)
    assert _backend_kind(None, {}) is BackendKind.LOCAL
    assert _backend_kind(None, {"provider": "slurm"}) is BackendKind.DASK
    assert _backend_kind(None, {"address": "tcp://x:1"}) is BackendKind.DASK
    monkeypatch.setattr("os.environ", dict(JOB))
    assert _backend_kind(None, {}) is BackendKind.DASK  # the batch step of a 3-node job
    assert _backend_kind("local", {}) is BackendKind.LOCAL  # explicit: this node only
    monkeypatch.setattr("os.environ", {**JOB, "SHOAL_ALL_NODES": "0"})
    assert _backend_kind(None, {}) is BackendKind.LOCAL


def test_one_srun_step_over_every_node():
    argv = jn.srun_argv("tcp://198.18.0.11:4321", 3, 2, "shoal-42", python="/py")
    assert argv[:8] == ["srun", "--overlap", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
                        "--cpus-per-task=2", "--job-name=shoal-42", "--kill-on-bad-exit=0"]
    assert argv[8:] == ["/py", "-m", jn.WORKER_MODULE, "tcp://198.18.0.11:4321",
                        "--name-prefix", "shoal-42", "--nthreads", "2",
                        "--death-timeout", str(jn.DEATH_TIMEOUT_S)]
    assert jn.srun_argv("tcp://a:1", 1, 1, "p")[8] == sys.executable
    with pytest.raises(ValueError, match="nodes >= 1 and cores >= 1"):
        jn.srun_argv("tcp://a:1", 0, 1, "p")


def test_one_batch_job_of_n_nodes_runs_that_step():
    step = jn.srun_argv("tcp://10.0.0.1:4321", 4, 8, "shoal-p", python="/py")
    argv = jn.sbatch_argv(step, 4, 8, name="shoal-p", walltime="2h", queue="normal",
                          account="proj", memory="16GB", job_extra=["--exclusive"],
                          output="/logs/shoal-pilot-%j.out")
    assert argv[:6] == ["sbatch", "--parsable", "--job-name=shoal-p", "--nodes=4",
                        "--ntasks-per-node=1", "--cpus-per-task=8"]
    assert "--time=02:00:00" in argv and "--partition=normal" in argv
    assert "--account=proj" in argv and "--mem=15258M" in argv  # 16 GB in MiB
    assert "--exclusive" in argv and "--output=/logs/shoal-pilot-%j.out" in argv
    assert argv[-2] == "--wrap" and shlex.split(argv[-1]) == step  # the script is the step
    bare = jn.sbatch_argv(step, 4, 8, name="n")
    assert not any(a.startswith(("--time", "--mem", "--partition")) for a in bare)
    assert "--time=00:00:45" in jn.sbatch_argv(step, 1, 1, name="n", walltime=45)  # seconds
    with pytest.raises(ValueError, match="memory must be a size"):
        jn.sbatch_argv(step, 1, 1, name="n", memory="lots")


def test_nodes_job_refuses_bad_counts_before_anything_starts():
    with pytest.raises(ValueError, match="nodes must be an int >= 1, got nodes=0"):
        jn.NodesJob(nodes=0, cores_per_node=1)
    with pytest.raises(ValueError, match="cores_per_node must be an int >= 1"):
        jn.NodesJob(nodes=2, cores_per_node=True)
    with pytest.raises(ValueError, match="job_extra must be a list of strings"):
        jn.NodesJob(nodes=2, cores_per_node=1, job_extra="--exclusive")


def test_each_node_names_its_worker():
    assert sw.worker_name("shoal-42", "h2") == "shoal-42-h2"
    args = sw.worker_args(["tcp://a:1", "--name-prefix", "shoal-42", "--nthreads", "2"],
                          {"SLURMD_NODENAME": "h3"})
    assert args == ["tcp://a:1", "--name", "shoal-42-h3", "--no-nanny", "--nworkers", "1",
                    "--no-dashboard", "--nthreads", "2"]
    assert sw.worker_args(["tcp://a:1", "--name-prefix", "p"], {})[2].startswith("p-")
    with pytest.raises(SystemExit, match="usage"):
        sw.worker_args(["tcp://a:1"], {})


def test_pilot_options_need_slurm_and_not_jobs_too():
    import shoal

    with pytest.raises(ValueError, match="need provider='slurm', got provider='pbs'"):
        shoal.Pilot(provider="pbs", nodes=2, cores_per_node=1)
    with pytest.raises(ValueError, match="not both"):
        shoal.Pilot(provider="slurm", nodes=2, cores_per_node=1, jobs=2)
    with pytest.raises(TypeError, match="allocation=True takes no provider options"):
        shoal.Pilot(backend="dask", allocation=True, cores=2)


def test_local_only_options_in_a_multi_node_job_say_how_to_stay_local(monkeypatch):
    import shoal

    monkeypatch.setattr("os.environ", dict(JOB))
    with pytest.raises(ValueError, match="backend='local' or SHOAL_ALL_NODES=0"):
        shoal.Pilot(initializer=print)


@pytest.mark.no_leak_check  # distributed's event-loop thread outlives the scheduler
def test_a_worker_step_whose_workers_never_come_fails_with_sruns_words(monkeypatch):
    """Outside a real job srun cannot even read its configuration: the pilot fails within its
    bound, quoting srun, and leaves no srun behind."""
    import psutil

    import shoal

    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    if not shutil.which("srun"):
        pytest.skip("srun is not installed (apt-get install slurm-client)")
    with pytest.raises(shoal.BackendUnavailable, match="0 of the 3 nodes' dask workers") as err:
        jn.JobStep(env=JOB, host="127.0.0.1", start_timeout=3)
    assert "srun says: srun: error" in str(err.value)
    assert not [p for p in psutil.Process().children(recursive=True) if p.name() == "srun"]


@pytest.mark.no_leak_check
def test_a_worker_step_without_srun_fails_at_once(monkeypatch, tmp_path):
    import shoal

    monkeypatch.setenv("PATH", str(tmp_path))  # no srun on it
    with pytest.raises(shoal.BackendUnavailable, match="cannot start the worker step.*srun"):
        jn.JobStep(env=JOB, host="127.0.0.1", start_timeout=3)
