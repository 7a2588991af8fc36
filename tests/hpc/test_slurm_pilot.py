"""Pilots as batch jobs, against a real SLURM (``sudo scripts/slurm-local up``; marker ``slurm``).

What runs: ``shoal.Pilot(backend="dask", provider="slurm", ...)`` submits real jobs
through dask-jobqueue; dask workers start inside them under slurmstepd; tasks see
SLURM's environment.  Sized for a shared 2-core machine: one 1-core job at a time."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import tasks_hpc as th
from slurm_helpers import LogLines, queue, slurm, tasks_importable, wait_for  # noqa: F401 (fixtures)

import shoal
from shoal import BackendUnavailable

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm", "tasks_importable"), pytest.mark.fd_slack(64),
              pytest.mark.timeout(180)]


def pilot(tmp_path, **kw):
    opts = dict(backend="dask", provider="slurm", cores=1, memory="1GB", walltime="10m",
                log_directory=str(tmp_path), scheduler_options={"dashboard_address": ":0"})
    opts.update(kw)
    return shoal.Pilot(**opts)


def test_a_pilot_job_runs_100_tasks_in_one_allocation(tmp_path):
    """All 100 tasks run inside the one batch job (same SLURM_JOB_ID); the node runtime is
    sized to the job's 1 CPU, not the host's; close() leaves nothing in squeue."""
    with pilot(tmp_path) as p:
        first = p.submit(th.where, -1).result(120)
        seen = list(p.map(th.where, range(100)))
        # the job watch polls squeue every 2 s: on an idle machine the map can end first
        deadline = time.monotonic() + 30
        while not (jobs := p.stats()["driver"]["jobs"]) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert [x for x, *_ in seen] == list(range(100))
    ids = {job for _, job, _, _ in seen} | {first[1]}
    assert len(ids) == 1 and None not in ids, ids
    (job_id,) = ids
    assert {cpus for _, _, cpus, _ in seen} == {"1"}
    assert {n for *_, n in seen} == {1}, "the node runtime must use the job's 1 CPU"
    assert [j["job_id"] for j in jobs] == [job_id]
    assert job_id not in queue()  # close() returned after squeue let go


def test_scancel_mid_map_a_new_job_finishes_the_map(tmp_path):
    """SLURM kills the pilot job (scancel) while a map runs: the watch submits a new job,
    the map completes, every result once and in order, and no job is left behind."""
    n = 40
    with pilot(tmp_path) as p:
        it = p.map(th.where, range(n), [0.25] * n, chunksize=1)
        got = [next(it) for _ in range(4)]
        victim = got[0][1]
        subprocess.run(["scancel", victim], check=True, timeout=30)
        got += list(it)
        stats = p.stats()["driver"]
    assert [x for x, *_ in got] == list(range(n))
    jobs = {j for _, j, _, _ in got}
    assert victim in jobs and len(jobs) >= 2, jobs  # the rest ran in the replacement
    assert stats["jobs_replaced"] >= 1
    assert not (jobs & set(queue()))


@pytest.mark.parametrize("options, reason", [
    ({"cores": 64}, "Requested node configuration is not available"),
    ({"queue": "no-such-partition"}, "nvalid partition"),
    ({"memory": "100000GB"}, "Requested node configuration is not available"),
])
def test_an_unsatisfiable_request_fails_at_once_with_slurms_reason(tmp_path, options, reason):
    with pytest.raises(BackendUnavailable, match=reason) as info:
        pilot(tmp_path, **options)
    assert "SLURM refuses the pilot job" in str(info.value)


def test_a_job_that_can_never_start_fails_the_tasks(tmp_path):
    """A job SLURM accepts but will never start (its dependency failed): the waiting task
    fails with SLURM's pending reason instead of hanging."""
    dep = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "false"],
                         capture_output=True, text=True, check=True).stdout.strip()
    wait_for(lambda: dep not in queue(), 60, f"job {dep} to fail")
    with pilot(tmp_path, job_extra=[f"--dependency=afterok:{dep}"]) as p:
        fut = p.submit(th.where, 1)
        with pytest.raises(BackendUnavailable, match="DependencyNeverSatisfied"):
            fut.result(60)
        with pytest.raises(BackendUnavailable, match="DependencyNeverSatisfied"):
            p.submit(th.where, 2)


