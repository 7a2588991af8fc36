"""Honest status of a run, computed from its journal alone: ``RunStatus.load("run.db")``.

Pure reading (a read-only SQLite connection; safe while a driver writes).
``shoal status`` prints ``RunStatus.table()``; a dashboard renders
``RunStatus.to_dict()`` (plain JSON types).  Everything comes from the
journal — no in-memory state of the driver is needed, so any process can
compute it, at any time, for a live, finished or crashed run.

What it reports, and how it stays honest:

* every pipeline and stage **including the ones that have not started**, from
  the plan the driver recorded at the start (identity.py) and the stages
  appended since; a lazy stage's task count is ``None`` (unknown), never a
  guess;
* task counts by ``TaskState``; tasks of the plan never journaled count as
  PENDING; totals; the failures with their stderr tails;
* the **driver's liveness** (``DriverState``): the journal records the
  driver's pid, host and process start time; on the same host the process is
  looked up (pid *and* start time must match, so a reused pid is not mistaken
  for the driver).  A run whose driver died shows ``DEAD`` and its RUNNING rows
  as ``interrupted`` — not "running" forever;
* throughput and an ETA from the tasks finished in the current session
  (``None`` when unknown: lazy workflow, nothing finished yet, driver not
  alive).

Rejected alternative: asking the driver (a socket or a status file it
rewrites): a dead driver cannot answer, which is exactly the case that matters.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import re
import shlex
import socket
import time

from . import pilot_jobs
from .journal import JournalError, open_readonly
from .model import TaskState
from .terminal import printable

_STATES = (TaskState.PENDING, TaskState.RUNNING, TaskState.DONE, TaskState.FAILED,
           TaskState.SKIPPED, TaskState.CANCELED)


class DriverState(enum.Enum):
    ALIVE = "alive"  # the recorded driver process exists (same pid and start time)
    ENDED = "ended"  # the driver closed the journal (finished, drained or stopped)
    DEAD = "dead"  # the driver process is gone without closing the journal (killed, crashed)
    UNKNOWN = "unknown"  # the driver ran on another host; cannot check from here


@dataclasses.dataclass(frozen=True)
class Driver:
    pid: int | None
    host: str | None
    state: DriverState
    since: float | None  # epoch seconds the driver's session started


@dataclasses.dataclass(frozen=True)
class TaskFailure:
    uid: str
    kind: str | None  # a FailureKind value
    exit_code: int | None
    reason: str | None
    stderr_tail: str
    attempts: int


@dataclasses.dataclass(frozen=True)
class StageStatus:
    uid: str
    state: TaskState  # DONE/FAILED/SKIPPED once ended (SKIPPED also: its pipeline ended before
    #                  it started), RUNNING while it has tasks, else PENDING
    counts: dict[TaskState, int]  # journaled tasks by state (RUNNING of a dead driver: see interrupted)
    planned: int | None  # tasks the workflow lists for it (None: lazy or unknown)
    interrupted: int = 0  # rows left RUNNING by a driver that is not alive
    note: str | None = None  # what ``label`` says instead of the state ("stopped", "not started (...)")

    @property
    def label(self) -> str:
        """The state as the tables print it: ``running`` only while a driver runs it; a stage of
        a run that stopped says ``stopped`` (``interrupted``: its driver died), one that will not
        run says why (``not started (pipeline failed at p.sim)``)."""
        return self.note or self.state.value

    @property
    def total(self) -> int | None:
        seen = sum(self.counts.values()) + self.interrupted
        if self.state.terminal:  # ended (or never to run: its pipeline ended first)
            return seen
        return max(self.planned, seen) if self.planned is not None else None

    @property
    def pending(self) -> int | None:
        """Tasks not started yet (journaled PENDING plus those never journaled)."""
        total = self.total
        if total is None:
            return None
        return total - sum(n for s, n in self.counts.items() if s is not TaskState.PENDING) - self.interrupted


@dataclasses.dataclass(frozen=True)
class PipelineStatus:
    uid: str
    state: TaskState
    stages: list[StageStatus]


@dataclasses.dataclass(frozen=True)
class RunStatus:
    """A snapshot of one run, from its journal (see the module docstring)."""

    journal: str
    identity: str | None
    driver: Driver
    pipelines: list[PipelineStatus]
    counts: dict[TaskState, int]  # over all tasks; never-journaled planned tasks count as PENDING
    interrupted: int  # rows left RUNNING by a dead driver (a resume runs them again)
    total: int | None  # None when some stage is lazy and not finished
    failures: list[TaskFailure]
    started: float | None  # first task start, epoch seconds
    updated: float | None  # last task end, epoch seconds
    rate: float | None  # tasks/s settled in the current session
    eta: float | None  # seconds, when the driver is alive and the total known
    sessions: int = 1
    malformed: tuple[str, ...] = ()  # journal cells that are not what shoal writes, in words
    resume_command: str | None = None  # the exact command that finishes this run (journaled)
    job_events: tuple[dict, ...] = ()  # what the dask pilot's batch jobs did (pilot_jobs.py)

    # -- building ---------------------------------------------------------------------
    @classmethod
    def load(cls, path: str, *, failures: int = 100, now: float | None = None) -> RunStatus:
        """The status of the run journaled at ``path`` (JournalError if it is not a journal)."""
        db = open_readonly(path)
        try:
            return cls._build(db, path, failures, time.time() if now is None else now)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            # a journal is a file anyone may have written (a trust boundary): what shoal never
            # writes is a damaged journal, said in one line, not a traceback from deep in here
            raise JournalError(f"journal {path} is damaged or was not written by shoal "
                               f"({type(exc).__name__}: {printable(str(exc)[:200])})") from None
        finally:
            db.close()

    @classmethod
    def _build(cls, db, path: str, limit: int, now: float) -> RunStatus:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        sessions = int(meta.get("sessions") or 1)
        driver = _driver(meta, sessions)
        alive = driver.state in (DriverState.ALIVE, DriverState.UNKNOWN)
        plan = json.loads(meta["plan"]) if meta.get("plan") else []
        rows: dict[str, dict[str, dict[TaskState, int]]] = {}
        order: list[str] = []
        for pipe, stage, state, n in db.execute(
                "SELECT pipeline, stage, state, count(*) FROM tasks GROUP BY pipeline, stage, state "
                "ORDER BY min(rowid)"):
            if pipe not in rows:
                order.append(pipe)
            rows.setdefault(pipe, {}).setdefault(stage, {})[TaskState(state)] = n
        ended = {uid: TaskState(st) for uid, st in db.execute("SELECT uid, state FROM stages")}
        planned_p = {p["uid"]: p for p in plan}
        pipelines = []
        for puid in [p["uid"] for p in plan] + [u for u in order if u not in planned_p]:
            stage_list = [(s["uid"], s["tasks"]) for s in planned_p.get(puid, {"stages": []})["stages"]]
            known = {u for u, _ in stage_list}
            stage_list += [(u, None) for u in rows.get(puid, {}) if u not in known]
            stages = []
            last_started = None  # the stage its pipeline was at when it ended
            for suid, planned in stage_list:
                counts = dict(rows.get(puid, {}).get(suid, {}))
                interrupted = 0 if alive else counts.pop(TaskState.RUNNING, 0)
                note = None
                never = False  # a stage that will not run: its planned tasks count as skipped
                if suid in ended:
                    state = ended[suid]
                    never = state is TaskState.SKIPPED and not counts
                    if never:
                        note = "not started (skipped)"
                elif puid in ended and not counts and not interrupted:
                    state, never = TaskState.SKIPPED, True  # its pipeline ended before it
                    verb = {TaskState.FAILED: "failed", TaskState.SKIPPED: "skipped"}.get(
                        ended[puid], "stopped")
                    note = f"not started (pipeline {verb}" + (f" at {last_started})" if last_started else ")")
                elif counts or interrupted:
                    state = TaskState.RUNNING
                    if driver.state is DriverState.ENDED:
                        note = "stopped"
                    elif driver.state is DriverState.DEAD:
                        note = "interrupted"
                else:
                    state = TaskState.PENDING
                if never and planned:
                    counts = {TaskState.SKIPPED: planned}
                if not never:
                    last_started = suid
                stages.append(StageStatus(suid, state, counts, planned, interrupted, note))
            pstate = ended.get(puid) or (TaskState.RUNNING if any(s.state is not TaskState.PENDING
                                                                   for s in stages) else TaskState.PENDING)
            pipelines.append(PipelineStatus(puid, pstate, stages))
        counts = {s: 0 for s in _STATES}
        interrupted, total = 0, 0
        for p in pipelines:
            for s in p.stages:
                for st, n in s.counts.items():
                    counts[st] += n
                interrupted += s.interrupted
                pend = s.pending
                if pend is None:
                    total = None
                else:
                    counts[TaskState.PENDING] += pend - s.counts.get(TaskState.PENDING, 0)
                    if total is not None:
                        total += s.total
        failures = [TaskFailure(u, k, c, r, t or "", a or 0) for u, k, c, r, t, a in db.execute(
            "SELECT uid, failure, exit_code, reason, stderr_tail, attempt FROM tasks WHERE state=? "
            "ORDER BY finished LIMIT ?", (TaskState.FAILED.value, int(limit)))]
        # a time shoal writes is a finite number of seconds; anything else (a string, +Inf)
        # is named in ``malformed`` and left out of elapsed, rate and ETA (not a TypeError
        # deep in a reader, not Infinity in --json)
        first, last = db.execute(
            f"SELECT (SELECT min(started) FROM tasks WHERE {_TIME_OK.format('started')}), "
            f"(SELECT max(finished) FROM tasks WHERE {_TIME_OK.format('finished')})").fetchone()
        malformed = tuple(_malformed_rows(db))
        since = driver.since
        settled_now = db.execute(
            "SELECT count(*) FROM tasks WHERE session=? AND state IN (?,?,?,?)",
            (sessions, TaskState.DONE.value, TaskState.FAILED.value, TaskState.SKIPPED.value,
             TaskState.CANCELED.value)).fetchone()[0]
        rate = eta = None
        end = now if driver.state is DriverState.ALIVE else (last or now)
        if since and settled_now and end > since:
            rate = settled_now / (end - since)
        if rate and total is not None and driver.state is DriverState.ALIVE:
            left = total - sum(counts[s] for s in _STATES if s.terminal)
            eta = max(0.0, left / rate)
        resume = meta.get("resume_command") or None
        cwd = meta.get("resume_cwd")
        if resume and cwd and cwd != os.getcwd():
            resume = f"cd {shlex.quote(cwd)} && {resume}"
        return cls(path, meta.get("identity"), driver, pipelines, counts, interrupted, total,
                   failures, first, last, rate, eta, sessions, malformed, resume,
                   pilot_jobs.read(meta.get(pilot_jobs.JOURNAL_KEY)))

    # -- reading ----------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every task terminal and the driver gone (a drained or interrupted run is not finished)."""
        return (self.driver.state is DriverState.ENDED and self.total is not None
                and self.counts[TaskState.PENDING] == 0 and self.interrupted == 0
                and self.counts[TaskState.RUNNING] == 0)

    def to_dict(self) -> dict:
        """Plain JSON types (states by their value), for a dashboard or ``--json``."""
        def counts(c):
            return {s.value: n for s, n in c.items()}

        return {
            "journal": self.journal, "identity": self.identity, "sessions": self.sessions,
            "driver": {"pid": self.driver.pid, "host": self.driver.host,
                       "state": self.driver.state.value, "since": self.driver.since},
            "counts": counts(self.counts), "interrupted": self.interrupted, "total": self.total,
            "started": self.started, "updated": self.updated, "rate": self.rate, "eta": self.eta,
            "finished": self.finished, "resume_command": self.resume_command,
            "pipelines": [{"uid": p.uid, "state": p.state.value, "stages": [
                {"uid": s.uid, "state": s.state.value, "label": s.label, "counts": counts(s.counts),
                 "planned": s.planned,
                 "total": s.total, "pending": s.pending, "interrupted": s.interrupted}
                for s in p.stages]} for p in self.pipelines],
            "failures": [dataclasses.asdict(f) for f in self.failures],
            "malformed": list(self.malformed),
            "job_events": list(self.job_events),
        }

    def table(self, max_failures: int = 20) -> str:
        """What ``shoal status`` prints: driver line, per-stage table, totals, ETA, failures."""
        rate = f"{self.rate:.1f} tasks/s" if self.rate else "rate ?"
        lines = [self._driver_line(), *self.stage_table(),
                 f"{rate}  ETA {_clock(self.eta) if self.eta is not None else '?'}",
                 *self.failure_lines(max_failures), *self.job_lines()]
        if self.driver.state is not DriverState.ALIVE and not self.finished:
            resume = self.resume_command or f"shoal run <workflow> --journal {self.journal} --resume"
            lines.append(f"finish with: {resume}")
        return printable("\n".join(lines))

    def stage_table(self) -> list[str]:
        """One row per stage (also those not started) and the totals: the table ``shoal status``
        and a run's own report print, so the two never disagree."""
        cols = [TaskState.DONE, TaskState.RUNNING, TaskState.PENDING, TaskState.FAILED,
                TaskState.SKIPPED, TaskState.CANCELED]
        stages = [s for p in self.pipelines for s in p.stages]
        width = max([len("stage")] + [len(s.uid) for s in stages])
        swidth = max([len("state")] + [len(s.label) for s in stages])
        extra = self.interrupted > 0
        head = f"{'stage':<{width}}  {'state':<{swidth}}  " + "  ".join(f"{c.value:>8}" for c in cols)
        lines = [head + ("  interrupted" if extra else "") + "     total"]
        for s in stages:
            cells = []
            for c in cols:
                n = s.pending if c is TaskState.PENDING else s.counts.get(c, 0)
                cells.append(f"{'?' if n is None else n:>8}")
            row = f"{s.uid:<{width}}  {s.label:<{swidth}}  " + "  ".join(cells)
            if extra:
                row += f"  {s.interrupted:>11}"
            total = s.total
            lines.append(row + f"  {'?' if total is None else total:>8}")
        cells = "  ".join(f"{self.counts[c]:>8}" for c in cols)
        row = f"{'total':<{width}}  {'':<{swidth}}  {cells}" + (f"  {self.interrupted:>11}" if extra else "")
        lines.append(row + f"  {'?' if self.total is None else self.total:>8}")
        return lines

    def job_lines(self, last: int = 10) -> list[str]:
        """``jobs HH:MM:SS text``: the newest of what the pilot's batch jobs did (grow,
        shrink, cancel, queue state), each with its reason."""
        return [f"jobs {time.strftime('%H:%M:%S', time.localtime(e.get('t') or 0))} {e['text']}"
                for e in self.job_events[-last:]]

    def failure_lines(self, max_failures: int = 20) -> list[str]:
        """``FAILED uid: reason`` (one line each) and the last lines of its stderr."""
        lines = []
        for f in self.failures[:max_failures]:
            lines.append(failure_line(f.uid, f.reason, f.exit_code, f.attempts))
            lines += [f"    | {t}" for t in (f.stderr_tail or "").strip().splitlines()[-3:]]
        more = self.counts[TaskState.FAILED] - min(len(self.failures), max_failures)
        if more > 0:
            lines.append(f"... and {more} more failures")
        lines += [f"MALFORMED {m}" for m in self.malformed]
        return lines

    def _driver_line(self) -> str:
        d = self.driver
        who = f"pid {d.pid} on {d.host}"
        if d.state is DriverState.ALIVE:
            return f"run {self.journal}: running (driver {who})"
        if d.state is DriverState.UNKNOWN:
            return f"run {self.journal}: driver {who} (another host: cannot check whether it is alive)"
        if d.state is DriverState.DEAD:
            return (f"run {self.journal}: driver DEAD ({who} is gone without closing the journal; "
                    f"{self.interrupted} tasks were running)")
        c = self.counts
        if self.finished:
            return (f"run {self.journal}: finished: {c[TaskState.DONE]} done, {c[TaskState.FAILED]} failed, "
                    f"{c[TaskState.SKIPPED]} skipped, {c[TaskState.CANCELED]} canceled")
        return f"run {self.journal}: stopped with work left"


