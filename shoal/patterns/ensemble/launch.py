"""How one run starts its tasks and learns how they ended: a ``Launch``, chosen once per run.

The ``Engine`` (engine.py) places, journals and reaps; what differs between the pilots it
runs on is behind the ``Launch`` protocol, and ``choose`` picks the implementation once,
from the pilot, when the engine is built:

``LocalLaunch`` (no pilot, or a local one; also a SLURM batch step, where MPI tasks start
    their ranks with srun)
    the Scheduler's "cores" are this machine's CPU ids; an executable is handed to the
    runner thread of its first granted CPU (runners.py), which spawns it pinned
    (launcher.py; an MPI task's ranks through ``mpi.choose``'s srun/mpirun) and reports
    SPAWNED/EXITED events that the engine journals; a function task of N cores runs in
    ``with_cpus`` (its CPUs' affinity and thread variables).
``DaskLaunch`` (a dask pilot: ``pilot=Pilot(backend="dask")``, or the pilot of batch jobs
    that ``resource=`` / ``shoal run --slurm`` opens, resource.py)
    the "cores" are slots, one per shoal worker of the cluster (``pilot.workers``);
    an executable becomes a pilot task (remote.py's ``run_executable`` on a node) whose
    future the engine reaps like a function task's; GPUs are dask worker resources;
    the nodes kill their executables at the walltime; a pilot over a job's nodes
    (``node_specs``) refuses a task no single node can hold.

Both classify an ended attempt into ``(item, failure or None, value)`` with the same
rules (``launcher.exit_failure``, ``function_outcome``), so a report does not depend on
where a task ran.  Neither touches the journal, the Scheduler's accounting or the
engine's tables: the engine calls them and acts on what they return.

Rejected: a ``remote`` flag tested wherever the two differ (eleven tests in the engine,
each a place to forget one when adding a third way; the docstring said the choice was
made once, the code made it eleven times); subclassing the Engine per pilot (the
journal, placement and reaping would be shared through one ``self`` again); putting
SLURM in a third strategy (a SLURM allocation is run either by a dask pilot of batch
jobs, which is ``DaskLaunch``, or from inside a job step, where the local runners start
processes and only MPI's rank launcher differs, which mpi.py already chooses).
"""

from __future__ import annotations

import collections
import enum
import functools
import os
import time
from collections.abc import Callable
from typing import Protocol

import shoal

from . import mpi, nodes
from .config import EngineConfig
from .functions import ship_code, with_cpus
from .launcher import (
    Launcher,
    LaunchError,
    exit_failure,
    process_start,
    rank_tails,
    stage_out,
    tail,
)
from .model import Failure, FailureKind, Task, TaskKind
from .pilot_jobs import JobLog
from .refs import Refs
from .remote import Ended, ExecSpec, dask_resources, dask_slots, run_executable
from .runners import QUICK_S, Runners
from .scheduler import Request, Scheduler
from .usage import of_exception, of_row
from .walker import Item

Outcome = tuple[Item, "Failure | None", object]  # (item, failure or None, value) of one ended attempt


class LaunchKind(enum.Enum):
    LOCAL = "local"  # the driver's runner threads spawn executables (runners.py, launcher.py)
    DASK = "dask"  # executables are pilot tasks on the cluster's nodes (remote.py)


