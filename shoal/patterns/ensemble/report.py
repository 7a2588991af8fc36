"""What callbacks see (``Results``, ``StageContext``) and what a run returns (``Report``).

``Results`` reads the journal, never an in-memory table, so a million-task
run keeps nothing per finished task in the driver, and a resumed run sees
exactly the values the first run stored.  ``Report`` is built from the
journal at the end of ``run`` (counts by state, failures with exit code and
stderr tail, outputs, timings); ``Report.load(path)`` rebuilds one from a
journal file, which is what ``shoal status`` prints.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from .journal import Journal, open_readonly
from .model import EnsembleError, Pipeline, Stage, TaskState
from .progress import settled
from .terminal import printable  # noqa: F401 - used here and re-exported

if TYPE_CHECKING:
    from .status import RunStatus

def _uid(ref) -> str:
    uid = ref if isinstance(ref, str) else getattr(ref, "path_uid", None)  # EnTK's t.uid is its own
    if uid is None:
        raise EnsembleError(f"{ref!r} has not been scheduled yet, so it has no result")
    return uid


class Results:
    """Read access to finished tasks, by Task object or uid ``"pipeline.stage.task"``.

    ``results[ref]`` is the function's return value (an executable's exit
    code); ``state(ref)``, ``sandbox(ref)`` and ``path(ref, name)`` too.
    """

    def __init__(self, journal: Journal, launcher):
        self._journal = journal
        self._launcher = launcher

    def __getitem__(self, ref):
        uid = _uid(ref)
        state = self._journal.state(uid)
        if state is not TaskState.DONE:
            raise KeyError(f"{uid} has no result (state: {state.value if state else 'not started'})")
        return self._journal.result(uid)

    def get(self, ref, default=None):
        try:
            return self[ref]
        except KeyError:
            return default

    def state(self, ref) -> TaskState:
        return self._journal.state(_uid(ref)) or TaskState.PENDING

    def sandbox(self, ref) -> str:
        return self._launcher.sandbox_of(_uid(ref))

    def path(self, ref, name: str) -> str:
        import os

        return os.path.join(self.sandbox(ref), name)


class StageContext:
    """Given to a stage's ``post_exec(ctx)``: read results, grow or stop the workflow."""

    def __init__(self, walker, prun, stage: Stage):
        self._walker = walker  # walker.Walker: it owns the pipelines, the plan and the total
        self._prun = prun
        self.stage = stage
        self.pipeline: Pipeline = prun.pipeline
        self.results: Results = walker.results
        self.appended = False

    def append(self, *stages: Stage) -> None:
        """Add stages at the end of this pipeline (they run after the current last one)."""
        for s in stages:
            if not isinstance(s, Stage):
                raise EnsembleError(f"append() takes Stage objects, got {s!r}")
        if self._prun.stopped:
            raise EnsembleError(f"pipeline {self._prun.uid} was stopped; it takes no more stages")
        self.pipeline.stages.extend(stages)
        self._walker.grow_total(stages)
        self._walker.note_plan()
        self.appended = True

    def add_pipeline(self, pipeline: Pipeline) -> None:
        """Start a new pipeline now (alongside this one)."""
        self._walker.add_pipeline(pipeline)
        self._walker.note_plan()

    def stop(self) -> None:
        """End this pipeline after the current stage: the remaining stages do not run."""
        self._prun.stopped = True

    @property
    def stage_index(self) -> int:
        """This stage's 0-based position in its pipeline (handy to name appended stages)."""
        return self._prun.next_stage - 1


