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

Where it runs is one ``Launch`` object (launch.py), chosen once per run from the pilot
(``LocalLaunch``: runner threads of the driver spawn executables pinned to the granted CPUs
and report SPAWNED/EXITED events; ``DaskLaunch``: executables become pilot tasks on the
cluster's nodes, remote.py, reaped through their futures, and the Scheduler's "cores" are
slots, one per shoal worker).  The engine asks it what there is to place on, what a task
asks for, whether it can ever fit, to start what was placed and how an attempt ended; the
engine alone journals, accounts (the Scheduler) and moves the walker on.  What the run was
told comes in one checked ``EngineConfig`` (config.py); opening the pilot or the batch
allocation it runs on is drive.py's; ``$SHARED``/``$p.s.t`` references are refs.py's.

A task enters through ``admit`` (the walker's ``Intake``; it then waits) and is placed in
``_schedule`` (granted, journaled RUNNING, then started): a check that settles a task
without running it (e.g. reusing an earlier result) hooks into one of these two methods.

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
never waits behind one of unknown length while another CPU frees up.  Without queueing the
runners waited for the driver, which made one pass, one commit and one wake-up per tiny task;
with it a pass handles several (the figures: docs/benchmarks.md, "Measurements behind design
choices").  A queued task shows as running in ``shoal status`` for the
(short) time it waits; its timeout counts from its own start.

Rejected alternatives: a thread per running task (thousands of threads for
long-running ensembles; runners are one per CPU); ``waitpid(-1)`` / SIGCHLD
(would reap the pilot's own workers); submitting every function task to the pilot at once (unbounded
memory, and no core accounting against executables); a ``remote`` flag
tested wherever local and dask launching differ (there were eleven such tests while this
docstring said the choice was made once; launch.py's docstring has the rest); the engine's
~20 keyword parameters forwarded from each entry point (config.py says why).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import dataclasses
import fcntl
import heapq
import os
import select
import threading
import time

import shoal
from shoal._backoff import retry_delay

from . import pilot_jobs
from .config import EngineConfig
from .identity import count_tasks, diff_plans, diff_specs, listed_keys, plan_of, spec_text
from .journal import Journal
from .launch import NODE_KILL_GRACE_S, Launch
from .launch import choose as choose_launch
from .launcher import (
    Launcher,
    LaunchError,
    check_root,
    kill_leftover,
    stage_out,
)
from .model import (
    EnsembleError,
    Failure,
    FailureKind,
    Task,
    TaskKind,
    TaskState,
    as_pipelines,
)
from .progress import progress_callback, progress_record
from .refs import Refs
from .report import Report, Results
from .rerun import NO_COMMAND_TO_REPEAT, script_resume_command
from .runners import BOUNCED, NOT_STARTED, Event
from .scheduler import Request, Scheduler, Waiting
from .usage import HOST, NONE, Usage, measuring
from .walker import Item, Walker

QUEUE_BELOW_S = 0.05  # queue a CPU's next task behind its current one while tasks average less


class Engine:
    """One run of a workflow.  Use ``shoal.ensemble.run``; owner only (one thread).

    The ``Intake`` of its ``Walker`` (``has_room``, ``admit``, ``impossible``)."""

    def __init__(self, workflow, config: EngineConfig, *, pilot=None, node_specs=()):
        """``config``: the run's checked settings (config.py); ``pilot``: an open pilot to run on
        (None: a local one is started with the first function task); ``node_specs``: the nodes
        of a dask pilot opened over a SLURM job (its ``DaskLaunch`` refuses what no node holds)."""
        self.config = config
        journal = config.journal
        self.retries = config.retries
        self.retry_delay = config.retry_delay
        self.retry_due: list[float] = []  # heap: when delayed retries become placeable (monotonic)
        pipelines = as_pipelines(workflow)
        specs: dict = {}  # each listed task's spec, computed once: for the identity and its journal row
        self.plan, self.identity = plan_of(pipelines, specs)
        self.workflow_list = pipelines if isinstance(pipelines, list | tuple) else []
        self.user_pilot = pilot
        self.pilot = pilot
        self.workers = config.workers
        root = config.sandbox or os.path.splitext(os.path.abspath(journal))[0] + ".sandbox"
        check_root(root)
        self.launcher = Launcher(root, gpus=config.gpus)
        self.refs = Refs(self.launcher)
        self.launch: Launch = choose_launch(pilot, self.launcher, self.refs, config, node_specs,
                                            wake=self._poke)  # once per run: local or dask
        cpus = self.launch.slots(config)
        memory_total = self.launch.memory_total(config)
        self.sched = Scheduler(cpus, gpus=config.gpus, memory=memory_total, patience=config.patience)
        self.window = config.window or max(64, 8 * len(self.sched.cpus))
        self.walltime = config.walltime
        self.journal_path = journal
        self.starting: dict[int, Item] = {}  # id(item) -> handed to a runner, no SPAWNED yet
        self.progress = progress_callback(config.progress)
        self.resume = config.resume
        self.retry_failed = config.retry_failed
        self.resume_command = config.resume_command or script_resume_command()
        self.journal = Journal(journal, resume=config.resume, durability=config.durability.value,
                               values=config.values, new=config.new, sandbox=root)
        try:
            self._check_identity()
        except BaseException:
            self.journal.close(ended=False)
            raise
        try:
            self.launcher.stage_shared(config.shared_data)
        except BaseException:
            self.journal.close(ended=False)
            raise
        self.reuse = None  # --reuse / --cache: reuse.py keys each task before its first attempt
        if config.reuse or config.cache is not None:
            from .reuse import Reuse

            try:
                self.reuse = Reuse(self.journal, self.launcher, self.refs.resolve,
                                   previous=config.reuse, cache=config.cache)
            except BaseException:
                self.journal.close(ended=False)
                raise
        self.results = Results(self.journal, self.launcher)
        self.waiting = Waiting()  # by priority, then arrival (scheduler.py)
        self.running: dict[int, Item] = {}  # pid or id(future) -> item
        self.walker = Walker(iter(pipelines), self, journal=self.journal, journal_path=journal,
                             results=self.results, plan_pipes=list(self.workflow_list), plan=self.plan,
                             total=count_tasks(pipelines), max_pipelines=config.max_pipelines,
                             replay=config.resume,
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
        self.launch.begin(self.walltime_at)
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
            if self.launch.end():  # it kept batch-job notes
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

    def _finished(self) -> bool:
        return (self.walker.finished and not self.waiting and not self.running and not self.starting
                and not self._events())

    def _events(self):
        return self.launch.events

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
        """The one place a task enters the engine (from the walker): it waits here until
        ``_schedule`` places it.  A hook that settles a task without running it belongs here."""
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
            item.request = self.launch.request(item.task, id(item))
        return item.request

    def impossible(self, task: Task) -> str | None:
        """Why ``task`` can never be placed on this run's resources (None if it can)."""
        return self.launch.refusal(task, self.sched)

    # -- starting ---------------------------------------------------------------------
    def _schedule(self) -> int:
        """Start what may start now (the one place a task is placed); its RUNNING rows and what
        _reap wrote share one commit, made before anything starts."""
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
        executables = []
        for item in items:
            item.t0 = time.monotonic()
            if item.task.timeout and not item.grant.queued:  # a queued one's starts at its SPAWNED
                item.deadline = item.t0 + item.task.timeout
            if item.task.kind is TaskKind.FUNCTION:
                self._submit(item)
            else:
                executables.append(item)
        if executables:
            self._start_executables(executables)
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
                stage_out(self.refs.shared_outputs(item.task.stage_out), item.sandbox, self.launcher.cwd)
            except LaunchError:
                self.reuse.unmatch(item)
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

    def _start_executables(self, items: list[Item]) -> None:
        """Hand the placed executables to the launch: local ones wait for their runner's SPAWNED
        (``starting``), those it made futures of run (``_running_future``)."""
        for item in items:
            self.starting[id(item)] = item
        for item, failure in self.launch.start(items, self._running_future):
            self.starting.pop(id(item), None)
            self.sched.release(item.grant)
            self._ended(item, failure)

    def _running_future(self, item: Item) -> None:
        """``item.future`` was submitted: it runs until the future settles (``_on_future``)."""
        self.starting.pop(id(item), None)
        self.running[id(item.future)] = item
        item.future.add_done_callback(self._on_future)

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
                    self.launch.kill(a)
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
            ended.append(self.launch.exit_outcome(item, a, item.future is False))

    def _stop_local(self) -> None:
        """Kill every local executable, started or being started, and wait until the runners
        have reaped each one (or answered NOT_STARTED); they are left PENDING for a resume."""
        if not self.launch.stop_new():
            return  # no executable ever started here
        ended: list = []
        self._take_events(ended)  # exits already reported: journaled normally
        for item, failure, value in ended:
            self._finish_attempt(item, failure, value, time.monotonic())
        for item in list(self.running.values()):
            if item.future is None or item.future is False:
                self.launch.kill(item.pid)  # a no-op for a pid already seen exiting
        while self.launch.busy:  # the runners' count, not ours: nothing
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

    def _submit(self, item: Item) -> None:
        if self.pilot is None:
            self.pilot = shoal.Pilot(workers=self.workers or len(self.sched.cpus))
        t = item.task
        fn, resources = self.launch.function(item, self._measured(t.function))  # measured in the worker
        try:
            resolve = self.refs.resolve
            args = [resolve(a) if isinstance(a, str) else a for a in t.args]
            kwargs = {k: resolve(v) if isinstance(v, str) else v for k, v in t.kwargs.items()}
            fut = self.pilot.options(timeout=t.timeout, resources=resources).submit(fn, *args, **kwargs)
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
            outcome = self.launch.future_outcome(item, fut)
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
                self.launch.kill(item.pid)  # its runner reaps it; ended as a timeout
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
            if not item.future.cancel() and self.launch.ends_on_node(item, self.walltime_at):
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
            outcome = self.launch.future_outcome(item, fut) if fut.done() and not fut.cancelled() else None
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
            self.launch.abandon(item)  # a local process killed; a dask one not started after we are gone
            with contextlib.suppress(Exception):
                self.journal.unstart(item.uid)
        self.running.clear()
        with contextlib.suppress(Exception):
            self.journal.commit()
            self.journal.close()

    def _close_resources(self) -> None:
        self.walker.close()  # finished pipelines take stages again
        self.launch.close()
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
        events = self.launch.notes()
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
