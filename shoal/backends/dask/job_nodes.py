"""One dask cluster over the N nodes of one SLURM job: a scheduler in the driver, one ``srun``
step starting one dask worker per node.

Two ways in, one inside::

    inside a job (sbatch -N 3 / salloc -N 3,       from outside: Pilot(provider="slurm",
    the batch step): shoal.Pilot(), shoal run      nodes=3, cores_per_node=C), shoal run
        │                                          --slurm --nodes 3
        │                                              │ sbatch -N 3 --ntasks-per-node=1
        │                                              │   --wrap "<the same srun line>"
        ▼                                              ▼
    JobStep: Popen(srun ...)                       NodesJob: one batch job of N nodes
        │                                              │
        └──► srun --overlap --nodes=N --ntasks=N --ntasks-per-node=1 --cpus-per-task=C
               python -m shoal.backends.dask.step_worker tcp://DRIVER:PORT --nthreads C ...
                 one dask worker per node, named <prefix>-<node> (step_worker.py)

The scheduler is ``distributed.Scheduler`` in the driver's process (a ``LocalCluster`` with
no workers), listening on the driver's address the nodes reach (the first node's, inside a
job).  The pilot is then the ordinary dask backend on it (``DaskBackend``): each worker runs
one node runtime with the node's cores as shoal workers, and tasks are placed by the same
machinery as on any dask cluster (backend.py).

* ``srun_argv`` / ``sbatch_argv`` are pure (unit-tested without SLURM); ``job_nodes`` reads
  the job's nodes and cores from ``SLURM_JOB_NODELIST`` / ``SLURM_JOB_CPUS_PER_NODE`` (the
  ensemble's ``nodes.slurm_nodes`` reads the same, with memory, for its refusal; the two
  layers may not import each other, so both use the leaf parsers).
* The step is ``--overlap``: it holds every CPU of the job, and an MPI task's own
  ``srun`` (started by a task running in it) must still get a step.
* One ``--cpus-per-task`` for all nodes (srun's rule): the smallest node's count; each
  node runtime then has that many shoal workers.
* ``close()``: SIGTERM to srun (it forwards the signal to every worker; a dask worker
  closes on it), bounded; then SIGKILL and ``scancel`` of the step; then the scheduler.
  A ``NodesJob`` is ``scancel``-ed and ``close()`` returns once squeue no longer lists it
  (bounded), as for the one-job-per-node pilot (jobs.py).
* A ``NodesJob`` is watched (``NodesJobWatch``, the ``JobPolicy`` of jobs.py): queue
  progress logged, a fatal pending reason fails the pilot; a job that ends while the pilot
  is open fails the waiting tasks with ``BackendUnavailable`` (not resubmitted: the tasks
  would otherwise wait for workers for good).
* A worker whose scheduler is gone for ``DEATH_TIMEOUT_S`` exits (the driver was killed):
  the step, and with it a ``NodesJob``, ends by itself.

Rejected: one ``srun --nodes=1 -w NODE`` per node (N steps and N srun processes to watch
and end, N controller round trips; one step over all has SLURM start, signal and end the
workers together); a ``dask scheduler`` subprocess (a process more to end and to leak; the
in-process scheduler is what dask-jobqueue runs too); dask-jobqueue for the N-node job (it
maps one batch job to one worker name: N workers of one job under one name are a conflict
for its bookkeeping and for ``JobWatch``; prefixing its ``python=`` with srun and renaming
the workers would depend on its job-script template); one job per node (N queue waits, N
jobs in the accounting, nodes not co-scheduled: kept for elastic pilots, ``jobs=(low, high)``,
which grow and shrink by whole jobs).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping

from ..._cpu_counts import expand_counts
from ..._errors import BackendUnavailable
from ..._walltime import walltime_seconds
from ...runtime.allocation import expand_nodelist
from .jobs import JobWatch
from .provider import batch_time

log = logging.getLogger("shoal.jobs")

ALL_NODES_ENV = "SHOAL_ALL_NODES"  # "0": a pilot inside a multi-node job stays on its node
DEATH_TIMEOUT_S = 60  # a worker without its scheduler this long exits
START_TIMEOUT_S = 120.0  # every node's worker connected within this, or the pilot fails
STOP_TIMEOUT_S = 20.0  # srun ends within this after SIGTERM, or is killed
WORKER_MODULE = "shoal.backends.dask.step_worker"
_QUIET = (OSError, subprocess.SubprocessError, ValueError, IndexError)  # cleanup goes on


@dataclasses.dataclass(frozen=True)
class JobNode:
    name: str
    cores: int


def job_nodes(env: Mapping[str, str]) -> tuple[JobNode, ...]:
    """The job's nodes and their CPUs (``SLURM_JOB_CPUS_PER_NODE``); empty outside a job."""
    names = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    if not names:
        return ()
    counts = expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE", "") or "1")
    if len(counts) == 1:
        counts = counts * len(names)
    if len(counts) != len(names):
        raise ValueError(f"SLURM_JOB_NODELIST names {len(names)} nodes but "
                         f"SLURM_JOB_CPUS_PER_NODE gives {len(counts)} counts")
    return tuple(JobNode(n, c) for n, c in zip(names, counts, strict=True))