class Launch(Protocol):
    """What the engine asks of the way its run starts tasks (module docstring)."""

    kind: LaunchKind

    # -- what there is to place on, and what a task asks for
    def slots(self, config: EngineConfig) -> list[int]: ...
    def memory_total(self, config: EngineConfig) -> int: ...
    def request(self, task: Task, key) -> Request: ...
    def refusal(self, task: Task, sched: Scheduler) -> str | None:
        """Why ``task`` can never be placed here (the walker names the task), or None."""

    # -- starting (after the engine committed RUNNING)
    def start(self, items: list[Item], on_done: Callable) -> list[tuple[Item, Failure]]:
        """Start placed executables: each either reports through ``events`` (local), or gets
        ``item.future`` and is passed to ``on_done`` (dask); returns those that could not start."""

    def function(self, item: Item, fn: Callable) -> tuple[Callable, dict | None]:
        """A function task's call as the pilot should run it, and its dask resources."""

    # -- how it ended
    def future_outcome(self, item: Item, fut) -> Outcome | None:
        """The attempt whose future settled; None: killed on its node at the walltime (PENDING)."""

    def exit_outcome(self, item: Item, code: int, timed_out: bool) -> Outcome:
        """The local executable that exited with ``code`` (an EXITED event)."""

    # -- the driver's own processes (local executables): events, kills, the stop
    @property
    def events(self) -> collections.deque | tuple: ...
    @property
    def busy(self) -> bool: ...
    def kill(self, pid: int) -> None: ...
    def stop_new(self) -> bool: ...

    # -- the run's span: its walltime; the pilot's batch-job notes, journaled by the engine
    def begin(self, walltime_at: float | None) -> None: ...
    def notes(self) -> list: ...
    def end(self) -> bool: ...

    # -- the end of a run
    def ends_on_node(self, item: Item, walltime_at: float | None) -> bool: ...
    def abandon(self, item: Item) -> None: ...
    def close(self) -> None: ...


NODE_KILL_GRACE_S = 10.0  # a drain waits this long past the walltime for nodes to report their kills


def function_outcome(item: Item, fut) -> Outcome:
    """A function task's attempt (or a pilot task that raised) from its settled future."""
    exc = fut.exception()
    if exc is None:
        value, row = fut.result()  # every function task runs in measured_call (engine._measured)
        item.usage = of_row(row)
        return item, None, value
    item.usage = of_exception(exc)
    if isinstance(exc, shoal.TaskTimeout):
        kind = FailureKind.TIMEOUT
    elif isinstance(exc, shoal.WorkerLost):
        kind = FailureKind.WORKER_LOST
    else:
        kind = FailureKind.EXCEPTION
    cause = exc.__cause__
    tb = getattr(cause, "tb", "") if cause is not None else ""
    return item, Failure(kind, f"{type(exc).__name__}: {exc}", None, tb[-2000:], item.attempt), None


def _stage_out(item: Item, refs: Refs, cwd: str) -> Outcome | None:
    """Copy the task's ``stage_out`` pairs; the failed outcome, or None when done."""
    try:
        stage_out(refs.shared_outputs(item.task.stage_out), item.sandbox, cwd)
    except LaunchError as exc:
        return item, Failure(exc.kind, exc.message, 0, "", item.attempt), None
    return None


