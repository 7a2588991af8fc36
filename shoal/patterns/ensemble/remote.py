"""Executable tasks as pilot tasks: how an ensemble runs its programs on the nodes of a dask pilot.

Used only when ``run(pilot=...)`` is given a dask pilot (``pilot.backend is
BackendKind.DASK``); on the local backend the driver spawns executables itself
(launcher.py), which stays the fastest path on one machine.

Data flow of one attempt::

    driver (engine, one thread)                 a shoal worker on some dask node
      RUNNING committed to the journal
      ExecSpec (every $p.s.t/path resolved,
        absolute sandbox path)
      pilot.submit(run_executable, spec) ─dask─►  run_executable(spec):
                                                    make the sandbox, stage inputs in
                                                    (a filesystem shared with the driver),
                                                    Popen without a shell, own session,
                                                    SIGKILLed if this worker dies (PDEATHSIG),
                                                    wait <= timeout / walltime, kill the group
                                                    (also at a normal exit: what the program
                                                    left running in its group dies with it)
      reap: ExecOutcome ─► exit_failure() ◄─dask─   ExecOutcome(how it ended, exit code,
      journal DONE / FAILED / retry                   stderr tail, outputs or what is missing)

Invariants:
  * the journal lives in the driver only; the node reports, the engine
    journals (write-ahead, exactly as for local executables);
  * classification is shared: the node returns raw facts (exit status, timed
    out, stderr tail, missing outputs) and the engine turns them into a
    ``Failure`` with ``launcher.exit_failure`` and the same ``LaunchError``
    messages as the local path, so a report does not depend on the backend;
  * each attempt is settled once: the engine settles a task from its pilot
    future, which settles once, however often dask ran the task (a dask
    worker killed mid-task makes dask run it again elsewhere; the killed
    attempt's process dies with its shoal worker, by PDEATHSIG);
  * one executable holds one shoal worker of its node while it runs, so the
    engine's slots on dask are ``pilot.workers`` (all nodes' shoal workers),
    and never more executables run than there are shoal workers.

What runs where: the node's environment (``os.environ`` of the shoal
worker, so the node's PATH) plus the task's; the executable is found on the
node; relative executable paths and sandboxes are paths of the driver,
assumed to name the same files on the node (a shared filesystem mounted at the
same place; on one machine they are the same files).  The process gets the
CPU affinity of its dask worker process, not its shoal worker's single CPU
(the driver cannot see node CPUs to pin to); ``OMP_NUM_THREADS`` is the
task's ``cores``.

Rejected alternatives: spawning in the driver on dask too (the programs would
all run on the driver's machine); ``run_executable`` in the dask worker's own
thread pool, bypassing the pilot (pilot tasks get the node runtime's
admission and dask's re-run on worker death for free, and patterns use only
the public Pilot API); a per-task supervisor process that kills the whole
process group when its parent dies (one more exec per task: PDEATHSIG on the
direct child covers the common case, see docs/ensemble.md for the rest);
journaling on the nodes (SQLite over a network filesystem loses writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import select
import signal
import socket
import subprocess
import time

from .launcher import (
    LaunchError,
    check_outputs,
    command,
    find_executable,
    kill_group,
    make_sandbox,
    stage_in,
    tail,
    task_env,
)
from .model import EnsembleError, FailureKind, Input
from .usage import NONE, Usage, wait_usage, worker_node

PR_SET_PDEATHSIG = 1


class Ended(enum.Enum):
    """How an attempt on a node ended."""

    EXITED = "exited"  # the process exited or was killed by a signal on its own
    TIMED_OUT = "timed_out"  # killed by the runner at the task's timeout
    WALLTIME = "walltime"  # killed by the runner at the run's walltime: not a failure
    NOT_STARTED = "not_started"  # sandbox, staging or spawn failed: ``failure`` says which


@dataclasses.dataclass(frozen=True)
class ExecSpec:
    """Everything the node needs to run one attempt (paths already resolved by the driver)."""

    uid: str
    executable: str
    arguments: tuple[str, ...]
    sandbox: str
    cwd: str  # the driver's working directory: relative executable paths are relative to it
    cores: int = 1
    environment: tuple[tuple[str, str], ...] = ()
    pre_exec: tuple[str, ...] = ()
    post_exec: tuple[str, ...] = ()
    inputs: tuple[tuple[Input, str], ...] = ()  # (input as written, resolved source path)
    stdin: str | None = None
    outputs: tuple[str, ...] = ()
    timeout: float | None = None
    walltime_at: float | None = None  # epoch seconds: kill (not fail) the process then
    shell: bool = False  # EnTK's task: `executable arguments` as one shell line (launcher.command)
    shared: str | None = None  # EnTK's $SHARED
    stdout: str = "stdout"  # file names in the sandbox (EnTK's t.stdout / t.stderr)
    stderr: str = "stderr"


@dataclasses.dataclass(frozen=True)
class ExecOutcome:
    """What the node saw; ``classify`` in the engine turns it into DONE or a Failure."""

    ended: Ended
    exit_code: int | None = None  # negative: killed by that signal
    stderr_tail: str = ""  # only when the attempt failed
    failure: FailureKind | None = None  # NOT_STARTED, or STAGING when declared outputs are missing
    message: str = ""
    outputs: tuple[str, ...] | None = None
    host: str = ""
    pid: int | None = None
    seconds: float = 0.0
    usage: Usage = NONE  # what the process used (usage.py: wait4 and its /proc counters)


def run_executable(spec: ExecSpec) -> ExecOutcome:
    """A pilot task: run one executable attempt on this node; never raises for the program's sake."""
    host = socket.gethostname()
    t0 = time.monotonic()
    try:
        make_sandbox(spec.sandbox)
        if spec.inputs:
            stage_in(spec.inputs, spec.sandbox)
        exe = find_executable(spec.executable, spec.cwd, os.environ.get("PATH"))
        argv = command(exe, spec.arguments, spec.pre_exec, spec.post_exec, spec.shell, spec.shared)
        env = task_env(os.environ, spec.cores, dict(spec.environment), spec.sandbox, spec.uid)
        if spec.stdin is not None and not os.path.isfile(spec.stdin):
            raise LaunchError(FailureKind.STAGING, f"stdin file {spec.stdin} does not exist")
    except LaunchError as exc:
        return ExecOutcome(Ended.NOT_STARTED, failure=exc.kind, message=exc.message, host=host)
    if spec.walltime_at is not None and time.time() >= spec.walltime_at:
        # reached the node after the walltime (queued, or its cancel lost a race): the driver
        # has drained and journalled it PENDING, so starting it now would run it beside the
        # resume's attempt
        return ExecOutcome(Ended.WALLTIME, host=host, seconds=time.monotonic() - t0)
    out, err = os.path.join(spec.sandbox, spec.stdout), os.path.join(spec.sandbox, spec.stderr)
    try:
        with open(spec.stdin or os.devnull, "rb") as i, open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(argv, executable=argv[0], cwd=spec.sandbox, env=env, stdin=i,
                                    stdout=o, stderr=e, start_new_session=True,
                                    preexec_fn=_child_setup())
    except OSError as exc:
        return ExecOutcome(Ended.NOT_STARTED, failure=FailureKind.SPAWN,
                           message=f"cannot start {spec.executable!r}: {exc}", host=host)
    try:
        ended, used = _wait(proc, spec.timeout, spec.walltime_at, worker_node())
    finally:
        if proc.returncode is None:  # an exception while waiting: leave nothing running
            kill_group(proc.pid)
            proc.wait()
    code = proc.returncode
    seconds = time.monotonic() - t0
    if ended is not Ended.EXITED or code != 0:
        return ExecOutcome(ended, code, tail(err), host=host, pid=proc.pid, seconds=seconds, usage=used)
    try:
        outputs = tuple(check_outputs(spec.outputs, spec.sandbox)) if spec.outputs else None
    except LaunchError as exc:
        return ExecOutcome(ended, code, failure=exc.kind, message=exc.message, host=host,
                           pid=proc.pid, seconds=seconds, usage=used)
    return ExecOutcome(ended, code, outputs=outputs, host=host, pid=proc.pid, seconds=seconds, usage=used)


