"""Walking the workflow: pipelines, the stage barrier, after=/when=, replay on resume.

Mixed into ``Engine`` (driver thread only).  The walker pulls pipelines from
the (possibly lazy) workflow, starts each pipeline's stages in order, pulls a
stage's tasks into ``engine.waiting`` up to the window, and, when a stage's
last task is terminal, journals the stage and runs its ``post_exec``
callback (which may append stages, add pipelines or stop the pipeline).

Invariants: a stage starts only after every task of the previous stage is
terminal (DONE/FAILED/SKIPPED) *in the journal*; ``_StageRun.outstanding``
counts tasks pulled and not yet terminal, so a stage ends exactly once (when
its iterator is exhausted and the count is 0).  On resume, tasks whose
journal row is terminal are counted without running — the stage still ends,
so its callback replays over the journaled results.

Rejected alternative: materialising every stage's tasks up front (a
million-task stage would live in driver memory).
"""

from __future__ import annotations

from .identity import diff_specs, spec_text
from .model import EnsembleError, Pipeline, Stage, Task, TaskState, parse_ref
from .report import StageContext


class _StageRun:
    __slots__ = ("stage", "uid", "pipe", "tasks", "exhausted", "outstanding", "failed", "names", "index")

    def __init__(self, stage: Stage, uid: str, pipe: _PipeRun):
        self.stage, self.uid, self.pipe = stage, uid, pipe
        self.tasks = iter(stage.tasks)
        self.exhausted = False
        self.outstanding = 0  # pulled from the iterator, not yet terminal
        self.failed = 0
        self.names: set[str] = set()  # explicit task names seen (duplicates are errors)
        self.index = 0


class _PipeRun:
    __slots__ = ("pipeline", "uid", "next_stage", "stage", "stopped", "failed")

    def __init__(self, pipeline: Pipeline, uid: str):
        self.pipeline, self.uid = pipeline, uid
        self.next_stage = 0
        self.stage: _StageRun | None = None
        self.stopped = False
        self.failed = False

class _Item:
    """A task pulled from its stage: waiting, then running."""

    __slots__ = ("task", "uid", "srun", "attempt", "deps", "pid", "pidfd", "future", "placement",
                 "deadline", "t0", "sandbox", "spec")

    def __init__(self, task: Task, uid: str, srun: _StageRun, attempt: int, spec: str | None = None):
        self.task, self.uid, self.srun, self.attempt = task, uid, srun, attempt
        self.spec = spec
        self.deps = task.dependency_uids() + [
            r[0] for r in (parse_ref(i.source) for i in task.staged_inputs()) if r
        ]
        self.pid = self.pidfd = None
        self.future = self.placement = self.deadline = self.sandbox = None
        self.t0 = 0.0



