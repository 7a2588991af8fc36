"""Walking the workflow: pipelines, the stage barrier, after=/when=, replay on resume.

The driver is two objects with one explicit interface between them:

* ``Walker`` (this module) owns the *workflow*: the (possibly lazy) pipeline
  iterator, the active pipelines and their current stage, task names and uids,
  the replay of journaled rows on resume, the stage barrier, the stages'
  ``post_exec`` callbacks (``StageContext``), the pipeline/stage rows of the
  journal, and the plan/total the progress line and ``shoal status`` show.
* ``Engine`` (engine.py) owns the *tasks once pulled*: the waiting list, the
  Scheduler, the launcher/pilot, the running set, reaping, retries and every
  task row of the journal.

The interface, both directions, is all there is:

* walker -> engine: the ``Intake`` protocol below — ``has_room()`` (is the
  engine's waiting window full?), ``admit(item)`` (a pulled task, now the
  engine's), ``impossible(task)`` (can it ever be placed on this run's
  resources?).
* engine -> walker: ``fill()`` (pull pipelines/tasks while there is room),
  ``settled(item, state)`` (an admitted task is terminal: DONE/FAILED/SKIPPED
  is journaled and committed), ``dep_state(uid)`` (a task/stage/pipeline
  dependency's journaled state), ``finished`` and ``active_stages()``.

``Item`` is the one object that crosses: the walker creates it (task, uid,
stage and pipeline uids, dependencies, journaled attempt and spec) and hands
it over; from then on only the engine writes it (grant, pid, retries),
until it comes back through ``settled``.

Invariants: a stage starts only after every task of the previous stage is
terminal (DONE/FAILED/SKIPPED) *in the journal*; ``_StageRun.outstanding``
counts tasks pulled and not yet settled, so a stage ends exactly once (when
its iterator is exhausted and the count is 0).  On resume, tasks whose
journal row is terminal are counted without being admitted — the stage still
ends, so its callback replays over the journaled results.

A listed task's spec (identity.py: what it runs, journaled with it and
compared on resume) is the one ``plan_of`` computed when the run started,
for the run's identity; the walker does not compute it again.  So a stage
hook that changes a later, already listed task in place changes what runs
but not its recorded spec: the spec is the workflow as given, and a resume
replays the same hooks over the same journaled results, so the comparison
stays like with like.  Tasks that were not listed at the start (lazy
stages, stages and pipelines added by hooks, ``on_retry`` replacements keep
the first attempt's) get their spec when they are pulled.

Rejected alternatives: materialising every stage's tasks up front (a
million-task stage would live in driver memory); the earlier ``Engine(Walker)``
mixin — both halves read and wrote one shared ``self`` (waiting, moves,
session counters, the plan), so which half owned which state was a convention
nobody could check, and the walker could not be driven without a whole
engine; a dataclass of callbacks instead of a Protocol (the engine already
is the object with those three methods; a Protocol states the contract and
type-checks it without an adapter).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Protocol

from .identity import Names, count_tasks, diff_specs, plan_of, spec_text
from .journal import Journal
from .model import (
    EnsembleError,
    Pipeline,
    Stage,
    Task,
    TaskState,
    entk_placeholder,
    name_key,
    parse_ref,
)
from .report import Results, StageContext
from .usage import NONE


class Intake(Protocol):
    """The engine side of the interface: where pulled tasks go."""

    def has_room(self) -> bool:
        """True while the engine takes more waiting tasks (its window is not full)."""

    def admit(self, item: Item) -> None:
        """Take ``item``: from now on the engine schedules, runs, retries and journals it,
        and calls ``Walker.settled(item, state)`` once it is terminal."""

    def impossible(self, task: Task) -> str | None:
        """Why ``task`` can never be placed on this run's resources (None if it can)."""

    def shared_sandbox(self, uid: str, directory: str) -> None:
        """Task ``uid`` runs in ``directory`` (EnTK's ``t.sandbox``: relative to the run's sandbox
        root, or absolute), which other tasks may share; told for every such task the walker
        reaches, also those a resume finds DONE, so references to them resolve there."""