def test_a_pending_job_reports_its_state_and_leaves_the_queue_on_close(tmp_path):
    """A job held in the queue (--begin in an hour): the pilot warns with SLURM's reason
    instead of hanging silently, stats() shows it, and close() cancels it."""
    with LogLines("shoal.jobs") as log:
        with pilot(tmp_path, job_extra=["--begin=now+1hour"], queue_warn_s=1) as p:
            fut = p.submit(th.where, 1)
            wait_for(lambda: "still PENDING" in log.text, 60, "the pending warning")
            (job,) = p.stats()["driver"]["jobs"]
            assert job["state"] == "PENDING" and job["reason"] == "BeginTime"
            assert not fut.done()
            p.close(cancel_pending=True)
    assert "BeginTime" in log.text
    assert job["job_id"] not in queue()


def test_a_pilot_outlives_the_walltime_of_its_jobs(tmp_path):
    """walltime=20 s: each job's dask worker retires at its --lifetime (15 s), before SLURM
    would kill it; the watch submits the next job, and a ~30 s map finishes across several
    allocations with every result once and in order."""
    n = 60
    with pilot(tmp_path, walltime=20) as p:
        got = list(p.map(th.where, range(n), [0.5] * n, chunksize=1))
        replaced = p.stats()["driver"]["jobs_replaced"]
    assert [x for x, *_ in got] == list(range(n))
    jobs = {j for _, j, _, _ in got}
    assert len(jobs) >= 2 and replaced >= 1, (jobs, replaced)
    assert not (jobs & set(queue()))


def test_a_sigkilled_driver_leaves_no_running_job_behind(tmp_path):
    """Nobody calls close(): the driver is SIGKILLed with its job running.  The job's dask
    worker loses its scheduler and exits, so the job leaves the queue by itself (bounded
    by dask-jobqueue's --death-timeout of 60 s)."""
    import sys

    script = tmp_path / "driver.py"
    script.write_text(
        "import os, sys, time, shoal\n"
        f"p = shoal.Pilot(backend='dask', provider='slurm', cores=1, memory='1GB', "
        f"walltime='10m', log_directory={str(tmp_path)!r})\n"
        "job = p.submit(lambda: os.environ.get('SLURM_JOB_ID')).result(120)\n"
        "print(job, flush=True)\n"
        "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        job = proc.stdout.readline().strip()
        assert job in queue()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    wait_for(lambda: job not in queue(), 90, f"job {job} to leave the queue")


def test_a_node_failure_mid_map_loses_no_task(tmp_path):
    """The node goes DOWN under a running pilot job (scontrol, as an administrator or the
    health check would): SLURM kills and requeues the job; its tasks are re-run once a
    job runs again (the requeued one or the watch's replacement), every result once."""
    n = 30
    try:
        with pilot(tmp_path) as p:
            it = p.map(th.where, range(n), [0.3] * n, chunksize=1)
            got = [next(it) for _ in range(3)]
            subprocess.run(["scontrol", "update", "nodename=" + _node(), "state=down",
                            "reason=shoal-test"], check=True, timeout=30)
            wait_for(lambda: any(j["state"] != "RUNNING" for j in p.stats()["driver"]["jobs"]),
                     60, "the job to leave RUNNING")
            _resume()
            got += list(it)
    finally:
        _resume()
    assert [x for x, *_ in got] == list(range(n))


def _node() -> str:
    return subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                          check=True, timeout=30).stdout.split()[0]


def _resume() -> None:
    """Back to service (with ReturnToService=2 slurmd's next registration does it too; an
    'Invalid node state' answer means it is up already)."""
    subprocess.run(["scontrol", "update", "nodename=" + _node(), "state=resume"],
                   capture_output=True, timeout=30)
    wait_for(lambda: subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True,
                                    text=True, timeout=30).stdout.split()[0] in
             ("idle", "mixed", "allocated"), 60, "the node to return")


def test_an_unreachable_controller_is_a_clear_error_not_a_hang(tmp_path):
    """slurmctld is down (stopped by its pid): the pilot's constructor fails with
    BackendUnavailable naming the controller after sbatch's own retries, then the
    controller is started again with scripts/slurm-local."""
    from slurm_helpers import ROOT

    pidfile = "/var/lib/shoal-slurm-local/run/slurmctld.pid"
    if os.geteuid() != 0 or not os.path.exists(pidfile):
        pytest.skip("needs the slurmctld that scripts/slurm-local started (root)")
    with open(pidfile) as f:
        os.kill(int(f.read()), 15)
    try:
        with pytest.raises(BackendUnavailable, match="cannot reach the SLURM controller"):
            pilot(tmp_path)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "slurm-local"), "up"], check=True,
                       capture_output=True, timeout=120)