def _wait(proc: subprocess.Popen, timeout: float | None, walltime_at: float | None,
          node: str | None) -> tuple[Ended, Usage]:
    """Wait for ``proc``; kill its process group at the timeout or the walltime.  Also what it
    used, as it was reaped (``usage.wait_usage``)."""
    limits = []
    if timeout:
        limits.append((time.monotonic() + timeout, Ended.TIMED_OUT))
    if walltime_at is not None:
        limits.append((time.monotonic() + (walltime_at - time.time()), Ended.WALLTIME))
    if not limits:
        return Ended.EXITED, _reap_group(proc, node)
    until, why = min(limits, key=lambda x: x[0])
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # pragma: no cover - kernels before 5.3
        pidfd = -1
    used = NONE
    try:
        while proc.returncode is None:
            left = until - time.monotonic()
            if left <= 0:
                kill_group(proc.pid)
                return why, _reap(proc, node)
            if pidfd >= 0:
                poller = select.poll()
                poller.register(pidfd, select.POLLIN)
                if poller.poll(min(int(left * 1000) + 1, _POLL_MAX_MS)):  # poll() takes a C int
                    used = _reap_group(proc, node)
            else:  # pragma: no cover
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(min(left, 0.05))
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return Ended.EXITED, used


_POLL_MAX_MS = 2**31 - 1  # ~24.8 days: a longer timeout (timeout=1e9, "never") waits in slices


