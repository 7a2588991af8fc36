"""Faults on the dask backend, with real processes: a dask worker SIGKILLed mid-map and
mid-spawn-tree, retries exhausted, an address that refuses connections, a scheduler that
vanishes mid-run.  Each test owns its cluster; the shared leak check (tests/conftest.py)
then sees every process the test started go away."""

from __future__ import annotations

import os
import signal

import dask
import psutil
import pytest
import rt_tasks as t
from dask_cluster import CliCluster, free_port, local_cluster, shoal_workers, wait_until

import shoal
from shoal import BackendUnavailable


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    """multiprocessing's resource tracker (started by the first LocalCluster) lives as long
    as this process: start it before the per-test leak check looks, it is no leak."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


@pytest.fixture
def cluster():
    c = local_cluster(2)
    yield c
    c.close()


def _gone(pids) -> bool:
    return not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_sigkill_dask_worker_mid_map(cluster, tmp_path):
    """Every item blocks on a file until the kill has happened, so the killed dask worker
    holds items in flight (on any machine speed); they run again on the other one."""
    gate, started = str(tmp_path / "gate"), tmp_path / "started"
    started.mkdir()
    n = 300
    with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
        it = pilot.map(t.gated_item, range(n), [gate] * n, [str(started)] * n)

        def hosts():
            return {int(p.read_text()) for p in started.iterdir() if not p.name.endswith(".tmp")}

        wait_until(lambda: len(hosts()) == 2, 60, "items running on both dask workers")
        victim = min(hosts())  # a dask worker process with an item in flight
        node_workers = [w for w in shoal_workers() if psutil.Process(w).ppid() == victim]
        os.kill(victim, signal.SIGKILL)
        t.release(gate)
        assert list(it) == [x * x for x in range(n)]
        wait_until(lambda: _gone(node_workers), 10, "the dead dask worker's shoal workers (lifeline)")
    wait_until(lambda: not shoal_workers(), 10, "no shoal workers after close")


def test_sigkill_dask_worker_mid_spawn_tree(cluster, tmp_path):
    """The tree's leaves block on a file until the kill has happened: the tree is mid-run."""
    pidfile, gate = str(tmp_path / "root"), str(tmp_path / "gate")
    with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
        fut = pilot.submit(t.gated_tree_reporting, 3, 4, gate, pidfile)
        wait_until(lambda: os.path.exists(pidfile), 30, "the tree's root to start")
        shoal_pid, dask_pid = map(int, open(pidfile).read().split())
        os.kill(dask_pid, signal.SIGKILL)
        wait_until(lambda: _gone([shoal_pid]), 10, "the killed node's shoal workers (lifeline)")
        t.release(gate)
        assert fut.result(120) == 1 + 4 + 16 + 64  # re-run by dask on a live worker
    wait_until(lambda: not shoal_workers(), 10, "no shoal workers after close")


def test_node_worker_lost_retries_exhausted(cluster):
    with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
        with pytest.raises(shoal.WorkerLost):
            pilot.options(retries=1).submit(t.die_node_worker).result(60)
        assert pilot.submit(t.inc, 1).result(30) == 2


def test_dask_worker_deaths_exhausted():
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        c = local_cluster(2)
    try:
        with shoal.Pilot(backend="dask", cluster=c, workers=1) as pilot:
            with pytest.raises(shoal.WorkerLost, match="allowed-failures"):
                pilot.submit(t.kill_dask_worker).result(60)
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_unreachable_address():
    with pytest.raises(BackendUnavailable, match="cannot reach the dask scheduler") as info:
        shoal.Pilot(backend="dask", address=f"tcp://127.0.0.1:{free_port()}", connect_timeout=2)
    assert isinstance(info.value, shoal.ShoalError) and isinstance(info.value, ConnectionError)


@pytest.mark.timeout(90)
def test_cluster_vanishes_mid_run(tmp_path):
    cli = CliCluster(1)
    try:
        pilot = shoal.Pilot(backend="dask", address=cli.address, workers=1)
        pidfile = str(tmp_path / "root")
        fut = pilot.submit(t.slow_tree_reporting, 2, 2, 30, pidfile)
        wait_until(lambda: os.path.exists(pidfile), 30, "the task to start")
        cli.kill_scheduler()
        with pytest.raises(BackendUnavailable, match="went away"):
            fut.result(60)
        with pytest.raises(BackendUnavailable):
            pilot.submit(t.inc, 1)
        pilot.close()
    finally:
        cli.close()


def test_options_are_checked():
    with pytest.raises(ValueError, match="exactly one of"):
        shoal.Pilot(backend="dask")
    with pytest.raises(ValueError, match="exactly one of"):
        shoal.Pilot(backend="dask", address="tcp://x:1", provider="slurm")
    with pytest.raises(ValueError, match="topology"):
        shoal.Pilot(backend="dask", address="tcp://x:1", topology="2x2")


@pytest.mark.timeout(120)
def test_worker_lifetime_drains_without_losing_work(tmp_path):
    """What provider= sets for a walltime: dask retires a worker at its --lifetime and the
    nanny starts a fresh one.  Every map item blocks on a file until the retiring worker
    has left (so it leaves with items in flight, on any machine speed); they run again
    elsewhere, and every result is there, once."""
    from distributed import Client

    gate, started = str(tmp_path / "gate"), tmp_path / "started"
    started.mkdir()
    n = 200
    cluster = CliCluster(2, worker_args=["--lifetime", lambda i: "8s" if i == 0 else "600s",
                                         "--lifetime-restart"])
    try:
        with Client(cluster.address, set_as_default=False) as client:
            pids = client.run(os.getpid)  # {address: dask worker process}
            before = set(pids)
            [(addr, pid)] = [(a, p) for a, p in pids.items()
                             if psutil.Process(p).ppid() == cluster.workers[0].pid]
            with shoal.Pilot(backend="dask", address=cluster.address, workers=1) as pilot:
                it = pilot.map(t.gated_item, range(n), [gate] * n, [str(started)] * n,
                               chunksize=1)

                def hosts():
                    return {int(p.read_text()) for p in started.iterdir()
                            if not p.name.endswith(".tmp")}

                wait_until(lambda: pid in hosts() or not psutil.pid_exists(pid), 60,
                           "an item to start on the worker that will retire")
                assert pid in hosts(), "the worker retired before any item started on it"
                wait_until(lambda: addr not in client.scheduler_info(n_workers=-1)["workers"],
                           60, "the worker to retire at its --lifetime")
                t.release(gate)
                assert list(it) == [x * x for x in range(n)]
            wait_until(lambda: set(client.scheduler_info()["workers"]) - before, 30,
                       "the retired worker's replacement")
    finally:
        cluster.close()
