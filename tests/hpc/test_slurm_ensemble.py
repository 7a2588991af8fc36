"""Ensembles and SLURM allocations, against a real SLURM (marker ``slurm``).

* ``shoal run --slurm --walltime 30``: 24 four-second tasks on 2 cores need ~48 s, so the
  first allocation is cut short (exit 3, the journal resumable) and ``--resume`` in new
  allocations finishes the rest: 24 distinct tasks done, each exactly once.
* Inside an allocation: examples/slurm_ensemble.sbatch submitted with sbatch; shoal sizes
  itself from SLURM's environment (1 CPU of a 2-CPU host) and drains before the job ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from slurm_helpers import ROOT, queue, shoal_cmd, slurm  # noqa: F401 (slurm: a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm"), pytest.mark.timeout(400)]

WORKFLOW = """
import os
from shoal.ensemble import Pipeline, Stage, Task

DONE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "done.txt")
# each task appends one line when it has finished its 4 seconds: killed ones append nothing
workflow = Pipeline([Stage([
    Task(executable="/bin/sh", name=f"t{i}",
         arguments=["-c", f"sleep 4; echo t{i} $SLURM_JOB_ID >> {DONE}"])
    for i in range(24)], name="s")], name="p")
"""


def test_an_ensemble_cut_short_by_its_walltime_resumes_in_a_new_allocation(tmp_path):
    (tmp_path / "wf.py").write_text(WORKFLOW)
    cmd = shoal_cmd("run", "wf.py", "--slurm", "--cores", "2", "--walltime", "30",
                    "--journal", "j.db")
    runs = []
    for attempt in range(5):
        out = subprocess.run(cmd + (["--resume"] if attempt else []), cwd=tmp_path,
                             capture_output=True, text=True, timeout=150)
        runs.append(out)
        assert out.returncode in (0, 3), out.stdout + out.stderr
        if out.returncode == 0:
            break
    assert runs[0].returncode == 3, "the first allocation must be cut short"
    hint = runs[0].stdout.rsplit("finish with:", 1)[-1]
    for part in ("--slurm", "--cores 2", "--walltime 30", "--resume", "--journal j.db"):
        assert part in hint, hint
    assert runs[-1].returncode == 0, [r.stdout for r in runs]
    lines = (tmp_path / "done.txt").read_text().split("\n")
    done = [line.split() for line in lines if line]
    names = [name for name, _ in done]
    assert sorted(names) == sorted(f"t{i}" for i in range(24)), "each task done exactly once"
    jobs = {job for _, job in done}
    assert 2 <= len(jobs) <= len(runs), (jobs, len(runs))  # one allocation per run
    assert not jobs & set(queue())
    status = subprocess.run(shoal_cmd("status", "j.db"), cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert " 24 " in status.stdout, status.stdout


def test_inside_an_allocation_shoal_sizes_itself_from_slurm(tmp_path):
    """The example sbatch script, submitted for 1 CPU on a host with more: `shoal info` and
    `shoal run` see the job's CPU, the run knows when the allocation ends, and a
    shoal.Pilot() started in a job has one worker."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs a host with 2+ CPUs to tell the job's CPUs from the host's")
    (tmp_path / "wf.yaml").write_text(textwrap.dedent("""
        pipelines:
          - stages:
              - tasks:
                  - {executable: /bin/sh, arguments: ["-c", "nproc; echo $SLURM_JOB_ID"]}
                  - {executable: /bin/sh, arguments: ["-c", "nproc; echo $SLURM_JOB_ID"]}
    """))
    env = {**os.environ, "SHOAL_PYTHON": sys.executable}
    script = os.path.join(ROOT, "examples", "slurm_ensemble.sbatch")
    subprocess.run(["sbatch", "--wait", "--cpus-per-task=1", "--time=5", "-o", "job.out",
                    script, "wf.yaml"], cwd=tmp_path, env=env, check=True, timeout=180,
                   capture_output=True)
    out = (tmp_path / "job.out").read_text()
    assert "limited by" in out and "slurm job" in out and "batch job" in out, out
    assert "draining before it ends" in out, out
    assert "ensemble run ok: 2 done" in out, out
    code = ("import shoal; a = shoal.allocation(); p = shoal.Pilot(); "
            "print(a.job_id, a.cpus, p.workers, len(p.topology.usable_cpus)); p.close()")
    got = subprocess.run(["sbatch", "--wait", "--cpus-per-task=1", "--time=5", "-o", "pilot.out",
                          "--wrap", f"{sys.executable} -c '{code}'"], cwd=tmp_path, env=env,
                         check=True, timeout=180, capture_output=True)
    assert got.returncode == 0
    job_id, cpus, workers, usable = (tmp_path / "pilot.out").read_text().split()[-4:]
    assert (cpus, workers, usable) == ("1", "1", "1")