@dataclasses.dataclass
class Report:
    """The outcome of ``run``: ``ok`` when every task is DONE or SKIPPED and none was left.

    Its counts and its table are the journal's ``RunStatus`` (status.py) read when the run
    ended -- the numbers ``shoal status`` and the dashboard show, never a tally of its own:
    every stage of the plan (those not started too, their tasks counted), planned tasks never
    journaled as pending.  ``tasks_per_s`` counts only the tasks this session settled (done,
    failed, skipped or canceled: the rate the progress line and ``shoal status`` show; a resume's
    report does not credit the tasks earlier sessions finished)."""

    journal: str
    counts: dict[TaskState, int]
    failures: list[dict]
    stages: dict[str, dict[TaskState, int]]
    outputs: dict[str, list[str]]
    started: float | None  # epoch seconds
    wall_s: float
    drained: bool = False  # stopped by walltime= or a signal with work left; resume to finish
    retries: int = 0
    drain_reason: str | None = None  # why it stopped starting tasks (walltime, Ctrl-C, ...)
    interrupted: str | None = None  # "SIGINT"/"SIGTERM" when a signal drained the run
    status: RunStatus | None = None  # the journal's status when the run ended (what table() prints)
    session_done: int | None = None  # tasks DONE in this session (None: a report loaded later)
    session_settled: int | None = None  # tasks that ended in this session, whatever their state
    reused: int = 0  # tasks of this session DONE from a finished task's key (--reuse/--cache), not run

    @property
    def done(self) -> int:
        return self.counts.get(TaskState.DONE, 0)

    @property
    def failed(self) -> int:
        return self.counts.get(TaskState.FAILED, 0)

    @property
    def ok(self) -> bool:
        left = sum(n for s, n in self.counts.items() if not s.terminal)
        return not self.drained and left == 0 and self.failed == 0 \
            and self.counts.get(TaskState.CANCELED, 0) == 0

    @property
    def tasks_per_s(self) -> float:
        """Tasks settled per second in the session that made this report (a report loaded from
        a journal: the rate ``shoal status`` prints, of the journal's last session)."""
        if self.session_settled is None:
            return (self.status.rate or 0.0) if self.status is not None else 0.0
        return self.session_settled / self.wall_s if self.wall_s > 0 else 0.0

    def result(self, uid: str, values="data"):
        """A DONE task's value, read from the journal file (``values='pickle'``: see values.py)."""
        from .values import Values, decode

        db = open_readonly(self.journal)
        try:
            row = db.execute("SELECT state, result, exit_code, kind FROM tasks WHERE uid=?", (uid,)).fetchone()
        finally:
            db.close()
        if row is None or row[0] != TaskState.DONE.value:
            raise KeyError(f"{uid} has no result ({row[0] if row else 'not in the journal'})")
        return row[2] if row[3] == "executable" else decode(row[1], Values.parse(values), uid)

    @classmethod
    def from_journal(cls, path: str, wall0: float, wall_s: float, drained: bool, session_counts,
                     *, outputs: dict | None = None, failures: list | None = None) -> Report:
        """The report of a run that just ended, from its closed journal at ``path``."""
        report = cls.load(path, failures=failures)
        report.started, report.wall_s, report.drained = wall0, wall_s, drained
        report.retries = session_counts.get("retries", 0)
        report.reused = session_counts.get("reused", 0)
        report.session_done = session_counts.get(TaskState.DONE, 0)
        report.session_settled = settled(session_counts)
        report.outputs = outputs or {}
        return report

    @classmethod
    def load(cls, path: str, *, failures: list | None = None) -> Report:
        """The report of the run recorded in the journal at ``path`` (read-only)."""
        from .status import RunStatus

        status = RunStatus.load(path, failures=1000)
        counts = {s: n for s, n in status.counts.items() if n}
        stages = {}
        for p in status.pipelines:
            for st in p.stages:
                c = {s: n for s, n in st.counts.items() if n and s is not TaskState.PENDING}
                if st.pending:
                    c[TaskState.PENDING] = st.pending
                stages[st.uid] = c
        if failures is None:
            failures = [dataclasses.asdict(f) | {"stderr_tail": f.stderr_tail or ""} for f in status.failures]
        wall = (status.updated - status.started) if status.started and status.updated else 0.0
        return cls(path, counts, failures, stages, {}, status.started, wall, status=status)

    def table(self) -> str:
        """Per-stage counts (every stage of the plan, as ``shoal status`` prints them) and the
        failures, one line each with the last lines of their stderr."""
        return printable("\n".join([*self.status.stage_table(), *self.status.failure_lines()]))

    def __str__(self) -> str:
        if self.drained:
            state = f"stopped ({self.drain_reason or 'walltime'}); resume to finish"
        else:
            state = "ok" if self.ok else "not ok"
        when = time.strftime("%H:%M:%S", time.localtime(self.started)) if self.started else "-"
        skipped = self.counts.get(TaskState.SKIPPED, 0)
        this = f" ({self.session_done} in this session)" if self.session_done not in (None, self.done) else ""
        reused = f" ({self.reused} reused)" if self.reused else ""
        return (f"ensemble run {state}: {self.done} done{this}{reused}, {self.failed} failed"
                + (f", {skipped} skipped" if skipped else "")
                + f", started {when}, {self.wall_s:.2f} s, {self.tasks_per_s:.1f} tasks/s\n{self.table()}")
