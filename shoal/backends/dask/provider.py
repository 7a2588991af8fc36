"""Providers for the dask backend: build a dask-jobqueue cluster (the pilot job) for the user.

``Pilot(backend="dask", provider="slurm", cores=32, memory="64GB", walltime="2h",
queue="normal", jobs=4)`` becomes ``dask_jobqueue.SLURMCluster(**jobqueue_kwargs(...))``
scaled to ``jobs`` batch jobs (``jobs=(1, 8)``: an elastic pilot, between 1 and 8 jobs,
``elastic_bounds``; scaling.py moves the count).  Parsl's split: the *provider* acquires resources (here:
dask-jobqueue submits the jobs); the mapping from shoal's options to the provider's is a
pure function (``jobqueue_kwargs``), testable without a batch system; watching the jobs
once they are submitted (queue progress, replacing a job that ended, failing fast on a job
that can never start) is ``jobs.JobWatch``.

Mapping rules (the invariants a test pins):

* one meaning of a walltime everywhere in shoal: a number is **seconds**;
  a string is ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"SS"`` (seconds),
  ``"MM:SS"``, ``"HH:MM:SS"`` or ``"D-HH:MM:SS"``.  The batch system gets
  ``HH:MM:SS`` (SLURM rounds it up to whole minutes), so SLURM's own reading
  of a bare number (minutes) never applies;
* one dask worker process per job (``processes=1``): each job's host runs one
  node-local shoal runtime with all ``cores`` as shoal workers, the two-level
  design the backend is built for;
* with a ``walltime``, workers get ``--lifetime`` = walltime minus a drain
  margin (``min(drain_margin_s, walltime / 4)``, default cap 5 min) and a
  ``--lifetime-stagger`` of a quarter of the margin, so dask retires them
  gracefully before the batch system kills the job: running and queued tasks
  are re-run on other workers (the ones of jobs started later, or of the job
  ``JobWatch`` submits in place of the retired one), nothing is lost;
* ``job_extra=[...]`` are extra ``#SBATCH``/``#PBS`` lines
  (dask-jobqueue's ``job_extra_directives``); unknown options pass through to
  the jobqueue class unchanged.

Rejected: writing sbatch scripts ourselves (dask-jobqueue does it, tested on
real sites); passing the walltime string through unchanged (``"45"`` would be
45 minutes to SLURM and 45 seconds to ``shoal run --walltime``).
"""

from __future__ import annotations

import enum
import math
import os
import shutil
import subprocess
import tempfile

from ..._errors import BackendUnavailable, install_hint
from ..._walltime import walltime_seconds
from .elastic import Bounds, parse_jobs


class Provider(enum.Enum):
    SLURM = "slurm"
    PBS = "pbs"


_CLASSES = {Provider.SLURM: "SLURMCluster", Provider.PBS: "PBSCluster"}


def batch_time(seconds: float) -> str:
    """``HH:MM:SS`` (hours may exceed 24) for a batch system, rounded up to whole seconds."""
    s = math.ceil(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def drain_margin(total: float, cap: float = 300) -> float:
    """Seconds before the walltime at which workers retire: ``min(cap, total / 4)``."""
    return min(cap, total / 4)


def jobqueue_kwargs(*, cores: int, memory: str, walltime=None, queue: str | None = None,
                    account: str | None = None, drain_margin_s: float = 300,
                    job_extra: list[str] | tuple[str, ...] | None = None, **extra) -> dict:
    """The keyword arguments for ``dask_jobqueue.<Provider>Cluster`` (pure)."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be an int >= 1, got cores={cores!r}")
    kw = {"cores": cores, "memory": memory, "processes": 1}
    if queue is not None:
        kw["queue"] = queue
    if account is not None:
        kw["account"] = account
    if job_extra is not None:
        if isinstance(job_extra, str) or not all(isinstance(x, str) for x in job_extra):
            raise ValueError(f"job_extra must be a list of strings (batch directives such as "
                             f"'--exclusive'), got job_extra={job_extra!r}")
        kw["job_extra_directives"] = list(extra.pop("job_extra_directives", [])) + list(job_extra)
    args = list(extra.pop("worker_extra_args", []))
    if walltime is not None:
        total = walltime_seconds(walltime)
        kw["walltime"] = batch_time(total)
        margin = drain_margin(total, drain_margin_s)
        lifetime = max(1, math.floor(total - margin))
        stagger = max(1, math.floor(margin / 4))
        args += ["--lifetime", f"{lifetime}s", "--lifetime-stagger", f"{stagger}s"]
    if args:
        kw["worker_extra_args"] = args
    kw.update(extra)
    return kw


def check_submission(provider: Provider, cluster, timeout: float = 30.0) -> None:
    """Ask the batch system whether the job script could ever run; raise with its reason if not.

    SLURM: ``sbatch --test-only`` on dask-jobqueue's own job script (a bad partition, more
    cores or memory than any node has, a bad account: refused in well under a second with
    SLURM's message).  PBS has no dry run; nothing is checked there."""
    if provider is not Provider.SLURM:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="shoal-job-") as f:
        f.write(cluster.job_script())
        f.flush()
        check_script([f.name], timeout)


