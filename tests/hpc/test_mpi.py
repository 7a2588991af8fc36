"""MPI tasks with real Open MPI and mpi4py (marker ``mpi``; scripts/install-mpi installs them,
root only; .ci/run runs it), and with srun on a real SLURM (markers ``mpi`` and ``slurm``).

The program is tests/hpc/mpi_probe.py: every rank writes its rank, the world size, its host,
its CPU affinity and an ``MPI.Allreduce`` sum of 1..size.  Checked: the right ranks and sizes,
no core given to two ranks, the allreduce correct, a rank's ``sys.exit(3)`` failing the task
with that rank's stderr, a retry placing every rank again, EnTK's MPI idiom through
``shoal.entk``, and the walltime drain never starting an MPI task whose timeout does not fit.
Several hosts: tests/hpc/test_multihost.py (marker ``multihost``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from shoal.ensemble import Pipeline, Stage, Task, TaskState, run

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "mpi_probe.py")
HINT = ("Open MPI and mpi4py are not installed: run `sudo scripts/install-mpi` (apt-get install "
        "openmpi-bin libopenmpi-dev; pip install mpi4py), then `python -m pytest -m mpi tests/hpc`")

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]


def needs_mpi():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip(HINT)
    if shutil.which("mpirun") is None:
        pytest.skip(HINT)


@pytest.fixture(autouse=True)
def _mpi():
    needs_mpi()


def ranks_of(out) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def probe(out, *extra, **kw) -> Task:
    out.mkdir(exist_ok=True)
    return Task(executable=sys.executable, arguments=[PROBE, str(out), *extra], **kw)


def test_two_ranks_on_mpirun_allreduce_on_their_own_cores(tmp_path):
    out = tmp_path / "out"
    report = run([Pipeline([Stage([probe(out, ranks=2, name="mpi")])])],
                 journal=str(tmp_path / "j.db"), launcher="mpirun", cores=2)
    assert report.ok, report
    ranks = ranks_of(out)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == 3 for r in ranks)
    cpus = [c for r in ranks for c in r["cpus"]]
    assert all(len(r["cpus"]) == 1 for r in ranks) and len(set(cpus)) == 2  # one core each, disjoint
    assert all(r["omp"] == "1" for r in ranks)
    sandbox = tmp_path / "j.sandbox" / "p0" / "s0" / "mpi"
    assert "rank 1 of 2" in (sandbox / "stderr.rank1").read_text()


def test_a_rank_that_exits_3_fails_the_task_with_every_ranks_stderr(tmp_path):
    out = tmp_path / "out"
    report = run([Pipeline([Stage([probe(out, "--fail-rank", "1", "--code", "3", ranks=2, name="mpi")])])],
                 journal=str(tmp_path / "j.db"), launcher="mpirun", cores=2)
    assert not report.ok and report.failed == 1
    (failure,) = report.failures
    assert failure["exit_code"] == 3, failure
    tail = failure["stderr_tail"]
    assert "[rank 1] rank 1: failing on purpose with code 3" in tail
    assert "[rank 0] rank 0 of 2" in tail  # the other rank's tail is there too


def test_a_retry_places_every_rank_again(tmp_path):
    out = tmp_path / "out"
    once = tmp_path / "failed-once"
    t = probe(out, "--fail-rank", "0", "--fail-once", str(once), ranks=2, name="mpi", retries=1)
    report = run([Pipeline([Stage([t])])], journal=str(tmp_path / "j.db"), launcher="mpirun", cores=2)
    assert report.ok and once.exists(), report
    ranks = ranks_of(out)  # written again by the second attempt's two ranks
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["sum"] == 3 for r in ranks)
    assert len({c for r in ranks for c in r["cpus"]}) == 2


def test_mpi_tasks_and_plain_tasks_never_share_a_core(tmp_path):
    """Two 1-rank MPI tasks and plain tasks on 2 cores: at every moment the cores in use are
    disjoint (each writes its affinity; the engine's grants are checked by the journal's order)."""
    out = tmp_path / "out"
    tasks = [probe(tmp_path / f"o{i}", ranks=1, name=f"m{i}") for i in range(2)]
    tasks += [Task(executable="/bin/sh", name=f"p{i}",
                   arguments=["-c", f"grep Cpus_allowed_list /proc/self/status >> {out}.p{i}"])
              for i in range(2)]
    report = run([Pipeline([Stage(tasks)])], journal=str(tmp_path / "j.db"), launcher="mpirun", cores=2)
    assert report.ok, report
    for i in range(2):
        (r,) = ranks_of(tmp_path / f"o{i}")
        assert r["size"] == 1 and len(r["cpus"]) == 1


def test_the_entk_mpi_idiom_through_shoal_entk(tmp_path, monkeypatch):
    from shoal.entk import AppManager
    from shoal.entk import Pipeline as EPipeline
    from shoal.entk import Stage as EStage
    from shoal.entk import Task as ETask

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    t = ETask()
    t.name = "sim"
    t.executable = sys.executable
    t.arguments = [PROBE, str(out)]
    t.cpu_reqs = {"cpu_processes": 2, "cpu_process_type": "MPI", "cpu_threads": 1,
                  "cpu_thread_type": None}
    s = EStage()
    s.add_tasks(t)
    p = EPipeline()
    p.add_stages(s)
    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 10, "cpus": 2})
    appman.workflow = [p]
    appman.run()
    ranks = ranks_of(out)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["sum"] == 3 for r in ranks)


def test_the_walltime_drain_never_starts_an_mpi_task_that_cannot_finish(tmp_path):
    """A 60 s-timeout MPI task behind a quick one, in a 20 s walltime: never started, PENDING."""
    out = tmp_path / "out"
    quick = Task(executable="/bin/true", name="quick")
    long = probe(out, ranks=2, name="mpi", timeout=60)
    report = run([Pipeline([Stage([quick, long])])], journal=str(tmp_path / "j.db"),
                 launcher="mpirun", cores=2, walltime=20)
    assert report.counts[TaskState.DONE] == 1 and report.drained
    assert "p0.s0.mpi is expected to take 60.0s" in report.drain_reason
    assert ranks_of(out) == []  # no rank ever ran: the journal keeps it PENDING for a resume


# -- srun on a real SLURM ---------------------------------------------------------------------

JOB = """
import json, sys
sys.path.insert(0, {here!r})
from shoal.ensemble import Pipeline, Stage, Task, run
t = Task(executable=sys.executable, arguments=[{probe!r}, {out!r}], ranks=2, name="mpi")
bad = Task(executable=sys.executable, arguments=[{probe!r}, {out!r} + "-bad", "--fail-rank", "1"],
           ranks=2, name="bad", after=["p0.s0.mpi"])
