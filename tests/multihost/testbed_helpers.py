"""The multi-host tests' harness: what `scripts/testbed` has up, commands on its hosts, and the
leftover checks of each host's own /dev/shm and /tmp.

The test bed (docs/hpc.md, "Several hosts") is brought up outside pytest, as .ci/run does::

    sudo scripts/testbed up --hosts 3 --dask --slurm
    eval "$(scripts/testbed env)"
    python -m pytest -m multihost tests/multihost --basetemp="$SHOAL_TESTBED_ROOT/pytest"
    sudo scripts/testbed down

The tests read ``scripts/testbed env`` themselves (so the ``eval`` is optional); without root or
without a test bed they skip with the commands above.  ``--basetemp`` on the shared state folder
matters for tests that hand a ``tmp_path`` to tasks: the driver's /tmp is not the hosts' /tmp.

Fixtures and helpers here are imported by name from the test modules (a
tests/multihost/conftest.py would shadow tests/conftest.py for ``from conftest import ...``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "testbed")
HINT = ("no multi-host test bed is up: run `sudo scripts/testbed up --hosts 3 --dask --slurm`, "
        "then `python -m pytest -m multihost tests/multihost --basetemp=/var/lib/shoal-testbed/pytest`"
        " (and `sudo scripts/testbed down` after)")

# What a dask worker leaves on its host by itself (not shoal's): its scratch folder, and the
# named semaphores of multiprocessing that its nanny makes (new ones each time the test bed
# restarts a crashed host's worker; shoal makes none: its shared memory is memfds and
# shoal-/psm_/wnsm_ names).
_NOT_SHOAL = ("dask-scratch-space",)
_NOT_SHOAL_PREFIXES = ("sem.mp-",)


@dataclass
class Testbed:
    """What ``scripts/testbed env`` says is up."""

    hosts: list[str]
    root: str
    dask: str | None
    slurm_conf: str | None
    env: dict = field(default_factory=dict)

    # -- commands on hosts -----------------------------------------------------------------

    def run(self, host: str, *cmd: str, timeout: float = 60.0, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """``scripts/testbed run HOST -- CMD...``, captured (text)."""
        out = subprocess.run([SCRIPT, "run", host, "--", *cmd], capture_output=True, text=True,
                             timeout=timeout, cwd=ROOT, env=env)
        if check and out.returncode != 0:
            raise AssertionError(f"on {host}: {shlex.join(cmd)} exited {out.returncode}: "
                                 f"{out.stderr.strip()[-800:]}")
        return out

    def verb(self, *args: str, timeout: float = 180.0) -> str:
        """Another verb of the script (crash, partition, heal, throttle, up)."""
        out = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                             cwd=ROOT)
        if out.returncode != 0:
            raise AssertionError(f"scripts/testbed {' '.join(args)} exited {out.returncode}: "
                                 f"{out.stderr.strip()[-800:]}")
        return out.stderr

    def repair(self) -> None:
        """Every host back as `up` left it: links up, no throttle, crashed hosts restarted
        (their dask worker and slurmd too); waits for every dask worker to be back."""
        for h in self.hosts:
            self.verb("heal", h)
        try:
            self.verb("up")
        except AssertionError:
            # a fenced dask worker (its host was cut off, then healed) shuts itself down a few
            # seconds after the heal: `up` may have seen it alive and waited for it in vain
            time.sleep(5)
            self.verb("up")

    def ensure_up(self) -> None:
        """Repair the test bed if an earlier test left a host crashed, cut off or without its
        dask worker (so one failure does not fail every later test)."""
        out = subprocess.run([SCRIPT, "status"], capture_output=True, text=True, timeout=60)
        links_down = "link DOWN" in out.stdout
        if out.returncode != 0 or links_down:
            self.repair()

    def files(self, host: str) -> set[str]:
        """What the host's own /dev/shm and /tmp hold (top level), as '/dev/shm/NAME' paths."""
        out = self.run(host, "sh", "-c", "ls -A /dev/shm | sed 's|^|/dev/shm/|'; "
                                         "ls -A /tmp | sed 's|^|/tmp/|'")
        names = (line for line in out.stdout.split())
        return {p for p in names if p.rsplit("/", 1)[-1] not in _NOT_SHOAL
                and not p.rsplit("/", 1)[-1].startswith(_NOT_SHOAL_PREFIXES)}

    def processes(self, host: str) -> list[str]:
        """Command lines of the host's shoal processes (by its network namespace's pids)."""
        found = []
        for pid in host_pids(host):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                if "shoal.runtime.worker" in cmd:
                    found.append(f"{pid}: {cmd[:160]}")
        return found

    def processes_named(self, host: str, needle: str) -> list[int]:
        """Pids of the host's processes whose command line contains ``needle``."""
        out = []
        for pid in host_pids(host):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if needle.encode() in f.read():
                        out.append(pid)
        return out

    def snapshot(self) -> dict[str, set[str]]:
        """Each host's /dev/shm and /tmp entries and shoal processes now."""
        return {h: self.files(h) | set(self.processes(h)) for h in self.hosts}

    def assert_clean(self, before: dict[str, set[str]], timeout: float = 30.0) -> None:
        """No host holds a shoal process, or a /dev/shm or /tmp entry it did not hold in
        ``before`` (the pilot under test is closed)."""
        deadline = time.monotonic() + timeout
        while True:
            extra = {h: sorted(self.files(h) - before.get(h, set())) for h in self.hosts}
            procs = {h: sorted(set(self.processes(h)) - before.get(h, set())) for h in self.hosts}
            extra = {h: v for h, v in extra.items() if v}
            procs = {h: v for h, v in procs.items() if v}
            if not extra and not procs:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"left behind on the hosts: files {extra}, processes {procs}")
            time.sleep(0.25)

    def shared_dir(self, name: str) -> str:
        """A fresh folder every host sees (the state folder is outside their private /tmp)."""
        path = os.path.join(self.root, "shared", f"{name}-{os.getpid()}-{time.monotonic_ns()}")
        os.makedirs(path)
        return path

    def dask_hosts(self, client) -> dict[str, str]:
        """``{dask worker address: host name}`` of the scheduler's workers now."""
        return {addr: w["name"] for addr, w in client.scheduler_info()["workers"].items()}