def spans_job(env: Mapping[str, str]) -> bool:
    """Should a pilot started here span the job's nodes?  In the batch step (or an
    ``salloc`` shell) of a SLURM job of several nodes, unless ``SHOAL_ALL_NODES=0``.  Inside
    a job step (``SLURM_STEP_ID``: the dask workers themselves, a task's ``srun``) never."""
    if not env.get("SLURM_JOB_ID") or env.get("SLURM_STEP_ID"):
        return False
    if env.get(ALL_NODES_ENV, "1").strip() == "0":
        return False
    try:
        return len(job_nodes(env)) > 1
    except ValueError:
        return False


def srun_argv(scheduler: str, nodes: int, cores: int, prefix: str, *,
              python: str = sys.executable, death_timeout: int = DEATH_TIMEOUT_S) -> list[str]:
    """The one step of dask workers: one per node, ``cores`` threads and CPUs each (pure)."""
    if nodes < 1 or cores < 1:
        raise ValueError(f"a worker step needs nodes >= 1 and cores >= 1, got {nodes}, {cores}")
    return ["srun", "--overlap", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={cores}", f"--job-name={prefix}", "--kill-on-bad-exit=0",
            python, "-m", WORKER_MODULE, scheduler, "--name-prefix", prefix,
            "--nthreads", str(cores), "--death-timeout", str(death_timeout)]


def sbatch_argv(worker_step: list[str], nodes: int, cores: int, *, name: str,
                walltime=None, queue: str | None = None, account: str | None = None,
                memory: str | None = None, job_extra=(), output: str | None = None) -> list[str]:
    """One batch job of ``nodes`` nodes whose script is ``worker_step`` (pure)."""
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--nodes={nodes}",
            "--ntasks-per-node=1", f"--cpus-per-task={cores}"]
    if walltime is not None:
        argv.append(f"--time={batch_time(walltime_seconds(walltime))}")
    if queue is not None:
        argv.append(f"--partition={queue}")
    if account is not None:
        argv.append(f"--account={account}")
    if memory is not None:
        argv.append(f"--mem={_megabytes(memory)}M")
    if output is not None:
        argv.append(f"--output={output}")
    argv += list(job_extra)
    return argv + ["--wrap", shlex.join(worker_step)]