class _Ended(list):
    """A finished pipeline's ``stages`` for the rest of the run: adding a stage is refused.

    EnTK-style adaptivity reaches other pipelines through closures (a no-argument
    ``post_exec`` calling ``other.add_stages(s)``); a stage added to a pipeline whose last
    stage has ended would never run (EnTK drops it silently too).  Re-opening the pipeline is
    no answer: pipelines ``after=`` it may have started already.  ``Walker.close`` gives the
    pipeline a plain list again when the run ends."""

    __slots__ = ("uid",)

    def __init__(self, stages, uid: str):
        super().__init__(stages)
        self.uid = uid

    def _refuse(self, stages, position: int):
        stages = list(stages)
        names = ", ".join(f"{self.uid}.{getattr(s, 'name', None) or f's{position + i}'}"
                          for i, s in enumerate(stages)) or "(none)"
        raise EnsembleError(
            f"stage {names} cannot be added to pipeline {self.uid}: the pipeline has finished (its last "
            "stage ended; pipelines after= it may have started) and the stage would never run. Add a "
            "pipeline's stages before its last stage ends (from its own stages' post_exec), or add a new "
            "pipeline (ctx.add_pipeline in a post_exec(ctx))")

    def append(self, stage):
        self._refuse([stage], len(self))

    def extend(self, stages):
        self._refuse(stages, len(self))

    def insert(self, index, stage):
        self._refuse([stage], len(self))

    def __iadd__(self, stages):
        self._refuse(stages, len(self))


class _StageRun:
    __slots__ = ("stage", "uid", "pipe", "tasks", "exhausted", "outstanding", "failed", "names", "index")

    def __init__(self, stage: Stage, uid: str, pipe: _PipeRun):
        self.stage, self.uid, self.pipe = stage, uid, pipe
        self.tasks = iter(stage.tasks)
        self.exhausted = False
        self.outstanding = 0  # pulled from the iterator, not yet terminal
        self.failed = 0
        self.names = Names("t", "task")  # the tasks' final names (a clash is an error)
        self.index = 0


class _PipeRun:
    __slots__ = ("pipeline", "uid", "next_stage", "stage", "stopped", "failed", "names")

    def __init__(self, pipeline: Pipeline, uid: str):
        self.pipeline, self.uid = pipeline, uid
        self.names = Names("s", "stage")  # the stages' final names
        self.next_stage = 0
        self.stage: _StageRun | None = None
        self.stopped = False
        self.failed = False


class Item:
    """A task pulled from its stage: created by the walker, then the engine's (waiting, running)
    until it is settled.  ``srun`` is the walker's; the engine reads only the uids."""

    __slots__ = ("task", "uid", "srun", "stage_uid", "pipe_uid", "attempt", "deps", "pid", "request",
                 "future", "grant", "deadline", "t0", "sandbox", "spec", "priority", "retries",
                 "retry_delay", "not_before", "usage")

    def __init__(self, task: Task, uid: str, srun: _StageRun, attempt: int, spec: str | None = None):
        self.task, self.uid, self.srun, self.attempt = task, uid, srun, attempt
        self.stage_uid, self.pipe_uid = srun.uid, srun.pipe.uid
        self.spec = spec
        self.deps = task.dependency_uids() + [
            r[0] for r in (parse_ref(i.source) for i in task.staged_inputs()) if r
        ]
        self.pid = self.request = None
        self.future = self.grant = self.deadline = self.sandbox = None
        self.t0 = 0.0
        self.not_before = 0.0  # a retry waits for its retry_delay: not placed before this (monotonic)
        self.usage = NONE  # what the attempt that just ended used (usage.py), journaled with its end
        self.policy_of(task, srun.stage)

    def policy_of(self, task: Task, stage: Stage) -> None:
        """The task's priority, retries and retry_delay: its own, else its stage's (retries and
        retry_delay None here: the engine fills in the run's)."""
        self.priority = task.priority if task.priority is not None else stage.priority
        self.retries = task.retries if task.retries is not None else stage.retries
        self.retry_delay = task.retry_delay if task.retry_delay is not None else stage.retry_delay