def read_env() -> Testbed | None:
    """The test bed that ``scripts/testbed env`` reports, or None when it reports none."""
    if os.geteuid() != 0 or not os.access(SCRIPT, os.X_OK):
        return None
    out = subprocess.run([SCRIPT, "env"], capture_output=True, text=True, timeout=30)
    env = {}
    for line in out.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    hosts = env.get("SHOAL_TESTBED_HOSTS", "").split()
    if not hosts:
        return None
    return Testbed(hosts=hosts, root=env["SHOAL_TESTBED_ROOT"], dask=env.get("SHOAL_TESTBED_DASK"),
                   slurm_conf=env.get("SLURM_CONF"), env=env)


@functools.cache
def read_env_cached() -> Testbed | None:
    """``read_env()`` once per test session (for helpers called often)."""
    return read_env()


def host_pids(host: str) -> list[int]:
    """The pids in ``host``'s network namespace (`ip netns pids`)."""
    out = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def needs_testbed(dask: bool = False, slurm: bool = False, hosts: int = 2) -> Testbed:
    """The test bed, or skip saying how to bring it up."""
    if os.geteuid() != 0:
        pytest.skip("the multi-host tests need root (namespaces): " + HINT)
    bed = read_env()
    if bed is None:
        pytest.skip(HINT)
    if len(bed.hosts) < hosts:
        pytest.skip(f"the test bed has {len(bed.hosts)} hosts, this test needs {hosts}: " + HINT)
    if dask and not bed.dask:
        pytest.skip("the test bed has no dask cluster (up --dask): " + HINT)
    if slurm and not bed.slurm_conf:
        pytest.skip("the test bed has no SLURM (up --slurm): " + HINT)
    return bed


@pytest.fixture(scope="session")
def testbed() -> Testbed:
    """The test bed with its dask cluster (else skip)."""
    return needs_testbed(dask=True, hosts=3)


@pytest.fixture(scope="session")
def slurm_testbed() -> Testbed:
    """The test bed with its SLURM cluster (else skip); SLURM_CONF points at it for the
    test's process and every process it starts."""
    bed = needs_testbed(slurm=True, hosts=2)
    os.environ["SLURM_CONF"] = bed.slurm_conf
    return bed


def driver_host() -> str:
    return socket.gethostname()


def wait_until(cond, timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)