def _megabytes(memory) -> int:
    from dask.utils import parse_bytes

    try:
        return max(1, parse_bytes(memory) // 2**20)
    except (TypeError, ValueError):
        raise ValueError(f"memory must be a size such as '4GB', got memory={memory!r}") from None


def scheduler_host() -> str:
    """This host's address the other nodes reach: its name's address, or (when the name
    resolves to loopback) the address of the interface with the default route."""
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = "127.0.0.1"
    if addr.startswith("127."):
        from distributed.utils import get_ip

        addr = get_ip()
    return addr


class _Scheduler:
    """A ``distributed.Scheduler`` in this process (a LocalCluster with no workers)."""

    def __init__(self, host: str | None):
        from distributed import LocalCluster

        self.local = LocalCluster(n_workers=0, processes=False, protocol="tcp://",
                                  host=host or scheduler_host(), scheduler_port=0,
                                  dashboard_address=":0")  # a free port, never 8787
        self.address = self.local.scheduler_address

    def workers(self) -> int:
        return len(self.local.scheduler.workers)

    def close(self) -> None:
        try:
            self.local.close()
        except Exception:  # pragma: no cover - closing anyway
            log.debug("closing the scheduler failed", exc_info=True)


class _Tail:
    """The last lines a child wrote (its stderr), read on a thread, for error messages."""

    def __init__(self, stream):
        self.lines: collections.deque[str] = collections.deque(maxlen=20)
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True,
                                        name="shoal-srun-stderr")
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip())

    def text(self) -> str:
        return " | ".join(self.lines) or "no output"