def _reap_group(proc: subprocess.Popen, node: str | None) -> Usage:
    """Wait for ``proc`` to exit, SIGKILL what it left in its process group, then reap it.  The
    unreaped zombie keeps the group id from being reused, so the kill cannot reach a stranger."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    kill_group(proc.pid)
    return _reap(proc, node)


def _reap(proc: subprocess.Popen, node: str | None) -> Usage:
    """Reap ``proc`` with ``wait4`` (its exit status into ``proc.returncode``): what it used."""
    try:
        status, used = wait_usage(proc.pid, node)
    except ChildProcessError:  # reaped elsewhere: what Popen.wait says then
        proc.wait()
        return NONE
    proc.returncode = os.waitstatus_to_exitcode(status)
    return used


def _child_setup():
    """A ``preexec_fn`` for the executable: SIGKILL it when this shoal worker dies, and give
    it the CPU affinity of the process hosting the node runtime (the dask worker; a shoal
    worker is pinned to one CPU, which the child would otherwise inherit).  Everything it calls is resolved here, before the fork."""
    parent = os.getpid()
    try:
        cpus = os.sched_getaffinity(os.getppid())  # the dask worker's slice of the host
    except (AttributeError, OSError):
        cpus = None
    prctl = _prctl()

    def setup() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the worker died before prctl took effect
                os.kill(os.getpid(), signal.SIGKILL)
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cpus)

    return setup


_PRCTL: list = []


def _prctl():
    """libc's ``prctl`` (Linux), or None."""
    if not _PRCTL:
        fn = None
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):  # pragma: no cover - not Linux / not glibc
            pass
        _PRCTL.append(fn)
    return _PRCTL[0]


def dask_slots(pilot, cores, gpus: int) -> list[int]:
    """The Scheduler's "CPUs" on a dask pilot: one slot per shoal worker of the cluster."""
    if gpus:
        raise EnsembleError(f"run(gpus={gpus}) is not supported on a dask pilot: the nodes' GPUs "
                            "are dask worker resources there (start the GPU machines' workers "
                            "with `dask worker --resources GPU=n`) and each task's gpus=k asks "
                            "for k of them; run(gpus=) hands out this machine's GPUs")
    if cores is None:
        return list(range(pilot.workers))
    if isinstance(cores, int) and not isinstance(cores, bool) and cores >= 1:
        return list(range(cores))
    raise EnsembleError(f"run(cores={cores!r}) on a dask pilot: give a number of slots (an int "
                        f">= 1; default pilot.workers = {pilot.workers}); CPU ids name the driver's "
                        "CPUs, which do not run the tasks")


def dask_resources(task) -> dict[str, int] | None:
    """The dask worker resources one attempt of ``task`` holds on a dask pilot.

    ``gpus=k`` -> ``{"GPU": k}``: dask runs the attempt only on a dask worker
    started with ``--resources GPU=n`` (n >= k) and never runs more of them there
    at once than its GPUs allow; the pilot refuses at submit a request no
    connected worker can meet (the attempt fails with that message, see
    docs/ensemble.md).  ``cores`` stay slots of the driver's Scheduler (one per
    shoal worker), as without GPUs.  dask counts GPUs, it does not pick one: run
    one dask worker per GPU with its ``CUDA_VISIBLE_DEVICES`` (dask-cuda's way)
    to give each attempt its own device.
    """
    return {"GPU": task.gpus} if task.gpus else None