report = run([Pipeline([Stage([t, bad])])], journal={journal!r})
print(json.dumps({{"done": report.done, "failures": report.failures}}, default=str))
"""


@pytest.mark.slurm
def test_two_ranks_with_srun_inside_a_slurm_job(tmp_path):
    from slurm_helpers import ROOT, needs_slurm, queue

    needs_slurm()
    before = set(queue())
    out = tmp_path / "out"
    (tmp_path / "out-bad").mkdir()
    out.mkdir()
    script = tmp_path / "job.py"
    script.write_text(JOB.format(here=HERE, probe=PROBE, out=str(out), journal=str(tmp_path / "j.db")))
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(["sbatch", "--wait", "--ntasks=1", "--cpus-per-task=2", "--time=3",
                           f"--output={tmp_path}/job.out", "--wrap", f"{sys.executable} {script}"],
                          env=env, capture_output=True, text=True, timeout=240)
    text = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + text
    result = json.loads(text.strip().splitlines()[-1])
    assert result["done"] == 1, text
    (failure,) = result["failures"]
    assert "[rank 1] rank 1: failing on purpose" in failure["stderr_tail"]
    ranks = ranks_of(out)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["sum"] == 3 for r in ranks)
    assert len({c for r in ranks for c in r["cpus"]}) == 2
    assert set(queue()) <= before


def test_mpi_probe_runs_under_mpirun_directly(tmp_path):
    """The probe itself, as a reference: plain mpirun, no shoal (a failure here is the MPI
    installation's, not shoal's)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(["mpirun", *root, "-np", "2", "--oversubscribe", sys.executable, PROBE,
                           str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, textwrap.shorten(done.stderr, 2000)
    assert [r["sum"] for r in ranks_of(out)] == [3, 3]


def test_a_yaml_mpi_task_through_shoal_run_with_launcher(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "wf.yaml").write_text(textwrap.dedent(f"""\
        pipelines:
          - stages:
              - tasks:
                  - name: mpi
                    executable: {sys.executable}
                    arguments: [{PROBE}, {out}]
                    ranks: 2
                    cores_per_rank: 1
        """))
    done = subprocess.run([sys.executable, "-m", "shoal", "run", "wf.yaml", "--launcher", "mpirun"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["sum"] for r in ranks_of(out)] == [3, 3]


def test_an_mpi_task_killed_at_its_timeout_leaves_no_rank_running(tmp_path):
    """mpirun's ranks run in process groups of their own: killing the launcher's group alone
    left both ranks of a timed-out task sleeping (this test failed so before Launcher.kill sent
    mpirun SIGTERM and then killed what was left of the task's session)."""
    mark = f"shoal-mpi-timeout-{os.getpid()}"
    t = Task(executable=sys.executable, arguments=["-c", f"import time; time.sleep(120)  # {mark}"],
             ranks=2, name="slow", timeout=3)
    report = run([Pipeline([Stage([t])])], journal=str(tmp_path / "j.db"), launcher="mpirun", cores=2)
    (failure,) = report.failures
    assert failure["reason"].startswith("killed after timeout=3")
    deadline = time.monotonic() + 15  # the launcher's grace (3 s) and the kill, under load
    while True:
        left = subprocess.run(["pgrep", "-f", mark], capture_output=True, text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"ranks still running after the task was killed: {left}"