class JobStep:
    """Inside a job: the scheduler here and one srun step of workers over every node.

    ``scheduler_address``, ``nodes`` (the job's), ``cores`` (per node), ``close()``."""

    def __init__(self, env: Mapping[str, str] | None = None, *, host: str | None = None,
                 start_timeout: float = START_TIMEOUT_S):
        env = os.environ if env is None else env
        self.nodes = job_nodes(env)
        if len(self.nodes) < 2:
            raise ValueError("JobStep runs in a SLURM job of several nodes (SLURM_JOB_NODELIST)")
        self.job_id = env.get("SLURM_JOB_ID", "")
        self.cores = min(n.cores for n in self.nodes)
        self.prefix = f"shoal-{self.job_id}"
        self.proc: subprocess.Popen | None = None
        self.scheduler = _Scheduler(host)
        self.scheduler_address = self.scheduler.address
        try:
            argv = srun_argv(self.scheduler_address, len(self.nodes), self.cores, self.prefix)
            try:
                # a session of its own: a Ctrl-C at the terminal reaches the driver, which
                # closes the step itself (srun would otherwise kill the workers mid-close)
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                             text=True, start_new_session=True)
            except OSError as exc:
                raise BackendUnavailable(f"cannot start the worker step ({exc}): is srun on "
                                         "PATH in this job?") from None
            self._tail = _Tail(self.proc.stderr)
            self._wait_for_workers(start_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        want = len(self.nodes)
        while self.scheduler.workers() < want:
            if self.proc.poll() is not None:
                raise BackendUnavailable(
                    f"the worker step (srun over {want} nodes of job {self.job_id}) exited with "
                    f"status {self.proc.returncode} before its workers connected: "
                    f"{self._tail.text()}")
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"{self.scheduler.workers()} of the {want} nodes' dask workers connected to "
                    f"{self.scheduler_address} within {timeout:g} s (can the nodes reach this "
                    f"host? srun says: {self._tail.text()})")
            time.sleep(0.1)

    def close(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(*_QUIET):
                proc.send_signal(signal.SIGTERM)  # srun forwards it to every worker
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("the worker step did not end %g s after SIGTERM: killing it",
                            STOP_TIMEOUT_S)
                _scancel_steps(self.job_id, self.prefix)
                with contextlib.suppress(*_QUIET):
                    proc.kill()
                with contextlib.suppress(*_QUIET):
                    proc.wait(10)
        self.scheduler.close()


class NodesJob:
    """From outside: the scheduler here and ONE batch job of ``nodes`` nodes running the
    worker step; submitted at construction (``sbatch --test-only`` first), never waited for.

    ``scheduler_address``, ``job_id``, ``nodes``, ``cores`` (per node), ``close()`` (scancel; returns when squeue lists it no
    more, bounded)."""

    def __init__(self, *, nodes: int, cores_per_node: int, walltime=None,
                 queue: str | None = None, account: str | None = None,
                 memory: str | None = None, job_extra=(), log_directory: str | None = None,
                 host: str | None = None, queue_warn_s: float = 10.0):
        for key, value in (("nodes", nodes), ("cores_per_node", cores_per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an int >= 1, got {key}={value!r}")
        if isinstance(job_extra, str) or not all(isinstance(x, str) for x in job_extra):
            raise ValueError(f"job_extra must be a list of strings (batch directives such as "
                             f"'--exclusive'), got job_extra={job_extra!r}")
        self.job_id: str | None = None
        self.nodes, self.cores = nodes, cores_per_node
        self.warn_s = queue_warn_s  # pending this long: a warning (NodesJobWatch)
        self.scheduler = _Scheduler(host)
        self.scheduler_address = self.scheduler.address
        self.prefix = f"shoal-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
        step = srun_argv(self.scheduler_address, nodes, cores_per_node, self.prefix)
        output = None if log_directory is None else os.path.join(log_directory,
                                                                 "shoal-pilot-%j.out")
        if log_directory is not None:
            os.makedirs(log_directory, exist_ok=True)
        self.argv = sbatch_argv(step, nodes, cores_per_node, name=self.prefix, walltime=walltime,
                                queue=queue, account=account, memory=memory,
                                job_extra=job_extra, output=output)
        try:
            self._submit()
        except BaseException:
            self.scheduler.close()
            raise

    def _submit(self) -> None:
        from .provider import check_script

        with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="shoal-job-") as f:
            f.write("#!/bin/sh\n" + self.argv[-1] + "\n")
            f.flush()
            check_script([*self.argv[1:-2], f.name])  # SLURM's refusal, before submitting
        try:
            out = subprocess.run(self.argv, capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "LC_ALL": "C"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendUnavailable(f"sbatch failed: {exc}") from None
        if out.returncode != 0:
            raise BackendUnavailable(f"sbatch refused the pilot job: "
                                     f"{(out.stderr or out.stdout).strip()}")
        self.job_id = out.stdout.strip().split(";")[0]
        log.info("SLURM job %s (%s): submitted, %s", self.job_id, self.prefix,
                 " ".join(self.argv[3:6]))

    def close(self, timeout: float = 60.0) -> None:
        from .jobs import squeue

        if self.job_id is not None:
            with contextlib.suppress(*_QUIET):
                subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                seen = squeue()
                if seen is not None and self.job_id not in seen:
                    break
                time.sleep(0.5)
            else:
                log.warning("job %s is still in squeue %.0f s after the pilot closed",
                            self.job_id, timeout)
        self.scheduler.close()


def _scancel_steps(job_id: str, name: str) -> None:
    """Cancel this job's steps named ``name`` (the worker step whose srun did not end)."""
    with contextlib.suppress(*_QUIET):
        out = subprocess.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"],
                             capture_output=True, text=True, timeout=20)
        steps = [f.split()[0] for f in out.stdout.splitlines() if f.split()[1:] == [name]]
        if steps:
            subprocess.run(["scancel", *steps], capture_output=True, timeout=20)


class NodesJobWatch(JobWatch):
    """``JobWatch`` over a ``NodesJob``: its one job (name: the worker prefix), connected once
    any of its nodes' workers (``<prefix>-<node>``) is; pending progress and fatal pending
    reasons as for any pilot job, but a job that ends is not submitted again (its nodes are
    gone; dask would wait for workers for good): the pilot fails, naming the job."""

    replaces = False
    no_replace = ("an N-node pilot job is not resubmitted: the tasks waiting for it fail "
                  "(an ensemble's journal stays resumable)")

    def _submitted(self) -> dict[str, str | None]:
        return {self.cluster.prefix: self.cluster.job_id}

    def _connected(self) -> set[str]:
        prefix = self.cluster.prefix + "-"
        return {self.cluster.prefix} if any(
            str(n).startswith(prefix) for n in super()._connected()) else set()