class LocalLaunch:
    """Executables spawned by the driver's runner threads, pinned to their granted CPUs."""

    kind = LaunchKind.LOCAL

    def __init__(self, pilot, launcher: Launcher, refs: Refs, rank_kind: mpi.LauncherKind | None,
                 wake: Callable[[], None]):
        self.pilot = pilot
        self.launcher = launcher
        self.refs = refs
        self.rank_kind = rank_kind
        self._rank_launcher = None  # chosen on the first MPI task (mpi.choose), then kept
        self.runners: Runners | None = None  # started with the first executable
        self.cpus: list[int] = []  # the Scheduler's CPUs (``slots``): one runner thread each
        self.wake = wake  # pokes the engine's loop after a runner's event (any thread)

    @property
    def rank_launcher(self):
        """How this run starts MPI tasks' ranks: chosen once (mpi.choose), on first use."""
        if self._rank_launcher is None:
            self._rank_launcher = mpi.choose(self.rank_kind)
        return self._rank_launcher

    def slots(self, config: EngineConfig) -> list[int]:
        cores, workers = config.cores, config.workers
        if cores is None:
            cpus = (self.pilot.topology if self.pilot is not None else shoal.topology()).usable_cpus
            if workers is not None and self.pilot is None:
                cpus = cpus[:workers] if workers <= len(cpus) else list(range(workers))
        elif isinstance(cores, int):
            cpus = list(range(cores))
        else:
            cpus = list(cores)
        self.cpus = cpus
        return cpus

    def memory_total(self, config: EngineConfig) -> int:
        if config.memory is not None:
            return config.memory
        import psutil

        total = psutil.virtual_memory().total
        alloc = shoal.allocation()  # inside a batch job: what it may use (docs/hpc.md)
        if alloc is not None and alloc.memory:
            total = min(total, alloc.memory)
        return total

    def request(self, task: Task, key) -> Request:
        # queueable: a 1-core executable may wait behind another on its CPU's runner
        memory = task.memory_bytes
        cores = task.reserved_cores
        queueable = (cores == 1 and not task.gpus and not memory and task.function is None
                     and not task.mpi)
        return Request(key, cores, task.gpus, memory, queueable)

    def refusal(self, task: Task, sched: Scheduler) -> str | None:
        if task.mpi and isinstance(self.rank_launcher, mpi.NotFound):
            return f"is an MPI task (ranks={task.ranks}) but {self.rank_launcher.why}"
        why = sched.impossible(self.request(task, 0))
        if why and task.mpi:
            return (f"{why} ({task.ranks} ranks x {task.cores_per_rank} cores per rank; "
                    f"the largest node has {len(sched.cpus)} cores)")
        return why

    def start(self, items: list[Item], on_done: Callable) -> list[tuple[Item, Failure]]:
        """Hand executables to the runner threads (runners.py): the runner of the first granted
        CPU spawns it (pinned) and reaps it; SPAWNED/EXITED come back as ``events``."""
        if self.runners is None:
            self.runners = Runners(self.cpus, wait=self.launcher.wait, wake=self.wake,
                                   kill=self.launcher.kill, started=process_start)
        for item in items:
            self.runners.submit(item, item.grant.cpus, functools.partial(self._spawn, item))
        return []

    def _spawn(self, item: Item) -> int | tuple:
        """Sandbox, staging, spawn: the pid (or pid, exit code and usage of a child already reaped,
        see Runners.submit); raises LaunchError (or a bug).  Runs on a runner
        thread: touches only this item, its files and the launcher's spawn path."""
        t = item.task
        self.launcher.make_sandbox(item.uid)
        inputs = t.staged_inputs()
        if inputs:
            self.launcher.stage_in(inputs, item.sandbox, self.refs.resolve)
        args = [self.refs.resolve_all(str(a)) for a in t.arguments]
        stdin = self.refs.stdin(t, item.sandbox)
        ranks = None
        if t.mpi:
            ranks = (self.rank_launcher, mpi.local_placement(t.ranks, t.cores_per_rank, item.grant.cpus))
        return self.launcher.spawn(t, item.uid, item.sandbox, item.grant.gpus, args, stdin, QUICK_S,
                                   ranks=ranks)

    def function(self, item: Item, fn: Callable) -> tuple[Callable, dict | None]:
        if item.task.cores > 1:  # N CPUs: affinity + OMP/BLAS threads, as for executables
            fn = functools.partial(with_cpus, fn, item.grant.cpus, item.task.cores)
        return fn, None

    def future_outcome(self, item: Item, fut) -> Outcome | None:
        return function_outcome(item, fut)  # only function tasks have futures here

    def exit_outcome(self, item: Item, code: int, timed_out: bool) -> Outcome:
        sandbox = item.sandbox
        task = item.task
        if timed_out or code != 0:
            err = tail(os.path.join(sandbox, task.stderr_file))
            if task.mpi and self.rank_launcher.kind is not mpi.LauncherKind.NONE:
                err = rank_tails(sandbox, task.ranks, err)
            return item, exit_failure(task.timeout, code, timed_out, err, item.attempt), None
        try:
            outputs = self.launcher.outputs(task, sandbox) if task.outputs else None
        except LaunchError as exc:
            return item, Failure(exc.kind, exc.message, 0, "", item.attempt), None
        if task.stage_out:
            failed = _stage_out(item, self.refs, self.launcher.cwd)
            if failed is not None:
                return failed
        return item, None, (0, outputs)

    @property
    def events(self):
        return self.runners.events if self.runners is not None else ()

    @property
    def busy(self) -> bool:
        return self.runners is not None and bool(self.runners.busy or self.runners.events)

    def kill(self, pid: int) -> None:
        self.runners.kill(pid)

    def stop_new(self) -> bool:
        """The runners start nothing more; False when no executable ever started here."""
        if self.runners is None:
            return False
        self.runners.stop_new()
        return True

    def begin(self, walltime_at: float | None) -> None:
        pass  # the engine drains local processes itself at the walltime

    def notes(self) -> list:
        return []  # no batch jobs

    def end(self) -> bool:
        return False

    def ends_on_node(self, item: Item, walltime_at: float | None) -> bool:
        return False

    def abandon(self, item: Item) -> None:
        if item.future is None or item.future is False:
            self.runners.kill(item.pid)

    def close(self) -> None:
        if self.runners is not None:
            self.runners.close()
            self.runners = None


