"""The ensemble engine: walks pipelines, journals, places, launches, reaps.  Driver thread only.

Data flow (one loop, one thread; the pilot's result threads only poke a pipe)::

    workflow ──lazily──► active pipelines ──current stage's task iterator──► waiting (≤ window)
    waiting ──deps/when──► Scheduler.place ──► journal RUNNING + commit ──► spawn / pilot.submit
    runner events + wake pipe ──poll──► reap ──► journal DONE/FAILED/retry ──► release cores,
                                          stage barrier, post_exec(ctx), next stage

Invariants:
  * write-ahead: a state is committed to the journal before the engine acts
    on it (spawn after RUNNING is durable; successors after DONE is durable);
  * bounded memory: at most ``window`` tasks are materialised (waiting) plus
    the running ones; finished tasks live only in the journal; at most
    ``max_pipelines`` pipelines are pulled from a lazy workflow at a time;
  * cores/GPUs/memory are never over-committed (the pure Scheduler), and a
    request that can never fit fails at submission with a clear reason;
  * a failure stays in its pipeline: the pipeline stops after a stage with a
    FAILED task; other pipelines go on.

The pipeline/stage half (pulling pipelines and tasks, the stage barrier,
``after=``/``when=`` of stages, callbacks) is a separate object, ``Walker``
(walker.py), which hands tasks over through the ``Intake`` protocol that this
``Engine`` implements (``has_room``/``admit``/``impossible``) and is told when
each one is settled; walker.py's docstring has the whole interface and who
owns what.  This module places, launches, reaps and journals the tasks.

Two ways to launch an executable, chosen once per run from the pilot: on the
local backend a runner thread of the driver spawns it (runners.py: one thread
per CPU, pinned, so the child is pinned to the cores the Scheduler granted;
the thread reaps it with a blocking ``waitpid`` and posts SPAWNED/EXITED
events that this loop journals); on a dask pilot it becomes a
pilot task (remote.py: ``run_executable`` on a node, reaped like a function
task through its future) and the Scheduler's "cores" are slots, one per shoal
worker of the cluster (``pilot.workers``): the driver cannot see or pin the
nodes' CPUs; a task's ``gpus=k`` becomes the dask worker resource ``GPU=k``
(``remote.dask_resources``), which dask accounts on the nodes.  Everything
else — journal, stages, retries, reports — is the same code on both.

Resume replays the workflow definition: tasks whose journal row is terminal
are counted, not run; a stage whose tasks are all terminal runs its
``post_exec`` again (so callbacks must be functions of the results, which the
journal stores).  Rows left RUNNING by a dead driver are re-run.

Journal writes are grouped per loop pass: the DONE/FAILED rows of what ended
and the RUNNING rows of what starts next share one transaction, committed
before anything starts (so DONE is durable before a successor runs, RUNNING
before its process exists); the pids the runners report are written in the
next pass's transaction.

Queueing behind (``_may_queue``): while the run's finished attempts average under
QUEUE_BELOW_S and no walltime is set, a 1-core local executable may be placed on a CPU whose
current task is another such executable; it is journaled RUNNING in that pass, like any task
placed, and its runner starts it as soon as the current one ends, without a driver pass in
between; if the current one outlives the runner's quick window (5 ms) instead, the runner
answers the queued task BOUNCED and the engine places it again (first in line), so a task
never waits behind one of unknown length while another CPU frees up.  Measured (2,000 x ``/bin/true``, 2 cores, before queueing existed): the runners waited
15% of their time for the driver, and the driver made one pass, one commit and one wake-up
per task; with queueing, a pass handles several tasks and the Python process's CPU per task
fell from ~0.24 to ~0.17 ms.  A queued task shows as running in ``shoal status`` for the
(short) time it waits; its timeout counts from its own start.

Rejected alternatives: a thread per running task (thousands of threads for
long-running ensembles; runners are one per CPU); ``waitpid(-1)`` / SIGCHLD
(would reap the pilot's own workers); submitting every function task to the pilot at once (unbounded
memory, and no core accounting against executables).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import dataclasses
import fcntl
import functools
import heapq
import os
import select
import shutil
import sys
import threading
import time
from collections.abc import Callable

import shoal
from shoal._backoff import check_retry_delay, retry_delay

from . import mpi, nodes, pilot_jobs
from .functions import ship_code, with_cpus
from .identity import count_tasks, diff_plans, diff_specs, listed_keys, plan_of, spec_text
from .journal import Journal
from .launcher import (
    Launcher,
    LaunchError,
    check_root,
    exit_failure,
    kill_leftover,
    process_start,
    stage_out,
    tail,
)
from .model import (
    EMBEDDED_REF_RE,
    EnsembleError,
    Failure,
    FailureKind,
    Task,
    TaskKind,
    TaskState,
    as_pipelines,
    parse_ref,
)
from .pilot_jobs import JobLog
from .progress import progress_callback, progress_record
from .remote import Ended, ExecSpec, dask_resources, dask_slots, run_executable
from .report import Report, Results
from .runners import BOUNCED, NOT_STARTED, QUICK_S, Event, Runners
from .scheduler import Request, Scheduler, Waiting
from .usage import HOST, NONE, Usage, measuring, of_exception, of_row
from .values import Values
from .walker import Item, Walker

NODE_KILL_GRACE_S = 10.0  # a drain waits this long past the walltime for nodes to report their kills
QUEUE_BELOW_S = 0.05  # queue a CPU's next task behind its current one while tasks average less


def script_resume_command() -> str:
    """How to finish a run started by a script that calls ``run()`` (or EnTK's
    ``AppManager.run()``): the same command line again with ``SHOAL_RESUME=1``, which makes
    ``run()`` resume the journal instead of refusing it or starting afresh.  ``shoal run``
    passes its own ``shoal run ... --resume`` instead."""
    import shlex

    if not script_can_rerun():
        return NO_COMMAND_TO_REPEAT
    try:
        import psutil

        argv = psutil.Process().cmdline()
    except Exception:  # pragma: no cover - psutil is a dependency
        argv = [sys.executable, *sys.argv]
    return "SHOAL_RESUME=1 " + shlex.join(argv)


# what ``shoal status`` prints after "finish with:" for a driver whose command line does not
# hold its code (`python - < driver.py`, the interactive prompt, a notebook)
NO_COMMAND_TO_REPEAT = ("run the code that started it again with resume=True (or with SHOAL_RESUME=1 "
                        "in its environment); it ran from standard input, a prompt or a notebook, "
                        "so there is no command to repeat")


def script_can_rerun() -> bool:
    """Whether this process's command line runs its code again: not for a script read from
    standard input (``python -``), the interactive prompt or a notebook kernel."""
    if sys.argv[:1] in ([""], ["-"]):  # the prompt (argv ['']), a script on stdin (['-'])
        return False
    return not sys.argv[0].endswith("ipykernel_launcher.py")  # a Jupyter kernel


class Engine:
    """One run of a workflow.  Use ``shoal.ensemble.run``; owner only (one thread).

    The ``Intake`` of its ``Walker`` (``has_room``, ``admit``, ``impossible``)."""

    def __init__(self, workflow, *, pilot=None, journal: str = "run.db", resume: bool = False,
                 workers: int | None = None, cores=None, gpus: int = 0, memory=None,
                 walltime: float | None = None, sandbox: str | None = None, window: int | None = None,
                 max_pipelines: int = 4096, durability: str = "normal",
                 progress: Callable[[dict], None] | bool | None = None, patience: int = 64,
                 new: bool = False, retry_failed: bool = False, values="data", shared_data=(),
                 launcher=None, resume_command: str | None = None, retries: int = 0, retry_delay=None,
                 node_specs=(), reuse: bool = False, cache: str | None = None):
        self.node_specs = tuple(node_specs)  # the dask pilot's nodes when known (nodes.NodeSpec)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise EnsembleError(f"run(retries=): must be an integer >= 0 (each task's default), got {retries!r}")
        try:
            self.retry_delay = check_retry_delay(retry_delay, "run(retry_delay=)")
        except ValueError as exc:
            raise EnsembleError(str(exc)) from None
        self.retries = retries
        self.retry_due: list[float] = []  # heap: when delayed retries become placeable (monotonic)
        if retry_failed and not resume:
            raise EnsembleError("retry_failed=True (--retry-failed) re-runs the failed tasks of a "
                                "journaled run: it needs resume=True (--resume)")
        if new and resume:
            raise EnsembleError("new=True (--new) starts a fresh run and resume=True (--resume) finishes "
                                "the journaled one: choose one")
        pipelines = as_pipelines(workflow)
        specs: dict = {}  # each listed task's spec, computed once: for the identity and its journal row
        self.plan, self.identity = plan_of(pipelines, specs)
        self.workflow_list = pipelines if isinstance(pipelines, list | tuple) else []
        self.user_pilot = pilot
        self.pilot = pilot
        self.workers = workers
        self.remote = pilot is not None and pilot.backend is shoal.BackendKind.DASK
        self.job_log = JobLog() if self.remote else None  # its batch jobs' notes -> the journal
        if self.remote:
            cpus = dask_slots(pilot, cores, gpus)
        elif cores is None:
            cpus = (pilot.topology if pilot is not None else shoal.topology()).usable_cpus
            if workers is not None and pilot is None:
                cpus = cpus[:workers] if workers <= len(cpus) else list(range(workers))
        elif isinstance(cores, int):
            cpus = list(range(cores))
        else:
            cpus = list(cores)
        if memory is None and self.remote:
            memory_total = 0  # not tracked: the driver does not know the nodes' memory
        elif memory is None:
            import psutil

            memory_total = psutil.virtual_memory().total
            alloc = shoal.allocation()  # inside a batch job: what it may use (docs/hpc.md)
            if alloc is not None and alloc.memory:
                memory_total = min(memory_total, alloc.memory)
        else:
            from .model import parse_size

            memory_total = parse_size(memory, "run(memory=)")
        self.sched = Scheduler(cpus, gpus=gpus, memory=memory_total, patience=patience)
        self.window = window or max(64, 8 * len(self.sched.cpus))
        self.walltime = walltime
        self.journal_path = journal
        root = sandbox or os.path.splitext(os.path.abspath(journal))[0] + ".sandbox"
        check_root(root)
        self.launcher = Launcher(root, gpus=gpus)
        self.launcher_kind = mpi.parse_kind(launcher)
        self._rank_launcher = None  # chosen on the first MPI task (mpi.choose), then kept
        self.runners: Runners | None = None  # started with the first local executable
        self.starting: dict[int, Item] = {}  # id(item) -> handed to a runner, no SPAWNED yet
        self.progress = progress_callback(progress)
        self.resume = resume
        self.retry_failed = retry_failed
        self.resume_command = resume_command or script_resume_command()
        self.journal = Journal(journal, resume=resume, durability=durability, values=Values.parse(values),
                               new=new, sandbox=root)
        try:
            self._check_identity()
        except BaseException:
            self.journal.close(ended=False)
            raise
        try:
            self._stage_shared(shared_data)
        except BaseException:
            self.journal.close(ended=False)
            raise
        self.reuse = None  # --reuse / --cache: reuse.py keys each task before its first attempt
        if reuse or cache is not None:
            from .reuse import Reuse

            try:
                self.reuse = Reuse(self.journal, self.launcher, self._resolve, previous=reuse, cache=cache)
            except BaseException:
                self.journal.close(ended=False)
                raise
        self.results = Results(self.journal, self.launcher)
        self.waiting = Waiting()  # by priority, then arrival (scheduler.py)
        self.running: dict[int, Item] = {}  # pid or id(future) -> item
        self.walker = Walker(iter(pipelines), self, journal=self.journal, journal_path=journal,
                             results=self.results, plan_pipes=list(self.workflow_list), plan=self.plan,
                             total=count_tasks(pipelines), max_pipelines=max_pipelines, replay=resume,
                             specs=specs)
        self.finished_futures: collections.deque = collections.deque()
        self.measured_fns: dict[int, tuple] = {}  # id(function) -> (function, its measured_call)
        self.wake_r, self.wake_w = os.pipe()
        self.wake_lock = threading.Lock()
        self.wake_closed = False
        self.sleeping = False  # the loop is in (or about to enter) its poll: see _sleep
        for fd in (self.wake_r, self.wake_w):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
            os.set_inheritable(fd, False)
        self.poller = select.poll()
        self.poller.register(self.wake_r, select.POLLIN)
        self.draining = False
        self.durations = [0.0, 0]  # sum, count of finished attempts (walltime estimates)
        self.session_counts = collections.Counter()
        self._last_progress = 0.0
        self.moves = 0  # progress counter: a loop pass that moves nothing with nothing running is stuck
        self.interrupted: str | None = None  # the signal's name once SIGINT/SIGTERM asked to drain
        self.drain_reason: str | None = None

    def _check_identity(self) -> None:
        """Refuse to resume a journal that holds another workflow; record this one's plan."""
        if self.resume:
            old_plan, old_id = self.journal.plan()
            if old_id and self.identity and old_id != self.identity:
                diffs = diff_plans(old_plan, self.plan) or self._spec_diffs()
                raise EnsembleError(
                    f"journal {self.journal_path} holds another workflow (identity {old_id}, this one "
                    f"{self.identity}): {'; '.join(diffs) or 'the tasks differ'}. Resume with the workflow "
                    "that started it, or start afresh with new=True (shoal run --new; the old journal is "
                    "kept under a dated name)")
            if self.plan is None and old_plan is not None:
                self.plan = old_plan
        self.journal.set_plan(self.plan, self.identity)
        self.journal.set_meta("resume_command", self.resume_command)
        # where to run it: none for a sentence (NO_COMMAND_TO_REPEAT), which no `cd` precedes
        self.journal.set_meta("resume_cwd", "" if self.resume_command == NO_COMMAND_TO_REPEAT else os.getcwd())
        self.journal.commit()

    def _spec_diffs(self, limit: int = 3) -> list[str]:
        out = []
        for _puid, stages in listed_keys(self.workflow_list):
            for _suid, tasks in stages:
                for uid, t in tasks or ():
                    row = self.journal.replay_row(uid) if uid is not None else None
                    if row is not None and row[2] is not None and row[2] != spec_text(t):
                        out.append(diff_specs(uid, row[2], spec_text(t)))
                        if len(out) >= limit:
                            return out
        return out

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> Report:
        t0 = time.monotonic()
        self.deadline = t0 + self.walltime if self.walltime else None
        wall0 = time.time()
        self.walltime_at = wall0 + self.walltime if self.walltime else None  # for the nodes
        restore = self._catch_signals()
        if self.job_log is not None:
            self.job_log.attach()
        try:
            if self.resume:
                for uid, pid, start in self.journal.take_over(self.retry_failed):
                    kill_leftover(pid, start, uid, self.launcher.sandbox_of(uid) if isinstance(uid, str) else None)
            while True:
                before = self._moves()
                if self.interrupted and not self.draining:
                    self.drain_reason = f"interrupted by {self.interrupted}"
                    self._stop_for_walltime()
                self.walker.fill()
                self._schedule()
                self.journal.commit()  # what _reap and _schedule wrote, if _schedule did not
                if not self.running and not self.finished_futures and not self.starting and not self._events():
                    if self._finished() or self.draining:
                        break
                    if self._next_retry() is not None:  # nothing runs: wait out a retry_delay
                        self._wait()
                        continue
                    if self._moves() == before:
                        raise EnsembleError(self._stuck_message())
                    continue
                self._wait()
                self._reap()
                self._report_progress(t0)
            self._report_progress(t0, force=True)
            # the report's seconds end where the last progress line's do (its tasks/s is the
            # same number), before the pilot is closed
            wall_s = time.monotonic() - t0
            drained = self.draining and not self._finished()
        except BaseException:
            self._abort()
            raise
        finally:
            restore()
            if self.job_log is not None:
                self.job_log.detach()
                with contextlib.suppress(Exception):  # an aborted run's journal may be gone
                    self._journal_job_notes()
            self._close_resources()
        outputs, failures = self.journal.outputs(), list(self.journal.failures(limit=1000))
        self.journal.close()  # the session ends: the status below reads a stopped run, not a live one
        report = Report.from_journal(self.journal_path, wall0, wall_s, drained, self.session_counts,
                                     outputs=outputs, failures=failures)
        report.drain_reason = self.drain_reason if drained else None
        report.interrupted = self.interrupted if drained else None
        return report

    def _catch_signals(self):
        """SIGINT (Ctrl-C) / SIGTERM: drain like the walltime (kill what runs, leave it PENDING,
        journal, report); a second one aborts at once.  One the caller ignores (SIG_IGN) is left
        ignored.  Main thread only; returns the undo."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        import signal

        def handler(signum, frame):
            if self.interrupted:  # the second Ctrl-C: stop now (the journal stays resumable)
                raise KeyboardInterrupt
            self.interrupted = signal.Signals(signum).name
            # Never wait for wake_lock here: the handler runs on the main thread, which may
            # hold it (``_poke``, ``_close_resources``) -- a plain ``with`` deadlocked there.
            # Held by anyone, the lock means a wake-up byte is being written or the loop is
            # closing; either way the loop sees ``interrupted`` without this write.
            if self.wake_lock.acquire(blocking=False):
                try:
                    if not self.wake_closed:
                        with contextlib.suppress(OSError):
                            os.write(self.wake_w, b"x")
                finally:
                    self.wake_lock.release()

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is signal.SIG_IGN:  # the caller ignores it (trap '' INT, a
                continue  # script's background job, nohup): it stays ignored
            old[sig] = signal.signal(sig, handler)

        def restore():
            for sig, h in old.items():
                signal.signal(sig, h)
        return restore

    def _stage_shared(self, shared_data) -> None:
        """EnTK's ``appman.shared_data``: copy each ``'path'`` / ``'path > name'`` into the shared
        area (after the journal moved an old run's sandbox aside: ``new``), every run, so a resume
        sees the files as they are now."""
        if not shared_data:
            return
        os.makedirs(self.launcher.shared, exist_ok=True)
        for entry in shared_data:
            src, _, dst = (x.strip() for x in str(entry).partition(">"))
            src = src.rstrip("/")
            target = os.path.join(self.launcher.shared, dst or os.path.basename(src))
            try:
                if os.path.isdir(src):
                    shutil.copytree(src, target, dirs_exist_ok=True)
                else:
                    shutil.copy2(src, target)
            except OSError as exc:
                raise EnsembleError(f"shared_data {entry!r}: cannot copy {src} into the shared area: "
                                    f"{exc.strerror or exc}") from None

    def _finished(self) -> bool:
        return (self.walker.finished and not self.waiting and not self.running and not self.starting
                and not self._events())

    def _events(self):
        return self.runners.events if self.runners is not None else ()

    def _moves(self) -> int:
        """Progress counter: a loop pass that moves nothing with nothing running is stuck."""
        return self.moves + self.walker.moves

    def _stuck_message(self) -> str:
        blocked = [f"{it.uid} (after {', '.join(it.deps)})" for it in list(self.waiting.values())[:5]]
        stages = self.walker.active_stages()[:5]
        suspended = self.walker.suspended()[:5]
        if suspended:
            return (f"the workflow cannot progress: pipelines {', '.join(suspended)} are suspended "
                    "(Pipeline.suspend()) and nothing runs whose post_exec could resume() them")
        return ("the workflow cannot progress: nothing runs and the waiting tasks' dependencies "
                f"never complete: {blocked or stages}. after= must name tasks, stages or pipelines "
                "that come earlier in the workflow")

    # -- the Intake the walker feeds ---------------------------------------------------
    def has_room(self) -> bool:
        return len(self.waiting) < self.window

    def admit(self, item: Item) -> None:
        self._run_defaults(item)
        self.waiting[id(item)] = item

    def _run_defaults(self, item: Item) -> None:
        """What neither the task nor its stage gives: the run's retries and retry_delay."""
        if item.retries is None:
            item.retries = self.retries
        if item.retry_delay is None:
            item.retry_delay = self.retry_delay

    def shared_sandbox(self, uid: str, directory: str) -> None:
        self.launcher.shared_sandbox(uid, directory)

    def _settle(self, item: Item, state: TaskState) -> None:
        self.session_counts[state] += 1
        self.walker.settled(item, state)

    def _request(self, task: Task, key) -> Request:
        # on dask, GPUs are dask worker resources (remote.dask_resources), not the driver's;
        # queueable: a 1-core local executable may wait behind another on its CPU's runner
        memory = task.memory_bytes
        cores = task.reserved_cores
        queueable = (not self.remote and cores == 1 and not task.gpus and not memory
                     and task.function is None and not task.mpi)
        return Request(key, cores, 0 if self.remote else task.gpus, memory, queueable)

    @property
    def rank_launcher(self):
        """How this run starts MPI tasks' ranks: chosen once (mpi.choose), on first use."""
        if self._rank_launcher is None:
            self._rank_launcher = mpi.choose(self.launcher_kind)
        return self._rank_launcher

    def _may_queue(self) -> bool:
        """Hand each CPU's runner its next task before the current one ends (Scheduler: queueing
        behind)?  Only while this run's tasks are short (the mean of its finished attempts under
        QUEUE_BELOW_S: a queued task shows as running that long before it starts) and no walltime
        is set (its drain estimates assume a task starts when placed), and while the waiting tasks
        have one priority: a task queued behind a CPU's current one is bounced back when that one
        runs long, and would start after a task of lower priority placed on a CPU that freed up
        meanwhile (seen: 1 of 10 high-priority tasks starting after the first of 100 low ones)."""
        total, n = self.durations
        return (n > 0 and total < QUEUE_BELOW_S * n and self.deadline is None and not self.draining
                and len(self.waiting.order) <= 1)

    def _item_request(self, item: Item) -> Request:
        if item.request is None:
            item.request = self._request(item.task, id(item))
        return item.request

    def impossible(self, task: Task) -> str | None:
        """Why ``task`` can never be placed on this run's resources (None if it can)."""
        if task.mpi and self.remote:
            return ("is an MPI task (ranks=): MPI tasks run on a local pilot, also inside a "
                    "SLURM allocation (srun); a dask pilot does not start ranks")
        if task.mpi and isinstance(self.rank_launcher, mpi.NotFound):
            return f"is an MPI task (ranks={task.ranks}) but {self.rank_launcher.why}"
        if self.remote and self.node_specs:  # cores and memory are reserved on ONE node
            why = nodes.refusal("T", task.cores, task.memory_bytes or 0, self.node_specs)
            if why:
                return why.removeprefix("task T ")  # the walker names the task
        why = self.sched.impossible(self._request(task, 0))
        if why and task.mpi:
            return (f"{why} ({task.ranks} ranks x {task.cores_per_rank} cores per rank; "
                    f"the largest node has {len(self.sched.cpus)} cores)")
        if why and self.remote:
            if task.cores > len(self.sched.cpus):
                return (f"asks for {task.cores} cores but the dask pilot has "
                        f"{len(self.sched.cpus)} slots (pilot.workers)")
        return why

    # -- starting ---------------------------------------------------------------------
    def _schedule(self) -> int:
        """Start what may start now; its RUNNING rows and what _reap wrote share one commit,
        made before anything starts."""
        if self.draining or not self.waiting:
            return 0
        grants = self.sched.place(self._candidates(time.monotonic()), queue=self._may_queue())
        if not grants:
            return 0
        items = []
        rows = []
        wall = time.time()
        for p in grants:
            item = self.waiting.pop(p.key)
            item.grant = p
            item.attempt += 1
            t = item.task
            item.sandbox = self.launcher.sandbox_of(item.uid) if t.kind is TaskKind.EXECUTABLE else None
            rows.append((item.uid, item.pipe_uid, item.stage_uid, t.kind.value, item.attempt,
                         item.sandbox, wall, item.spec))
            items.append(item)
        self.journal.running_many(rows)
        self.journal.commit()  # write-ahead: RUNNING (and the last pass's DONE) durable before anything starts
        local_exes = []
        for item in items:
            item.t0 = time.monotonic()
            if item.task.timeout and not item.grant.queued:  # a queued one's starts at its SPAWNED
                item.deadline = item.t0 + item.task.timeout
            if item.task.kind is TaskKind.FUNCTION:
                self._submit(item)
            elif self.remote:
                self._spawn_remote(item)
            else:
                local_exes.append(item)
        if local_exes:
            self._spawn_local(local_exes)
        self.moves += 1
        return len(items)

    def _candidates(self, now: float):
        """The waiting requests that may start now, oldest first, made lazily: the Scheduler stops
        pulling once no CPU is free, so a pass costs O(started), not O(window)."""
        for item in self.waiting.values():
            if id(item) not in self.waiting:
                continue  # settled by an earlier step of this pass
            if item.not_before > now:
                continue  # a retry waiting out its retry_delay
            if item.deps:
                blocked = False
                for dep in item.deps:
                    state = self.walker.dep_state(dep)
                    if state is None or not state.terminal:
                        blocked = True
                        break
                    if state is not TaskState.DONE:
                        self._skip(item, f"dependency {dep} is {state.value}")
                        blocked = True
                        break
                if blocked:
                    continue
            if item.task.when is not None and item.attempt == 0 and not self._when(item):
                continue
            if self.reuse is not None and item.attempt == 0 and self._reused(item):
                continue
            if self.deadline is not None and now + self._estimate(item.task) > self.deadline:
                self.draining = True
                left = max(0.0, self.deadline - now)
                self.drain_reason = (f"walltime: {item.uid} is expected to take "
                                     f"{self._estimate(item.task):.1f}s but {left:.1f}s are left")
                return
            yield self._item_request(item)

    def _reused(self, item: Item) -> bool:
        """``item``'s key matches a finished task (reuse.py): journaled DONE with its recorded
        result, its outputs staged back; never placed."""
        from .reuse import MISS

        value = self.reuse.match(item)
        if value is MISS:
            return False
        item.sandbox = self.launcher.sandbox_of(item.uid) if item.task.kind is TaskKind.EXECUTABLE else None
        if item.task.stage_out:
            try:
                stage_out(self._shared_outputs(item.task.stage_out), item.sandbox, self.launcher.cwd)
            except LaunchError:
                return False  # it runs, and its own stage_out says what is wrong
        self.waiting.pop(id(item), None)
        self.sched.forget(id(item))
        self.journal.running(item.uid, item.pipe_uid, item.stage_uid, item.task.kind.value, 1,
                             item.sandbox, time.time(), item.spec)
        item.attempt = 1
        self.session_counts["reused"] += 1
        self._ended(item, None, value)
        return True

    def _when(self, item: Item) -> bool:
        """Evaluate the task's ``when=``; False (and settled: SKIPPED or FAILED) if it must not run."""
        try:
            if item.task.when(self.results):
                return True
        except Exception as exc:
            self.waiting.pop(id(item), None)
            self.sched.forget(id(item))
            self.journal.running(item.uid, item.pipe_uid, item.stage_uid, item.task.kind.value,
                                 1, None, time.time(), item.spec)
            item.attempt = item.retries + 1  # no retry: the condition, not the task, failed
            self._ended(item, Failure(FailureKind.EXCEPTION, f"when= raised {exc!r} (add the tasks "
                                      "it reads to after=)", attempt=1))
            return False
        self._skip(item, "when= returned false")
        return False

    def _estimate(self, task: Task) -> float:
        """Expected seconds: the task's ``estimate``, else the mean of this run's attempts (capped
        by its ``timeout``, an upper bound and not an estimate), else 0 (start it)."""
        if task.estimate:
            return task.estimate
        if task.mpi and task.timeout:  # an MPI task is never started unless its timeout fits
            return task.timeout
        total, n = self.durations
        mean = total / n if n else 0.0
        return min(mean, task.timeout) if task.timeout else mean

    def _spawn_local(self, items: list[Item]) -> None:
        """Hand local executables to the runner threads (runners.py): the runner of the first
        granted CPU spawns it (pinned) and reaps it; SPAWNED/EXITED come back as events."""
        if self.runners is None:
            self.runners = Runners(self.sched.cpus, wait=self.launcher.wait, wake=self._poke,
                                   kill=self.launcher.kill, started=process_start)
        for item in items:
            self.starting[id(item)] = item
            self.runners.submit(item, item.grant.cpus, functools.partial(self._launch, item))

    def _poke(self) -> None:
        """Wake the loop's poll (any thread, after appending its event; never blocks).  Only
        while the loop sleeps (``_sleep``): a loop that is awake sees the event on its next pass,
        which spares a pipe write, a poll wake-up and a read per task."""
        if not self.sleeping:
            return
        with self.wake_lock:
            if not self.wake_closed:
                try:
                    os.write(self.wake_w, b"x")
                except OSError:  # full (the loop wakes anyway) or closed
                    pass

    def _launch(self, item: Item) -> int | tuple:
        """Sandbox, staging, spawn: the pid (or pid, exit code and usage of a child already reaped,
        see Runners.submit); raises LaunchError (or a bug).  Runs on a runner
        thread: touches only this item, its files and the launcher's spawn path."""
        t = item.task
        self.launcher.make_sandbox(item.uid)
        inputs = t.staged_inputs()
        if inputs:
            self.launcher.stage_in(inputs, item.sandbox, self._resolve)
        args = [self._resolve_all(str(a)) for a in t.arguments]
        stdin = self._resolve(t.stdin) if t.stdin else None
        if stdin is not None and not os.path.isabs(stdin):
            stdin = os.path.join(item.sandbox, stdin)
        ranks = None
        if t.mpi:
            ranks = (self.rank_launcher, mpi.local_placement(t.ranks, t.cores_per_rank, item.grant.cpus))
        return self.launcher.spawn(t, item.uid, item.sandbox, item.grant.gpus, args, stdin, QUICK_S,
                                   ranks=ranks)

    def _take_events(self, ended: list, *, stopping: bool = False) -> None:
        """Journal what the runners reported: SPAWNED -> the pid (running; killed at once when
        ``stopping``), a launch failure (ended) or NOT_STARTED; EXITED -> ``ended``, or, when
        ``stopping``, released and left PENDING."""
        events = self._events()
        batch = []
        while events:
            batch.append(events.popleft())
        exited = {id(e[1]) for e in batch if e[0] is Event.EXITED}
        error = None
        for kind, item, a, b in batch:
            try:  # every event of the batch is handled even if one raises (on_retry, a bug):
                self._take_event(kind, item, a, b, exited, ended, stopping)  # none is lost
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error

    def _take_event(self, kind, item: Item, a, b, exited, ended, stopping) -> None:
        if kind is Event.SPAWNED:
            self.starting.pop(id(item), None)
            if isinstance(a, int):
                item.pid = a
                self.running[a] = item
                if item.grant.queued:  # it waited behind its CPU's previous task: its clock starts now
                    item.t0 = time.monotonic()
                    if item.task.timeout:
                        item.deadline = item.t0 + item.task.timeout
                if id(item) not in exited:
                    self.journal.pid(item.uid, a, b)  # a resume after a crash kills it
                    self.sched.mark_long(item.grant)  # nothing more queues behind it
                if stopping:
                    self.runners.kill(a)
                return
            self.sched.release(item.grant)
            if a is BOUNCED and not (stopping or self.draining):  # queued behind a long task:
                self.journal.unstart(item.uid)  # PENDING until placed again, first in line
                item.attempt -= 1
                item.grant = item.deadline = None
                self.waiting[id(item)] = item
                self.waiting.move_to_end(id(item), last=False)
                self.moves += 1
            elif a is NOT_STARTED or a is BOUNCED:
                self.journal.unstart(item.uid)
            elif isinstance(a, LaunchError):
                self._ended(item, Failure(a.kind, a.message, attempt=item.attempt))
            else:
                raise a  # a bug in the launch path
        elif stopping:
            self.running.pop(item.pid, None)
            self.sched.release(item.grant)
            self.journal.unstart(item.uid)
        else:  # b: what it used (None: not measured, e.g. a spawn helper built without rusage)
            node = "cpus " + ",".join(map(str, sorted(item.grant.cpus)))
            item.usage = dataclasses.replace(b or Usage(host=HOST), node=node)
            ended.append(self._exe_outcome(item, a))

    def _stop_local(self) -> None:
        """Kill every local executable, started or being started, and wait until the runners
        have reaped each one (or answered NOT_STARTED); they are left PENDING for a resume."""
        if self.runners is None:
            return
        self.runners.stop_new()
        ended: list = []
        self._take_events(ended)  # exits already reported: journaled normally
        for item, failure, value in ended:
            self._finish_attempt(item, failure, value, time.monotonic())
        for item in list(self.running.values()):
            if item.future is None or item.future is False:
                self.runners.kill(item.pid)  # a no-op for a pid already seen exiting
        while self.runners.busy or self.runners.events:  # the runners' count, not ours: nothing
            self._sleep(100)  # the engine lost track of can make this wait forever
            self._take_events([], stopping=True)
        for key, item in list(self.running.items()):  # reaped, their events consumed by a pass
            if item.future is None or item.future is False:  # that raised: PENDING for a resume
                del self.running[key]
                self.sched.release(item.grant)
                self.journal.unstart(item.uid)
        self.starting.clear()

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 65536):
                pass
        except BlockingIOError:
            pass

    def _spawn_remote(self, item: Item) -> bool:
        """Submit the attempt to the dask pilot: ``run_executable`` on some node (remote.py)."""
        t = item.task
        stdin = self._resolve(t.stdin) if t.stdin else None
        if stdin is not None and not os.path.isabs(stdin):
            stdin = os.path.join(item.sandbox, stdin)
        spec = ExecSpec(
            uid=item.uid, executable=t.executable,
            arguments=tuple(self._resolve_all(str(a)) for a in t.arguments),
            sandbox=item.sandbox, cwd=self.launcher.cwd, cores=t.cores,
            environment=tuple((str(k), str(v)) for k, v in t.environment.items()),
            pre_exec=tuple(t.pre_exec), post_exec=tuple(t.post_exec),
            inputs=tuple((inp, self._resolve(inp.source)) for inp in t.staged_inputs()),
            stdin=stdin, outputs=tuple(t.outputs), timeout=t.timeout, walltime_at=self.walltime_at,
            shell=t._shell, shared=self.launcher.shared, stdout=t.stdout_file, stderr=t.stderr_file)
        try:
            gpus = dask_resources(t)  # {"GPU": k}: a dask worker resource
            submit = self.pilot.options(resources=gpus).submit if gpus else self.pilot.submit
            fut = submit(run_executable, spec)
        except Exception as exc:
            self.sched.release(item.grant)
            self._ended(item, Failure(FailureKind.SPAWN, f"cannot submit to the dask pilot: {exc!r}",
                                      attempt=item.attempt))
            return False
        item.future = fut
        self.running[id(fut)] = item
        fut.add_done_callback(self._on_future)
        return True

    def _resolve(self, text: str) -> str:
        if not text.startswith("$"):
            return text
        if text == "$SHARED" or text.startswith("$SHARED/"):
            return self.launcher.shared + text[len("$SHARED"):]
        return self.launcher.resolve(text, parse_ref(text))

    def _shared_outputs(self, pairs):
        """EnTK's ``copy_output_data = ['file > $SHARED/file']``: the destination in the shared area."""
        return [(src, self._resolve(dst)) for src, dst in pairs]

    def _resolve_all(self, text: str) -> str:
        """Every ``$p.s.t/path`` inside ``text`` (an executable's argument) -> an absolute path."""
        if "$" not in text:
            return text
        return EMBEDDED_REF_RE.sub(
            lambda m: self.launcher.resolve("", (f"{m[1]}.{m[2]}.{m[3]}", m[4].lstrip("/"))), text)

    def _submit(self, item: Item) -> None:
        if self.pilot is None:
            self.pilot = shoal.Pilot(workers=self.workers or len(self.sched.cpus))
        t = item.task
        fn = self._measured(t.function)  # what the call used, measured in the worker
        if t.cores > 1 and not self.remote:  # N CPUs: affinity + OMP/BLAS threads, as for executables
            fn = functools.partial(with_cpus, fn, item.grant.cpus, t.cores)
        if self.remote:
            ship_code(t.function)  # a module beside the workflow travels to the dask workers
        try:
            args = [self._resolve(a) if isinstance(a, str) else a for a in t.args]
            kwargs = {k: self._resolve(v) if isinstance(v, str) else v for k, v in t.kwargs.items()}
            fut = self.pilot.options(timeout=t.timeout, resources=dask_resources(t) if self.remote
                                     else None).submit(fn, *args, **kwargs)
        except Exception as exc:
            self.sched.release(item.grant)
            self._ended(item, Failure(FailureKind.EXCEPTION, f"submit failed: {exc!r}", attempt=item.attempt))
            return
        item.future = fut
        self.running[id(fut)] = item
        fut.add_done_callback(self._on_future)

    def _measured(self, fn):
        """``fn`` in ``measured_call`` (usage.measuring): one wrapper per function, so the pilot
        defines it on its workers once and does not send it with every task."""
        entry = self.measured_fns.get(id(fn))
        if entry is None or entry[0] is not fn:
            if len(self.measured_fns) >= 4096:  # bounded: a workflow of lambdas made per task
                self.measured_fns.clear()
            entry = self.measured_fns[id(fn)] = (fn, measuring(fn))
        return entry[1]

    def _on_future(self, fut) -> None:
        """Runs on the pilot's result thread: hand over and wake the loop (never blocks).

        A future may settle after the run ended (cancelled at the walltime, or killed on its
        node then): the lock and the closed flag keep it from writing into a reused fd."""
        self.finished_futures.append(fut)
        self._poke()

    # -- waiting and reaping ----------------------------------------------------------
    def _wait(self) -> None:
        if self.finished_futures or self._events():
            return
        timeout = 1.0 if self.running or self.starting else 0.05
        if self.deadline is not None:
            timeout = min(timeout, max(0.0, self.deadline - time.monotonic()))
        for item in self.running.values():
            if item.deadline is not None and item.future is None:
                timeout = min(timeout, max(0.0, item.deadline - time.monotonic()))
        due = self._next_retry()
        if due is not None:
            timeout = min(timeout, max(0.0, due - time.monotonic()))
        self._sleep(int(timeout * 1000) + 1)

    def _next_retry(self) -> float | None:
        """When the next delayed retry becomes placeable (monotonic), or None; the due times
        already past are dropped (their tasks are candidates again)."""
        now = time.monotonic()
        while self.retry_due and self.retry_due[0] <= now:
            heapq.heappop(self.retry_due)
        return self.retry_due[0] if self.retry_due else None

    def _sleep(self, ms: int) -> None:
        """Poll the wake pipe for up to ``ms``, unless a runner event or a future arrived.  The
        flag is raised before the last look: a thread that appends and then finds it down knows
        this look will see its item (appends and flag reads are ordered by the GIL)."""
        self.sleeping = True
        try:
            if self.finished_futures or self._events():
                return
            if self.poller.poll(ms):
                self._drain_wake()
        finally:
            self.sleeping = False

    def _reap(self) -> None:
        """Journal what ended (the loop's next commit, before anything new starts, makes it durable)."""
        now = time.monotonic()
        ended: list[tuple[Item, Failure | None, object]] = []
        self._take_events(ended)
        while self.finished_futures:
            fut = self.finished_futures.popleft()
            item = self.running.get(id(fut))
            if item is None:
                continue
            if item.task.kind is TaskKind.FUNCTION:
                ended.append(self._fn_outcome(item, fut))
                continue
            outcome = self._remote_outcome(item, fut)
            if outcome is None:  # killed on its node at the walltime: PENDING for a resume
                del self.running[id(fut)]
                self.sched.release(item.grant)
                self.journal.unstart(item.uid)
                self.draining = True
            else:
                ended.append(outcome)
        for item, failure, value in ended:
            self._finish_attempt(item, failure, value, now)
        for item in list(self.running.values()):
            if item.future is None and item.deadline is not None and now >= item.deadline:
                self.runners.kill(item.pid)  # its runner reaps it; ended as a timeout
                item.future = False  # marks "killed for its timeout"
        if self.deadline is not None and now >= self.deadline and (self.running or self.starting):
            self.drain_reason = self.drain_reason or "walltime reached: running tasks were stopped"
            self._stop_for_walltime()

    def _finish_attempt(self, item: Item, failure: Failure | None, value, now: float) -> None:
        del self.running[item.pid if item.future in (None, False) else id(item.future)]
        self.sched.release(item.grant)
        self.durations[0] += now - item.t0
        self.durations[1] += 1
        self._ended(item, failure, value)

    def _exe_outcome(self, item: Item, code: int):
        timed_out = item.future is False
        sandbox = item.sandbox
        if timed_out or code != 0:
            err = tail(os.path.join(sandbox, item.task.stderr_file))
            if item.task.mpi and self.rank_launcher.kind is not mpi.LauncherKind.NONE:
                err = mpi.rank_tails(sandbox, item.task.ranks, err)
            return item, exit_failure(item.task.timeout, code, timed_out, err, item.attempt), None
        try:
            outputs = self.launcher.outputs(item.task, sandbox) if item.task.outputs else None
            if item.task.stage_out:
                stage_out(self._shared_outputs(item.task.stage_out), sandbox, self.launcher.cwd)
        except LaunchError as exc:
            return item, Failure(exc.kind, exc.message, 0, "", item.attempt), None
        return item, None, (0, outputs)

    def _remote_outcome(self, item: Item, fut):
        """(item, failure, value) of an executable run on a node, classified exactly as
        ``_exe_outcome`` classifies a local one; None when its node killed it at the walltime."""
        if fut.exception() is not None:  # lost with its dask workers, the cluster gone, ...
            return self._fn_outcome(item, fut)
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
            try:
                stage_out(self._shared_outputs(item.task.stage_out), item.sandbox, self.launcher.cwd)
            except LaunchError as exc:
                return item, Failure(exc.kind, exc.message, 0, "", item.attempt), None
        return item, None, (0, list(out.outputs) if out.outputs else None)

    def _fn_outcome(self, item: Item, fut):
        exc = fut.exception()
        if exc is None:
            value, row = fut.result()  # every function task runs in measured_call (_measured)
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

    # -- ending -----------------------------------------------------------------------
    def _ended(self, item: Item, failure: Failure | None, value=None) -> None:
        """Journal the end of one attempt (caller commits) and move the stage on."""
        now = time.time()
        t = item.task
        used, item.usage = item.usage, NONE
        if failure is None:
            if t.kind is TaskKind.EXECUTABLE:
                code, outputs = value
                self.journal.done(item.uid, now, exit_code=code, outputs=outputs, usage=used)
            else:
                self.journal.done(item.uid, now, result=value, usage=used)
            if self.reuse is not None:
                self.reuse.record(item, value)
            t.settle(TaskState.DONE, 0)
            self._settle(item, TaskState.DONE)
            return
        final = item.attempt > item.retries
        self.journal.failed(item.uid, failure, now, final=final, usage=used)
        if final:
            t.settle(TaskState.FAILED, failure.exit_code)
            self._settle(item, TaskState.FAILED)
            return
        if t.on_retry is not None:
            new = t.on_retry(t, failure)
            if not isinstance(new, Task):
                raise EnsembleError(f"task {item.uid}: on_retry must return a Task, got {new!r}")
            new.bind_path(item.uid)  # (an EnTK Task's uid is its own: entk_model.py)
            new.validate()
            item.task = new
            item.policy_of(new, item.srun.stage)
            self._run_defaults(item)
        item.grant = item.pid = item.future = item.deadline = item.request = None
        self.session_counts["retries"] += 1
        delay = retry_delay(item.retry_delay, item.attempt, item.uid)
        if delay > 0:  # placed again once it is due: _candidates skips it, _wait wakes for it
            item.not_before = time.monotonic() + delay
            heapq.heappush(self.retry_due, item.not_before)
        self.waiting[id(item)] = item

    def _skip(self, item: Item, reason: str) -> None:
        self.waiting.pop(id(item), None)
        self.sched.forget(id(item))
        self.journal.settled(item.uid, item.pipe_uid, item.stage_uid, item.task.kind.value,
                             TaskState.SKIPPED, reason, time.time(), item.spec)
        self._settle(item, TaskState.SKIPPED)

    # -- walltime, abort, cleanup -----------------------------------------------------
    def _stop_for_walltime(self) -> None:
        """Past the walltime (or asked to stop): kill what still runs and leave it PENDING for a resume."""
        self.draining = True
        self._stop_local()
        on_nodes = []
        for key, item in list(self.running.items()):  # function tasks and executables on dask
            if not item.future.cancel() and self._node_kills(item):
                on_nodes.append(item)
                continue
            self.journal.unstart(item.uid)
            self.sched.release(item.grant)
            del self.running[key]
        if on_nodes:
            self._settle_on_nodes(on_nodes)
        self.journal.commit()
        if self.pilot is not None and self.pilot is not self.user_pilot:
            self.pilot.close(cancel_pending=True)
            self.pilot = None

    def _node_kills(self, item: Item) -> bool:
        """True when ``item`` is an executable running on a node that kills it at the
        walltime (remote.py) within ``NODE_KILL_GRACE_S`` from now."""
        return (item.task.kind is TaskKind.EXECUTABLE and self.walltime_at is not None
                and self.walltime_at - time.time() < NODE_KILL_GRACE_S)

    def _settle_on_nodes(self, items: list[Item]) -> None:
        """Wait (until the walltime plus ``NODE_KILL_GRACE_S``) for executables already
        started on nodes: their node kills them at the walltime.  A killed one is PENDING for
        a resume; one that ended first keeps its outcome (DONE is not run again).

        Before, such a task was journalled PENDING while it still ran on its node, so a
        resume right after the drain could run it a second time beside it (seen as a task
        that wrote twice in tests/dask/test_dask_ensemble.py under load)."""
        until = self.walltime_at + NODE_KILL_GRACE_S
        for item in items:
            with contextlib.suppress(TimeoutError, cf.CancelledError):
                item.future.exception(timeout=max(0.0, until - time.time()))
        now = time.monotonic()
        for item in items:
            fut = item.future
            outcome = self._remote_outcome(item, fut) if fut.done() and not fut.cancelled() else None
            if outcome is None:  # killed at the walltime, or no word from its node in time
                self.journal.unstart(item.uid)
                self.sched.release(item.grant)
                del self.running[id(item.future)]
            else:
                self._finish_attempt(*outcome, now)

    def _abort(self) -> None:
        with contextlib.suppress(BaseException):
            self._stop_local()  # every started process killed and reaped
        for item in list(self.running.values()):
            if item.future is None or item.future is False:
                self.runners.kill(item.pid)
            elif self.remote:  # queued on the cluster: do not let it start after we are gone
                item.future.cancel()
            with contextlib.suppress(Exception):
                self.journal.unstart(item.uid)
        self.running.clear()
        with contextlib.suppress(Exception):
            self.journal.commit()
            self.journal.close()

    def _close_resources(self) -> None:
        self.walker.close()  # finished pipelines take stages again
        if self.runners is not None:
            self.runners.close()
            self.runners = None
        self.launcher.close()
        with self.wake_lock:
            self.wake_closed = True
            for fd in (self.wake_r, self.wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.pilot is not None and self.pilot is not self.user_pilot:
            self.pilot.close(cancel_pending=True)
        self.pilot = None

    def _journal_job_notes(self) -> None:
        """What the pilot's job watch and scaler said since the last call, into the journal."""
        events = self.job_log.take() if self.job_log is not None else []
        if events:
            self.journal.set_meta(pilot_jobs.JOURNAL_KEY,
                                  pilot_jobs.merged(self.journal.meta(pilot_jobs.JOURNAL_KEY), events))

    def _report_progress(self, t0: float, force: bool = False) -> None:
        self._journal_job_notes()  # committed with the loop's next commit
        if self.progress is None:
            return
        now = time.monotonic()
        if now - self._last_progress < 0.5 and not force:
            return
        self._last_progress = now
        self.progress(progress_record(self.session_counts, self.walker.replayed, self.walker.total,
                                      len(self.running), len(self.waiting), now - t0, force))