def check_script(args: list[str], timeout: float = 30.0) -> None:
    """``sbatch --test-only ARGS`` (the job script last): raise with SLURM's reason if the
    job could never run."""
    if shutil.which("sbatch") is None:
        raise BackendUnavailable("provider='slurm': sbatch is not on PATH (is this a SLURM login "
                                 "node? for a local one-node SLURM: sudo scripts/slurm-local up)")
    try:
        out = subprocess.run(["sbatch", "--test-only", *args], capture_output=True, text=True,
                             timeout=timeout, env=_env())
    except subprocess.TimeoutExpired:
        raise BackendUnavailable(f"provider='slurm': sbatch --test-only did not answer within "
                                 f"{timeout} s; is slurmctld up (sinfo)?") from None
    if out.returncode != 0:
        reason = " ".join(line.strip() for line in (out.stderr or out.stdout).splitlines()
                          if line.strip()) or f"exit status {out.returncode}"
        if "Unable to contact" in reason:
            raise BackendUnavailable(f"cannot reach the SLURM controller: {reason} (is slurmctld "
                                     "up? sinfo; for a local one: sudo scripts/slurm-local up)")
        raise BackendUnavailable(f"SLURM refuses the pilot job: {reason}")


def _env() -> dict:
    return {**os.environ, "LC_ALL": "C"}


def elastic_bounds(jobs, provider: Provider, options: dict) -> Bounds | None:
    """``jobs=(low, high)`` / ``"low:high"`` with low < high: the elastic pilot's ``Bounds``
    (``grow_after_s=``, ``idle_after_s=`` taken out of ``options``); a fixed count: None."""
    thresholds = {k: options.pop(k) for k in ("grow_after_s", "idle_after_s") if k in options}
    low, high = parse_jobs(jobs)
    if low == high:
        if thresholds:
            raise TypeError(f"{', '.join(f'{k}=' for k in thresholds)} apply to an elastic "
                            f"pilot: give jobs=(low, high), e.g. jobs=(1, {max(high, 2)})")
        return None
    if provider is not Provider.SLURM:
        raise ValueError(f"jobs=({low}, {high}): an elastic pilot needs provider='slurm' (its job "
                         f"watch reads squeue); give provider={provider.value!r} a fixed jobs=N")
    for key, value in thresholds.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ValueError(f"{key} must be a number of seconds >= 0, got {key}={value!r}")
    cores = options.get("cores", 1)
    slots = cores if isinstance(cores, int) and not isinstance(cores, bool) and cores >= 1 else 1
    return Bounds(low, high, slots_per_job=slots, **thresholds)


def make_cluster(provider: Provider, *, jobs: int = 1, elastic: bool = False, **options):
    """A dask-jobqueue cluster for ``provider``, checked, scaled to ``jobs`` jobs (caller closes
    it); ``elastic``: ``jobs`` is the elastic pilot's minimum, and may be 0."""
    try:
        import dask_jobqueue
    except ImportError:
        raise ImportError(
            f"provider={provider.value!r} needs dask-jobqueue: "
            f"{install_hint('slurm', 'dask-jobqueue')}") from None
    if "cores" not in options or "memory" not in options:
        raise TypeError(f"provider={provider.value!r} needs cores= and memory= "
                        "(per job, e.g. cores=32, memory='64GB')")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < (0 if elastic else 1):
        raise ValueError(f"jobs must be an int >= 1 or a range (low, high), got jobs={jobs!r}")
    cluster = getattr(dask_jobqueue, _CLASSES[provider])(**jobqueue_kwargs(**options))
    try:
        check_submission(provider, cluster)
        cluster.scale(jobs=jobs)
    except BaseException:
        cluster.close()
        raise
    return cluster
