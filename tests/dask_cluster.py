"""Real dask clusters for the tests (tests/dask, tests/conformance): LocalCluster, and a `dask scheduler` plus `dask worker`
processes started from the command line (the way users run it), on free loopback ports.

Everything a helper starts is torn down by it: command-line processes run in their own
process groups and are SIGKILLed as groups; ``shoal_workers()`` lists the shoal worker
processes below a pid, for the leak checks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))  # tests/: rt_tasks.py, this file
ROOT = os.path.dirname(HERE)
DASK_TESTS = os.path.join(HERE, "dask")  # search_tasks.py and the other dask test helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, HERE, DASK_TESTS, env.get("PYTHONPATH")]
                                        if p)
    return env


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], env=_env(), start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def descendants(pid: int | None = None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def shoal_workers(pid: int | None = None) -> list[int]:
    """Pids of shoal worker processes below ``pid`` (default: this process, and then also
    those on the hosts of a scripts/testbed that is up: their dask workers are not our
    children)."""
    out = []
    for p in descendants(pid):
        with contextlib.suppress(psutil.Error):
            if "shoal.runtime.worker" in " ".join(p.cmdline()):
                out.append(p.pid)
    if pid is None:
        out.extend(testbed_shoal_workers())
    return out


def testbed_shoal_workers() -> list[int]:
    """Pids of the shoal workers on the test bed's hosts (none when it is not up)."""
    from multihost.testbed_helpers import host_pids, read_env_cached

    bed = read_env_cached()
    if bed is None:
        return []
    out = []
    for host in bed.hosts:
        for pid in host_pids(host):
            with contextlib.suppress(psutil.Error):
                if "shoal.runtime.worker" in " ".join(psutil.Process(pid).cmdline()):
                    out.append(pid)
    return out


def wait_until(cond, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class CliCluster:
    """`dask scheduler` + ``n`` x `dask worker --nworkers 1 --nthreads 1` as OS processes."""

    def __init__(self, n_workers: int = 2, worker_args=()):
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler = _start(["distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                 "--port", str(self.port), "--no-dashboard",
                                 "--dashboard-address", "127.0.0.1:0"])
        self.workers = [
            _start(["distributed.cli.dask_worker", self.address, "--nworkers", "1",
                    "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1",
                    *[a(i) if callable(a) else a for a in worker_args]])
            for i in range(n_workers)]
        try:
            from distributed import Client

            with Client(self.address, timeout=30, set_as_default=False) as c:
                c.wait_for_workers(n_workers, timeout=60)
        except BaseException:
            self.close()
            raise

    def kill_scheduler(self) -> None:
        _kill_group(self.scheduler)

    def close(self) -> None:
        procs = [self.scheduler, *self.workers]
        pids = {p.pid for proc in procs for p in descendants(proc.pid)} | {p.pid for p in procs}
        # SIGTERM first: dask's nanny and multiprocessing's resource tracker then clean up
        # (a SIGKILLed process group leaves its named semaphores in /dev/shm).
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for proc in procs:
            _kill_group(proc)
        wait_until(lambda: not [p for p in pids if psutil.pid_exists(p)
                                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE],
                   10, "the cluster's processes to exit")


def local_cluster(n_workers: int = 2):
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                        dashboard_address="127.0.0.1:0")


BACKENDS = ["local", "dask-localcluster", "dask-cli"]
# The dask cluster of scripts/testbed (a worker on each of 3 hosts that share neither memory
# nor /tmp): the conformance suite's column with -m multihost (tests/multihost/README).
TESTBED = "dask-testbed"
# The same, for a module fixture's params: the command-line cluster's column (the costliest:
# a scheduler and worker processes per module, every test run a third time) is in .ci/run's
# ``-m heavy`` run; the default suite covers each behaviour on local and LocalCluster.
BACKEND_PARAMS = ["local", "dask-localcluster", pytest.param("dask-cli", marks=pytest.mark.heavy)]


class Clusters:
    """The clusters of one test module (module-scoped fixture), started on first use:
    ``pilot(kind)`` opens a Pilot on the local backend (2 workers), on dask with a
    LocalCluster, or on dask with a command-line cluster; each dask worker hosts a node
    runtime of one shoal worker, so the 2-core test machine is not oversubscribed much."""

    def __init__(self):
        self.made: dict = {}

    def pilot(self, kind: str):
        import shoal

        if kind == "local":
            return shoal.Pilot(2)
        if kind == TESTBED:
            from multihost.testbed_helpers import needs_testbed

            return shoal.Pilot(backend="dask", address=needs_testbed(dask=True, hosts=3).dask,
                               workers=1)
        if kind not in self.made:
            self.made[kind] = local_cluster(2) if kind == "dask-localcluster" else CliCluster(2)
        cluster = self.made[kind]
        if kind == "dask-localcluster":
            return shoal.Pilot(backend="dask", cluster=cluster, workers=1)
        return shoal.Pilot(backend="dask", address=cluster.address, workers=1)

    def warm(self, kind: str) -> None:
        """Start the cluster of ``kind`` and use every path a test will (tasks, broadcasts
        to all workers), so the connections dask pools are open before a per-test leak
        check counts file descriptors."""
        if kind == "local":
            return
        import shoal

        if kind == TESTBED:
            from multihost.testbed_helpers import needs_testbed

            needs_testbed(dask=True, hosts=3)  # skip before any pilot when it is not up
        with self.pilot(kind) as pilot:
            list(pilot.map(abs, range(100)))
            pilot.stats()
            cell = shoal.BestCell.for_pilot(pilot, "max")
            cell.offer(1.0)
            cell.close()

    def client(self, kind: str):
        """A new distributed.Client to the cluster of ``kind`` (close it)."""
        from distributed import Client

        if kind == TESTBED:
            from multihost.testbed_helpers import needs_testbed

            return Client(needs_testbed(dask=True, hosts=3).dask, set_as_default=False)
        cluster = self.made[kind]
        return Client(cluster if kind == "dask-localcluster" else cluster.address,
                      set_as_default=False)

    def close(self) -> None:
        for cluster in self.made.values():
            cluster.close()
        self.made.clear()


# -- fixtures shared by the test modules (imported there by name) ---------------------------


def two_workers():
    """A LocalCluster of two dask worker processes, as a module fixture of the dask attack
    modules (``cluster = pytest.fixture(scope="module", name="cluster")(two_workers)``).
    Multiprocessing's resource tracker, which a LocalCluster starts, is started first:
    module fixtures are set up before the per-test leak check looks, so it never counts as
    a leak."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    c = local_cluster(2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def clusters():
    """The module's clusters (started on first use, before the per-test leak check)."""
    made = Clusters()
    yield made
    made.close()
    assert not shoal_workers(), "shoal workers outlived their clusters"


@pytest.fixture
def pilot(kind, clusters):
    """A Pilot on the backend ``kind`` (a module-scoped fixture of the test module)."""
    with clusters.pilot(kind) as p:
        yield p
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")
