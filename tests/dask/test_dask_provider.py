"""dask-jobqueue provider: the pure option mapping, and the error without dask-jobqueue.
(No batch system runs here, so no SLURMCluster is started.)"""

from __future__ import annotations

import importlib.util

import pytest

import shoal
from shoal.backends.dask.provider import Provider, jobqueue_kwargs, walltime_seconds


def test_walltime_seconds():
    """One meaning of a walltime in shoal: a bare number is seconds (as for
    ``shoal run --walltime``), never SLURM's minutes (docs/hpc.md)."""
    assert walltime_seconds("02:00:00") == 7200
    assert walltime_seconds("30:00") == 1800
    assert walltime_seconds("45") == 45
    assert walltime_seconds(45) == 45
    assert walltime_seconds("30m") == 1800
    assert walltime_seconds("1-00:00:10") == 86410
    for bad in ("1:2:3:4", "soon", "0", -5, "1-x", float("nan")):
        with pytest.raises(ValueError, match="walltime"):
            walltime_seconds(bad)


def test_jobqueue_kwargs_mapping():
    kw = jobqueue_kwargs(cores=32, memory="64GB", walltime="02:00:00", queue="normal",
                         account="proj", job_extra_directives=["--exclusive"])
    assert kw["cores"] == 32 and kw["memory"] == "64GB" and kw["processes"] == 1
    assert kw["queue"] == "normal" and kw["account"] == "proj" and kw["walltime"] == "02:00:00"
    assert jobqueue_kwargs(cores=1, memory="1GB", walltime=45)["walltime"] == "00:00:45"
    assert jobqueue_kwargs(cores=1, memory="1GB", walltime="36h")["walltime"] == "36:00:00"
    extra = jobqueue_kwargs(cores=1, memory="1GB", job_extra=["--exclusive"])
    assert extra["job_extra_directives"] == ["--exclusive"]
    with pytest.raises(ValueError, match="job_extra"):
        jobqueue_kwargs(cores=1, memory="1GB", job_extra="--exclusive")
    assert kw["job_extra_directives"] == ["--exclusive"]
    args = kw["worker_extra_args"]
    lifetime = int(args[args.index("--lifetime") + 1].rstrip("s"))
    assert lifetime == 7200 - 300  # drains 5 minutes before the walltime
    assert "--lifetime-stagger" in args


def test_jobqueue_kwargs_short_walltime_and_no_walltime():
    kw = jobqueue_kwargs(cores=4, memory="8GB", walltime="00:20:00")
    args = kw["worker_extra_args"]
    assert int(args[args.index("--lifetime") + 1].rstrip("s")) == 1200 - 300
    assert "worker_extra_args" not in jobqueue_kwargs(cores=4, memory="8GB")
    with pytest.raises(ValueError):
        jobqueue_kwargs(cores=0, memory="8GB")


@pytest.mark.skipif(importlib.util.find_spec("dask_jobqueue") is not None,
                    reason="dask-jobqueue is installed")
@pytest.mark.parametrize("provider", [p.value for p in Provider])
def test_missing_dask_jobqueue_is_a_clear_error(provider):
    with pytest.raises(ImportError, match="pip install dask-jobqueue"):
        shoal.Pilot(backend="dask", provider=provider, cores=4, memory="8GB", walltime="01:00:00")


def test_cpu_slices_split_each_host():
    from shoal.backends.dask.node import cpu_slices

    probes = {"tcp://a:2": ("tcp://a", (0, 1, 2, 3)), "tcp://a:1": ("tcp://a", (0, 1, 2, 3)),
              "tcp://b:1": ("tcp://b", (0, 1))}
    assert cpu_slices(probes) == {"tcp://a:1": (0, 1), "tcp://a:2": (2, 3), "tcp://b:1": (0, 1)}
    crowded = {f"tcp://a:{i}": ("tcp://a", (0, 1)) for i in range(3)}
    assert all(len(s) == 1 for s in cpu_slices(crowded).values())
    assert cpu_slices({}) == {}
