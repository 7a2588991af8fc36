"""dask worker resources (issue 14): ``pilot.options(resources={"GPU": 1})`` on a real
command-line cluster, `dask scheduler` + one `dask worker --resources GPU=2` + one worker
without GPUs.  Tasks that ask for a GPU run only on the worker that has them (submit, map,
ensemble functions and executables with ``gpus=``), never more at once than it has; a
request no worker can meet is refused at submit with a message naming what the workers
offer, never left waiting in dask's queue."""

from __future__ import annotations

import os
import time

import pytest
from dask_cluster import CliCluster, shoal_workers, wait_until

import shoal
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.runtime import api

pytestmark = pytest.mark.fd_slack(8)


def dask_worker_pid() -> int:
    """The dask worker process above the shoal worker running this task."""
    return os.getppid()


def interval(seconds: float) -> tuple[int, float, float]:
    start = time.time()
    time.sleep(seconds)
    return os.getppid(), start, time.time()


@pytest.fixture(scope="module")
def gpu_cluster():
    cluster = CliCluster(2, worker_args=("--resources", lambda i: "GPU=2" if i == 0 else "CPU=1"))
    from distributed import Client

    with Client(cluster.address, set_as_default=False) as client:
        pids = client.run(os.getpid)
        info = client.scheduler_info(n_workers=-1)["workers"]
    gpu = {pid for addr, pid in pids.items() if info[addr]["resources"].get("GPU")}
    assert len(gpu) == 1 and len(pids) == 2
    cluster.gpu_pid = gpu.pop()
    cluster.other_pid = (set(pids.values()) - {cluster.gpu_pid}).pop()
    yield cluster
    cluster.close()
    assert not shoal_workers(), "shoal workers outlived their cluster"


@pytest.fixture
def pilot(gpu_cluster):
    with shoal.Pilot(backend="dask", address=gpu_cluster.address, workers=2) as p:
        assert isinstance(p.shared, api.SharedFactory)
        assert isinstance(p._backend, api.Backend)  # the live dask backend meets the protocol
        yield p
    wait_until(lambda: not shoal_workers(), 20, "the pilot's shoal workers to exit")


def test_gpu_tasks_run_only_on_the_gpu_worker(pilot, gpu_cluster):
    gpu = pilot.options(resources={"GPU": 1})
    futs = [gpu.submit(dask_worker_pid) for _ in range(12)]
    assert {f.result(60) for f in futs} == {gpu_cluster.gpu_pid}
    assert set(gpu.map(lambda _: os.getppid(), range(200))) == {gpu_cluster.gpu_pid}
    # without resources both machines take work (the other one is not excluded)
    anywhere = set(pilot.map(lambda _: (time.sleep(0.01), os.getppid())[1], range(400)))
    assert anywhere <= {gpu_cluster.gpu_pid, gpu_cluster.other_pid}


def test_never_more_gpu_tasks_at_once_than_gpus(pilot, gpu_cluster):
    """GPU=2 on the worker: tasks holding 2 each run one at a time there, although the
    node has 2 shoal workers and seceded tasks free dask's thread."""
    futs = [pilot.options(resources={"GPU": 2}).submit(interval, 0.3) for _ in range(3)]
    spans = sorted(f.result(60)[1:] for f in futs)
    assert all(f.result()[0] == gpu_cluster.gpu_pid for f in futs)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end - 0.01, f"two GPU=2 tasks overlapped: {spans}"


@pytest.mark.parametrize("resources", [{"GPU": 3}, {"TPU": 1}, {"GPU": 1, "TPU": 1}])
def test_unsatisfiable_request_is_refused_at_submit(pilot, resources):
    opts = pilot.options(resources=resources)
    with pytest.raises(ValueError, match="no dask worker of this cluster offers") as info:
        opts.submit(dask_worker_pid)
    assert "GPU" in str(info.value) and "dask worker --resources" in str(info.value)
    with pytest.raises(ValueError, match="no dask worker of this cluster offers"):
        opts.map(abs, range(10))
    assert pilot.submit(abs, -3).result(60) == 3  # nothing left waiting, the pilot goes on
    assert pilot.stats()["driver"]["outstanding"] == 0


def test_ensemble_gpus_map_to_dask_resources(pilot, gpu_cluster, tmp_path):
    tasks = [Task(function=dask_worker_pid, gpus=1, name=f"f{i}") for i in range(3)]
    tasks += [Task(executable="/bin/sh", gpus=1, name=f"x{i}",
                   arguments=["-c", "awk '{print $4}' /proc/$PPID/stat > ppid"]) for i in range(2)]
    tasks += [Task(function=dask_worker_pid, name="cpu")]
    report = run(Pipeline([Stage(tasks, name="s")], name="p"), pilot=pilot,
                 journal=str(tmp_path / "run.db"))
    assert report.ok, report
    assert {report.result(f"p.s.f{i}") for i in range(3)} == {gpu_cluster.gpu_pid}
    for i in range(2):
        assert int((tmp_path / f"run.sandbox/p/s/x{i}/ppid").read_text()) == gpu_cluster.gpu_pid
    # a task asking for more GPUs than any worker has fails with the reason, the run ends
    bad = run(Pipeline([Stage([Task(executable="/bin/true", gpus=4, name="big")], name="s")],
                       name="q"), pilot=pilot, journal=str(tmp_path / "bad.db"))
    assert not bad.ok
    assert "no dask worker of this cluster offers" in str(bad.failures), bad.failures


def test_spawned_work_of_a_gpu_task_stays_on_its_machine(pilot, gpu_cluster):
    """The balancer lends spawned work to idle machines (the UTS tree moves), but none of a
    node's while a task holding resources runs there."""
    import rt_tasks as t

    from shoal.workloads import uts

    done = pilot.options(resources={"GPU": 1}).submit(t.fib, 27, 12)
    assert done.result(110) == t.sfib(27)
    assert pilot.stats()["driver"]["moved"] == 0
    params = uts.UTSParams.preset("T3S")  # the same pilot, no resources: work is lent
    assert uts.count_parallel(pilot, params) == uts.DERIVED["T3S"].nodes
    assert pilot.stats()["driver"]["moved"] >= 1


def test_gpu_worker_gone_fails_the_waiting_task_clearly():
    """The only GPU worker is SIGKILLed under a GPU task: dask would keep the task in its
    no-worker state for good; the pilot fails it after ``resource_wait_s`` with the reason,
    and goes on with the other worker."""
    import signal

    cluster = CliCluster(2, worker_args=("--resources", lambda i: "GPU=1" if i == 0 else "CPU=1"))
    try:
        with shoal.Pilot(backend="dask", address=cluster.address, workers=1,
                         resource_wait_s=1.0) as pilot:
            gpu = pilot.options(resources={"GPU": 1})
            assert gpu.submit(dask_worker_pid).result(60) > 0  # the GPU worker serves
            futs = [gpu.submit(time.sleep, 60) for _ in range(2)]  # one runs, one waits for it
            os.killpg(cluster.workers[0].pid, signal.SIGKILL)
            for fut in futs:
                exc = fut.exception(60)
                assert isinstance(exc, shoal.BackendUnavailable), exc
                assert "needs resources={'GPU': 1}" in str(exc) and "workers offer" in str(exc)
            assert pilot.submit(abs, -5).result(60) == 5
            with pytest.raises(ValueError, match="no dask worker of this cluster offers"):
                gpu.submit(abs, 1)  # and new GPU work is refused at once
    finally:
        cluster.close()
    wait_until(lambda: not shoal_workers(), 20, "the pilot's shoal workers to exit")