class Walker:
    """Pulls pipelines, stages and tasks into an ``Intake``; see the module docstring.  Owner only."""

    def __init__(self, workflow: Iterator[Pipeline], intake: Intake, *, journal: Journal, journal_path: str,
                 results: Results, plan_pipes: list[Pipeline], plan, total: int | None,
                 max_pipelines: int, replay: bool, specs: dict | None = None):
        self.workflow = workflow
        self.intake = intake
        self.journal = journal
        self.journal_path = journal_path  # as the user named it, for messages
        self.results = results
        self.plan_pipes = plan_pipes  # every pipeline so far, incl. added at run time (the status plan)
        self.plan = plan
        self.total = total  # None when lazy: the progress line then has no ETA
        self.max_pipelines = max_pipelines
        self.replay = replay  # look each task up in the journal (resume)
        self.specs = specs if specs is not None else {}  # id(task) -> (task, spec): see _add_task
        self.pipes: list[_PipeRun] = []
        self.pipe_names = Names("p", "pipeline")  # the pipelines' final names
        # the names of a pipeline's stages / a stage's tasks, by key, for EnTK references
        # ($Pipeline_p_Stage_s_Task_t); kept after the scope ends only when it holds a name or uid
        self.stage_scopes: dict[str, Names] = {}
        self.task_scopes: dict[str, Names] = {}
        self.pipe_count = 0
        self.workflow_done = False
        # terminal without running in this session: found so on resume, or SKIPPED because their
        # stage will not start (a failure or stop before it, when= false): the progress line
        # counts them, so its total stays the plan's, as ``shoal status`` shows it
        self.replayed: collections.Counter[TaskState] = collections.Counter()
        self.moves = 0  # progress counter (the engine's stuck check adds it to its own)
        self.ended: list[Pipeline] = []  # finished pipelines whose stages are an _Ended list

    # -- the interface the engine calls -------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every pipeline pulled and ended."""
        return self.workflow_done and not self.pipes

    def suspended(self) -> list[str]:
        """The pipelines held by EnTK's ``Pipeline.suspend()``."""
        return [p.uid for p in self.pipes if getattr(p.pipeline, "suspended", False)]

    def active_stages(self) -> list[str]:
        return [p.stage.uid for p in self.pipes if p.stage is not None]

    def fill(self) -> None:
        """Pull pipelines and tasks into the intake while it has room."""
        while not self.workflow_done and len(self.pipes) < self.max_pipelines and self.intake.has_room():
            try:
                pipeline = next(self.workflow)
            except StopIteration:
                self.workflow_done = True
                break
            self._add_pipeline(pipeline)
        for prun in list(self.pipes):
            if not self.intake.has_room():
                break
            self._advance(prun)

    def dep_state(self, uid: str) -> TaskState | None:
        """The journaled state of an ``after=`` target: a task ``p.s.t``, a stage ``p.s`` or a pipeline."""
        if uid.count(".") == 2:
            return self.journal.state(uid)
        return self.journal.stage_state(uid)

    def settled(self, item: Item, state: TaskState) -> None:
        """``item`` is terminal and journaled (committed or about to be, before anything acts on it)."""
        self._settle_counts(item.srun, state)

    def add_pipeline(self, pipeline: Pipeline) -> None:
        """A pipeline added at run time (``StageContext.add_pipeline``)."""
        self._add_pipeline(pipeline)
        self.plan_pipes.append(pipeline)
        self.grow_total(pipeline.stages)

    def note_plan(self) -> None:
        """Stages appended / pipelines added at run time: record the grown plan for ``shoal status``."""
        if self.plan is not None:
            self.plan = plan_of(self.plan_pipes)[0]
            self.journal.set_plan(self.plan, None)

    def grow_total(self, stages, sign: int = 1) -> None:
        """Stages appended / pipelines added at run time (sign=1: the total grows, or becomes
        unknown if they are lazy) or stages that will not run (sign=-1: skipped, pipeline stopped)."""
        if self.total is not None and stages:
            more = count_tasks([Pipeline(list(stages))])
            self.total = None if more is None else max(0, self.total + sign * more)

    def not_run(self, stages) -> None:
        """Stages that will not start: their tasks count as skipped (the total keeps them)."""
        if self.total is not None and stages:
            n = count_tasks([Pipeline(list(stages))])
            if n is None:  # a lazy stage: its size is unknown, so is the total
                self.total = None
            else:
                self.replayed[TaskState.SKIPPED] += n

    def close(self) -> None:
        """The run is over (or aborted): finished pipelines take stages again (a plain list)."""
        for pipeline in self.ended:
            if type(pipeline.stages) is _Ended:
                pipeline.stages = list(pipeline.stages)
        self.ended.clear()

    # -- pulling ---------------------------------------------------------------------
    def _add_pipeline(self, pipeline: Pipeline) -> None:
        if not isinstance(pipeline, Pipeline):
            raise EnsembleError(f"workflow item {self.pipe_count} is {pipeline!r}, not a Pipeline")
        name = self.pipe_names.claim(pipeline, self.pipe_count, "")
        self.pipe_count += 1
        pipeline.bind_path(name)
        pipeline.validate()
        prun = _PipeRun(pipeline, name)
        self.pipes.append(prun)
        self.stage_scopes[name] = prun.names
        self.moves += 1

    def _advance(self, prun: _PipeRun) -> None:
        """Start the pipeline's next stage if it may, then pull its tasks up to the window."""
        if getattr(prun.pipeline, "suspended", False):
            return  # EnTK's Pipeline.suspend(): what runs goes on, nothing new starts until resume()
        while True:
            if prun.stage is None:
                if not self._start_next_stage(prun):
                    return
            srun = prun.stage
            if srun.exhausted:
                if srun.outstanding == 0:
                    self._end_stage(prun)
                    continue
                return
            while self.intake.has_room():
                try:
                    task = next(srun.tasks)
                except StopIteration:
                    srun.exhausted = True
                    break
                self._add_task(srun, task)
            if not srun.exhausted:
                return

    def _start_next_stage(self, prun: _PipeRun) -> bool:
        pipeline = prun.pipeline
        if prun.stopped or prun.next_stage >= len(pipeline.stages):
            self._end_pipeline(prun)
            return False
        if prun.next_stage == 0:
            for dep in pipeline.dependency_uids():
                state = self.dep_state(dep)
                if state is None or not state.terminal:
                    return False  # wait
                if state is not TaskState.DONE:
                    prun.failed = True
                    self._end_pipeline(prun, TaskState.SKIPPED)
                    return False
        stage = pipeline.stages[prun.next_stage]
        if not isinstance(stage, Stage):
            raise EnsembleError(f"pipeline {prun.uid}: stage {prun.next_stage} is {stage!r}, not a Stage")
        suid = f"{prun.uid}.{prun.names.claim(stage, prun.next_stage, f'pipeline {prun.uid}: ')}"
        stage.bind_path(suid)
        stage.validate()
        for dep in stage.dependency_uids():
            state = self.dep_state(dep)
            if state is None or not state.terminal:
                return False
            if state is not TaskState.DONE:
                prun.next_stage += 1
                self.not_run([stage])
                self.journal.stage(suid, prun.uid, TaskState.SKIPPED)
                prun.stopped, prun.failed = True, True
                return self._start_next_stage(prun)
        prun.next_stage += 1
        if stage.when is not None and not stage.when(self.results):
            self.not_run([stage])
            self.journal.stage(suid, prun.uid, TaskState.SKIPPED)
            return self._start_next_stage(prun)
        prun.stage = _StageRun(stage, suid, prun)
        self.task_scopes[suid] = prun.stage.names
        self.moves += 1
        return True

    def _add_task(self, srun: _StageRun, task: Task) -> None:
        if not isinstance(task, Task):
            raise EnsembleError(f"stage {srun.uid}: task {srun.index} is {task!r}, not a Task")
        uid = f"{srun.uid}.{srun.names.claim(task, srun.index, f'stage {srun.uid}: ')}"
        task.bind_path(uid)
        srun.index += 1
        if task.inputs or task._shell:
            self._resolve_entk_refs(task)  # before validate(): EnTK's references are not shoal's
        task.validate()
        why = self.intake.impossible(task)
        if why:
            raise EnsembleError(f"task {uid} {why}; lower its needs or give the run more resources")
        srun.outstanding += 1
        attempt = 0
        known = self.specs.pop(id(task), None)  # computed by plan_of when the run started
        spec = known[1] if known is not None and known[0] is task else None
        spec = spec or spec_text(task)  # an unlisted one's after resolving EnTK references: its keys
        # are stable from run to run, EnTK uids need not be (entk_model.py)
        if task.sandbox_dir is not None:
            self.intake.shared_sandbox(uid, task.sandbox_dir)
        if self.replay:
            row = self.journal.replay_row(uid)
            if row is not None:
                state, attempt, old = row
                if old is not None and old != spec:
                    raise EnsembleError(
                        f"journal {self.journal_path} holds another workflow: {diff_specs(uid, old, spec)}. "
                        "Resume with the workflow that started it, or start afresh with new=True "
                        "(shoal run --new)")
                if state.terminal:
                    self.replayed[state] += 1  # for the progress line
                    self._settle_counts(srun, state)
                    return
        self.moves += 1
        self.intake.admit(Item(task, uid, srun, attempt, spec))

    def _resolve_entk_refs(self, task: Task) -> bool:
        """EnTK's ``$Pipeline_p_Stage_s_Task_t/file`` (in ``*_input_data``, and as an EnTK task's
        argument, as EnTK's task processor reads them) -> ``$<p>.<s>.<t>/file`` with the keys of
        the tasks they name (by uid, then by name); True if there were any."""
        inputs = list(task.inputs)
        found = False
        for i, inp in enumerate(inputs):
            ref = getattr(inp, "_placeholder", None)
            if ref is None:
                continue
            found = True
            resolved = type(inp)(self._entk_ref(task, ref, f"{inp._entk} {inp.source!r}"), inp.target, inp.mode)
            object.__setattr__(resolved, "_entk", inp._entk)
            object.__setattr__(resolved, "_placeholder", None)
            inputs[i] = resolved
        if found:
            task.inputs = inputs
        if task._shell and any(isinstance(a, str) and a.startswith("$") for a in task.arguments):
            args = [self._entk_ref(task, ref, f"argument {a!r}") if (ref := entk_placeholder(a)) else a
                    for a in (x if isinstance(x, str) else str(x) for x in task.arguments)]
            if args != list(task.arguments):
                task.arguments, found = args, True
        return found

    def _entk_ref(self, task: Task, ref: tuple, what: str) -> str:
        p, s, t, rest = ref
        try:
            pkey = self.pipe_names.lookup(p)
            stages = self.stage_scopes.get(pkey)
            skey = stages.lookup(s) if stages is not None else name_key(s)
            tasks = self.task_scopes.get(f"{pkey}.{skey}")
            tkey = tasks.lookup(t) if tasks is not None else name_key(t)
        except EnsembleError as exc:
            raise EnsembleError(f"task {task.label}: {what}: {exc}") from None
        return f"${pkey}.{skey}.{tkey}" + (f"/{rest}" if rest else "")

    def _settle_counts(self, srun: _StageRun, state: TaskState) -> None:
        srun.outstanding -= 1
        self.moves += 1
        if state is TaskState.FAILED:
            srun.failed += 1
        if srun.exhausted and srun.outstanding == 0:
            self._end_stage(srun.pipe)

    def _end_stage(self, prun: _PipeRun) -> None:
        srun = prun.stage
        if srun is None:
            return
        prun.stage = None
        if not (srun.names.refs or srun.names.uids):
            self.task_scopes.pop(srun.uid, None)
        state = TaskState.FAILED if srun.failed else TaskState.DONE
        self.journal.stage(srun.uid, prun.uid, state)
        self.journal.commit()
        if srun.failed:
            prun.stopped = prun.failed = True
        elif srun.stage.post_exec is not None:
            stages_before = len(prun.pipeline.stages)
            ctx = StageContext(self, prun, srun.stage)
            try:
                if srun.stage.post_exec_arity() == 0:
                    srun.stage.post_exec()  # EnTK style: it calls pipeline.add_stages(...) itself
                else:
                    srun.stage.post_exec(ctx)
            except Exception as exc:
                exc.add_note(f"(in the post_exec of stage {srun.uid}; the journal stays resumable)")
                raise
            added = prun.pipeline.stages[max(stages_before, prun.next_stage):]
            if added and not ctx.appended:
                if prun.stopped:
                    raise EnsembleError(f"pipeline {prun.uid} was stopped; it takes no more stages")
                self.grow_total(added)
                self.note_plan()

    def _end_pipeline(self, prun: _PipeRun, state: TaskState | None = None) -> None:
        if prun in self.pipes:
            self.pipes.remove(prun)
            self.not_run(prun.pipeline.stages[prun.next_stage:])
        self.moves += 1
        if state is None:
            state = TaskState.FAILED if prun.failed else TaskState.DONE
        if not (prun.names.refs or prun.names.uids):
            self.stage_scopes.pop(prun.uid, None)
        getattr(prun.pipeline, "settle", lambda state: None)(state)  # EnTK's Pipeline.state
        self.journal.stage(prun.uid, prun.uid, state)
        self.journal.commit()
        if type(prun.pipeline.stages) is list:  # from now on a stage added to it is refused
            prun.pipeline.stages = _Ended(prun.pipeline.stages, prun.uid)
            self.ended.append(prun.pipeline)
