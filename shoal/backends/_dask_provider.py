"""Providers for the dask backend: build a dask-jobqueue cluster (the pilot job) for the user.

``Pilot(backend="dask", provider="slurm", cores=32, memory="64GB", walltime="02:00:00",
queue="normal", jobs=4)`` becomes ``dask_jobqueue.SLURMCluster(**jobqueue_kwargs(...))``
scaled to ``jobs`` batch jobs.  Parsl's split: the *provider* acquires resources (here:
dask-jobqueue submits the jobs); the mapping from shoal's options to the provider's is a
pure function (``jobqueue_kwargs``), testable without a batch system.

Mapping rules (the invariants a test pins):

* one dask worker process per job (``processes=1``): each job's host runs one
  node-local shoal runtime with all ``cores`` as shoal workers, the two-level
  design the backend is built for;
* with a ``walltime``, workers get ``--lifetime`` = walltime minus a drain
  margin (default 5 min, at most a quarter of the walltime) and a small
  ``--lifetime-stagger``, so dask retires them gracefully before the batch
  system kills the job: running and queued tasks are re-run on other workers
  (the ones of jobs started later), nothing is lost;
* unknown options pass through to the jobqueue class unchanged.

Rejected: writing sbatch scripts ourselves (dask-jobqueue does it, tested on
real sites).
"""

from __future__ import annotations

import enum


class Provider(enum.Enum):
    SLURM = "slurm"
    PBS = "pbs"


_CLASSES = {Provider.SLURM: "SLURMCluster", Provider.PBS: "PBSCluster"}


def walltime_seconds(walltime: str) -> int:
    """Seconds in a batch walltime: ``"MM"``, ``"MM:SS"``, ``"HH:MM:SS"`` or ``"D-HH:MM:SS"``."""
    days = 0
    text = str(walltime).strip()
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts):
        raise ValueError(f"walltime must look like HH:MM:SS, got walltime={walltime!r}")
    if len(parts) == 1:
        seconds = parts[0] * 60
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return days * 86400 + seconds


def jobqueue_kwargs(*, cores: int, memory: str, walltime: str | None = None,
                    queue: str | None = None, account: str | None = None,
                    drain_margin_s: int = 300, **extra) -> dict:
    """The keyword arguments for ``dask_jobqueue.<Provider>Cluster`` (pure)."""
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be an int >= 1, got cores={cores!r}")
    kw = {"cores": cores, "memory": memory, "processes": 1}
    if queue is not None:
        kw["queue"] = queue
    if account is not None:
        kw["account"] = account
    args = list(extra.pop("worker_extra_args", []))
    if walltime is not None:
        kw["walltime"] = walltime
        total = walltime_seconds(walltime)
        margin = min(drain_margin_s, total // 4)
        lifetime = max(60, total - margin)
        stagger = max(1, min(120, margin // 2))
        args += ["--lifetime", f"{lifetime}s", "--lifetime-stagger", f"{stagger}s"]
    if args:
        kw["worker_extra_args"] = args
    kw.update(extra)
    return kw


def make_cluster(provider: Provider, *, jobs: int = 1, **options):
    """A dask-jobqueue cluster for ``provider`` scaled to ``jobs`` jobs (caller closes it)."""
    try:
        import dask_jobqueue
    except ImportError:
        raise ImportError(
            f"provider={provider.value!r} needs dask-jobqueue: pip install dask-jobqueue") from None
    if "cores" not in options or "memory" not in options:
        raise TypeError(f"provider={provider.value!r} needs cores= and memory= "
                        "(per job, e.g. cores=32, memory='64GB')")
    cluster = getattr(dask_jobqueue, _CLASSES[provider])(**jobqueue_kwargs(**options))
    cluster.scale(jobs=jobs)
    return cluster