class Walker:
    """The pipeline/stage half of ``Engine``; see the module docstring."""

    def _fill(self) -> None:
        while not self.workflow_done and len(self.pipes) < self.max_pipelines and len(self.waiting) < self.window:
            try:
                pipeline = next(self.workflow)
            except StopIteration:
                self.workflow_done = True
                break
            self._add_pipeline(pipeline)
        for prun in list(self.pipes):
            if len(self.waiting) >= self.window:
                break
            self._advance(prun)

    def _add_pipeline(self, pipeline: Pipeline) -> None:
        if not isinstance(pipeline, Pipeline):
            raise EnsembleError(f"workflow item {self.pipe_count} is {pipeline!r}, not a Pipeline")
        name = pipeline.name or f"p{self.pipe_count}"
        self.pipe_count += 1
        if pipeline.name is not None:
            if name in self.pipe_names:
                raise EnsembleError(f"pipeline name {name!r} is used twice; pipeline names must be unique")
            self.pipe_names.add(name)
        pipeline.uid = name
        pipeline.validate()
        self.pipes.append(_PipeRun(pipeline, name))
        self.moves += 1

    def _advance(self, prun: _PipeRun) -> None:
        """Start the pipeline's next stage if it may, then pull its tasks up to the window."""
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
            while len(self.waiting) < self.window:
                try:
                    task = next(srun.tasks)
                except StopIteration:
                    srun.exhausted = True
                    break
                self._add_task(srun, task)
            if not srun.exhausted:
                return

    def _dep_state(self, uid: str) -> TaskState | None:
        if uid.count(".") == 2:
            return self.journal.state(uid)
        return self.journal.stage_state(uid)

    def _start_next_stage(self, prun: _PipeRun) -> bool:
        pipeline = prun.pipeline
        if prun.stopped or prun.next_stage >= len(pipeline.stages):
            self._end_pipeline(prun)
            return False
        if prun.next_stage == 0:
            for dep in pipeline.dependency_uids():
                state = self._dep_state(dep)
                if state is None or not state.terminal:
                    return False  # wait
                if state is not TaskState.DONE:
                    prun.failed = True
                    self._end_pipeline(prun, TaskState.SKIPPED)
                    return False
        stage = pipeline.stages[prun.next_stage]
        if not isinstance(stage, Stage):
            raise EnsembleError(f"pipeline {prun.uid}: stage {prun.next_stage} is {stage!r}, not a Stage")
        name = stage.name or f"s{prun.next_stage}"
        stage.uid = f"{prun.uid}.{name}"
        stage.validate()
        for dep in stage.dependency_uids():
            state = self._dep_state(dep)
            if state is None or not state.terminal:
                return False
            if state is not TaskState.DONE:
                prun.next_stage += 1
                self.grow_total([stage], -1)
                self.journal.stage(stage.uid, prun.uid, TaskState.SKIPPED)
                prun.stopped, prun.failed = True, True
                return self._start_next_stage(prun)
        prun.next_stage += 1
        if stage.when is not None and not stage.when(self.results):
            self.grow_total([stage], -1)
            self.journal.stage(stage.uid, prun.uid, TaskState.SKIPPED)
            return self._start_next_stage(prun)
        prun.stage = _StageRun(stage, stage.uid, prun)
        self.moves += 1
        return True

    def _add_task(self, srun: _StageRun, task: Task) -> None:
        if not isinstance(task, Task):
            raise EnsembleError(f"stage {srun.uid}: task {srun.index} is {task!r}, not a Task")
        if task.name is not None:
            if task.name in srun.names:
                raise EnsembleError(f"stage {srun.uid}: task name {task.name!r} is used twice")
            srun.names.add(task.name)
        task.uid = f"{srun.uid}.{task.name or f't{srun.index}'}"
        srun.index += 1
        task.validate()
        why = self._impossible(task)
        if why:
            raise EnsembleError(f"task {task.uid} {why}; lower its needs or give the run more resources")
        srun.outstanding += 1
        attempt = 0
        spec = spec_text(task)
        if self.replay:
            row = self.journal.replay_row(task.uid)
            if row is not None:
                state, attempt, old = row
                if old is not None and old != spec:
                    raise EnsembleError(
                        f"journal {self.journal_path} holds another workflow: {diff_specs(task.uid, old, spec)}. "
                        "Resume with the workflow that started it, or start afresh with new=True "
                        "(shoal run --new)")
                if state.terminal:
                    self.session_counts["replayed", state] += 1  # for the progress line
                    self._settle_counts(srun, state)
                    return
        item = _Item(task, task.uid, srun, attempt, spec)
        self.waiting[id(item)] = item
        self.moves += 1

    def _settle(self, item: _Item, state: TaskState) -> None:
        self.session_counts[state] += 1
        self._settle_counts(item.srun, state)

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
            self.grow_total(prun.pipeline.stages[prun.next_stage:], -1)  # stages that will not run
        self.moves += 1
        if state is None:
            state = TaskState.FAILED if prun.failed else TaskState.DONE
        self.journal.stage(prun.uid, prun.uid, state)
        self.journal.commit()

    def add_pipeline(self, pipeline: Pipeline) -> None:
        self._add_pipeline(pipeline)
        self.plan_pipes.append(pipeline)
        self.grow_total(pipeline.stages)