def failure_line(uid: str, reason: str | None, exit_code: int | None, attempts: int | None) -> str:
    """``FAILED p.s.t: exit code 3`` -- the reason once, the exit code only where the reason
    does not already say it (never ``exit code None``; ``killed by signal 9`` is exit code -9,
    ``after exit 0`` is exit code 0), the attempts only when there were more."""
    reason = " ".join((reason or "failed").split())
    extra = []
    if exit_code is not None and not _says_exit_code(reason, exit_code):
        extra.append(f"exit code {exit_code}")
    if attempts and attempts > 1:
        extra.append(f"{attempts} attempts")
    return f"FAILED {uid}: {reason}" + (f" ({', '.join(extra)})" if extra else "")


def _says_exit_code(reason: str, code: int) -> bool:
    """Whether ``reason`` already names exit code ``code`` (``exit code 3``, ``after exit 0``,
    ``killed by signal 9`` for -9)."""
    if re.search(rf"\bexit (code )?{code}\b", reason):
        return True
    return code < 0 and re.search(rf"\bsignal {-code}\b", reason) is not None


_TIME_OK = "({0} IS NULL OR (typeof({0}) IN ('integer', 'real') AND abs({0}) < 1e13))"
MALFORMED_SHOWN = 20


def _malformed_rows(db):
    """Words for each task row (up to MALFORMED_SHOWN) whose times are not finite seconds."""
    rows = db.execute(
        f"SELECT uid, started, finished FROM tasks WHERE NOT ({_TIME_OK.format('started')} AND "
        f"{_TIME_OK.format('finished')}) ORDER BY rowid LIMIT ?", (MALFORMED_SHOWN + 1,)).fetchall()
    for i, (uid, started, finished) in enumerate(rows):
        if i == MALFORMED_SHOWN:
            yield "... and more rows like these"
            return
        bad = [f"{name}={value!r}" for name, value in (("started", started), ("finished", finished))
               if not _is_time(value)]
        yield (f"task {printable(str(uid))[:200]!r}: {', '.join(bad)} is not a time "
               "(seconds since 1970); left out of elapsed, rate and ETA")


def _is_time(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and abs(value) < 1e13)


def _driver(meta: dict, sessions: int) -> Driver:
    try:
        rec = json.loads(meta.get("driver") or "{}")
    except ValueError:
        rec = {}
    pid, host, start = rec.get("pid"), rec.get("host"), rec.get("start")
    since = rec.get("since")
    if meta.get(f"session.{sessions}.ended"):
        return Driver(pid, host, DriverState.ENDED, since)
    if pid is None:
        return Driver(None, host, DriverState.UNKNOWN, since)
    if host != socket.gethostname():
        return Driver(pid, host, DriverState.UNKNOWN, since)
    return Driver(pid, host, DriverState.ALIVE if _alive(pid, start) else DriverState.DEAD, since)


def _alive(pid: int, start: float | None) -> bool:
    try:
        import psutil

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return start is None or abs(proc.create_time() - start) < 1.0
    except Exception:
        return False


def _clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