class DaskLaunch:
    """Executables as pilot tasks on a dask pilot's nodes (remote.py)."""

    kind = LaunchKind.DASK

    def __init__(self, pilot, launcher: Launcher, refs: Refs, node_specs=()):
        self.pilot = pilot
        self.launcher = launcher
        self.refs = refs
        self.node_specs = tuple(node_specs)  # the pilot's nodes when known (nodes.NodeSpec)
        self.job_log = JobLog()  # its batch jobs' notes -> the journal
        self.walltime_at: float | None = None  # set by the engine when the run starts (the nodes kill then)
        self.slot_count = 0

    def slots(self, config: EngineConfig) -> list[int]:
        cpus = dask_slots(self.pilot, config.cores, config.gpus)
        self.slot_count = len(cpus)
        return cpus

    def memory_total(self, config: EngineConfig) -> int:
        return config.memory or 0  # not tracked unless given: the driver does not know the nodes'

    def request(self, task: Task, key) -> Request:
        # GPUs are dask worker resources (remote.dask_resources), not the driver's
        return Request(key, task.reserved_cores, 0, task.memory_bytes, False)

    def refusal(self, task: Task, sched: Scheduler) -> str | None:
        if task.mpi:
            return ("is an MPI task (ranks=): MPI tasks run on a local pilot, also inside a "
                    "SLURM allocation (srun); a dask pilot does not start ranks")
        if self.node_specs:  # cores and memory are reserved on ONE node
            why = nodes.refusal("T", task.cores, task.memory_bytes or 0, self.node_specs)
            if why:
                return why.removeprefix("task T ")  # the walker names the task
        why = sched.impossible(self.request(task, 0))
        if why and task.cores > len(sched.cpus):
            return (f"asks for {task.cores} cores but the dask pilot has "
                    f"{len(sched.cpus)} slots (pilot.workers)")
        return why

    def start(self, items: list[Item], on_done: Callable) -> list[tuple[Item, Failure]]:
        """Submit each attempt to the pilot: ``run_executable`` on some node (remote.py)."""
        failed = []
        for item in items:
            t = item.task
            spec = ExecSpec(
                uid=item.uid, executable=t.executable,
                arguments=tuple(self.refs.resolve_all(str(a)) for a in t.arguments),
                sandbox=item.sandbox, cwd=self.launcher.cwd, cores=t.cores,
                environment=tuple((str(k), str(v)) for k, v in t.environment.items()),
                pre_exec=tuple(t.pre_exec), post_exec=tuple(t.post_exec),
                inputs=tuple((inp, self.refs.resolve(inp.source)) for inp in t.staged_inputs()),
                stdin=self.refs.stdin(t, item.sandbox), outputs=tuple(t.outputs), timeout=t.timeout,
                walltime_at=self.walltime_at, shell=t._shell, shared=self.launcher.shared,
                stdout=t.stdout_file, stderr=t.stderr_file)
            try:
                gpus = dask_resources(t)  # {"GPU": k}: a dask worker resource
                submit = self.pilot.options(resources=gpus).submit if gpus else self.pilot.submit
                fut = submit(run_executable, spec)
            except Exception as exc:
                failed.append((item, Failure(FailureKind.SPAWN, f"cannot submit to the dask pilot: "
                                             f"{exc!r}", attempt=item.attempt)))
                continue
            item.future = fut
            on_done(item)
        return failed

    def function(self, item: Item, fn: Callable) -> tuple[Callable, dict | None]:
        ship_code(item.task.function)  # a module beside the workflow travels to the dask workers
        return fn, dask_resources(item.task)

    def future_outcome(self, item: Item, fut) -> Outcome | None:
        """(item, failure, value) of an attempt; for an executable run on a node, classified
        exactly as ``LocalLaunch.exit_outcome`` classifies a local one; None when its node
        killed it at the walltime."""
        if item.task.kind is TaskKind.FUNCTION or fut.exception() is not None:
            return function_outcome(item, fut)  # (an executable lost with its dask workers, ...)
        out = fut.result()
        if out.ended is Ended.WALLTIME:
            return None
        item.usage = out.usage
        if out.ended is Ended.NOT_STARTED:
            return item, Failure(out.failure, out.message, attempt=item.attempt), None
        failure = exit_failure(item.task.timeout, out.exit_code, out.ended is Ended.TIMED_OUT,
                               out.stderr_tail, item.attempt)
        if failure is not None:
            return item, failure, None
        if out.failure is not None:  # declared outputs missing after exit 0
            return item, Failure(out.failure, out.message, 0, "", item.attempt), None
        if item.task.stage_out:  # copied by the driver: the sandbox is on a shared filesystem
            failed = _stage_out(item, self.refs, self.launcher.cwd)
            if failed is not None:
                return failed
        return item, None, (0, list(out.outputs) if out.outputs else None)

    def exit_outcome(self, item: Item, code: int, timed_out: bool) -> Outcome:
        raise AssertionError("a dask pilot's executables end through their futures, not exit events")

    events = ()
    busy = False

    def kill(self, pid: int) -> None:
        raise AssertionError("a dask pilot's executables run on its nodes, not as the driver's children")

    def stop_new(self) -> bool:
        return False

    def begin(self, walltime_at: float | None) -> None:
        self.walltime_at = walltime_at  # the nodes kill the executables then (ExecSpec)
        self.job_log.attach()

    def notes(self) -> list:
        """What the pilot's job watch and scaler said since the last call."""
        return self.job_log.take()

    def end(self) -> bool:
        self.job_log.detach()
        return True

    def ends_on_node(self, item: Item, walltime_at: float | None) -> bool:
        """True when ``item`` is an executable running on a node that kills it at the
        walltime (remote.py) within ``NODE_KILL_GRACE_S`` from now."""
        return (item.task.kind is TaskKind.EXECUTABLE and walltime_at is not None
                and walltime_at - time.time() < NODE_KILL_GRACE_S)

    def abandon(self, item: Item) -> None:
        if item.future is not None and item.future is not False:  # queued on the cluster: do not
            item.future.cancel()  # let it start after we are gone

    def close(self) -> None:
        pass


def choose(pilot, launcher: Launcher, refs: Refs, config: EngineConfig, node_specs=(), *,
           wake: Callable[[], None]) -> Launch:
    """The run's way of launching, decided once from its pilot (module docstring); ``wake``
    pokes the engine's loop when a local runner reports."""
    if pilot is not None and pilot.backend is shoal.BackendKind.DASK:
        return DaskLaunch(pilot, launcher, refs, node_specs)
    return LocalLaunch(pilot, launcher, refs, config.launcher, wake)


__all__ = ["Launch", "LaunchKind", "LocalLaunch", "DaskLaunch", "choose", "function_outcome",
           "Outcome", "NODE_KILL_GRACE_S"]
