"""Every task attempt a journal holds, with what it used: ``shoal status --tasks``, the report.

Pure reading, from a read-only connection (``journal.open_readonly``), safe while a driver
writes.  One ``Attempt`` per attempt: each failed attempt (the ``failed_attempts`` table,
retried or final) and the latest attempt of every task that did not fail (its ``tasks`` row,
in its current state: done, running, pending, skipped, canceled).  A task waiting out its
``retry_delay`` shows as its failed attempts only: the next one has not started.

A journal of an older schema (before the usage columns, usage.py) reads with those figures
None; it is not written to here (the driver migrates it when it resumes the run).

Rejected alternative: one row per task (its latest attempt): the attempts that failed before
a retry succeeded are what a user looking at CPU time or retry spacing needs to see.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from .journal import JournalError
from .model import TaskState
from .usage import COLUMNS as USAGE_COLUMNS

_BASE = ("uid", "pipeline", "stage", "kind", "state", "attempt", "started", "finished", "exit_code",
         "failure", "reason", "stderr_tail")
_USAGE = tuple(name for name, _ in USAGE_COLUMNS)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of one task; times in epoch seconds, ``max_rss`` and bytes as counts."""

    uid: str
    pipeline: str | None
    stage: str | None
    kind: str | None
    state: TaskState  # a failed attempt that was retried is FAILED
    attempt: int
    started: float | None
    finished: float | None
    exit_code: int | None
    failure: str | None  # a FailureKind value
    reason: str | None
    stderr_tail: str | None
    host: str | None = None
    node: str | None = None
    cpu_user: float | None = None
    cpu_sys: float | None = None
    max_rss: int | None = None
    read_chars: int | None = None
    write_chars: int | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None

    @property
    def seconds(self) -> float | None:
        """Wall seconds from its start to its end, as the driver saw them (None if unknown)."""
        if _number(self.started) and _number(self.finished) and self.state is not TaskState.RUNNING:
            return max(0.0, self.finished - self.started)
        return None

    @property
    def cpu(self) -> float | None:
        """User plus system CPU seconds (None if not measured)."""
        if _number(self.cpu_user) and _number(self.cpu_sys):
            return self.cpu_user + self.cpu_sys
        return None

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["state"], out["seconds"], out["cpu"] = self.state.value, self.seconds, self.cpu
        return out


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _columns(db, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _picked(have: set[str], alias: str, names) -> str:
    """``alias.name`` for each column ``have`` holds, ``NULL AS name`` for the others."""
    return ", ".join(f"{alias}.{name}" if name in have else f"NULL AS {name}" for name in names)


def attempts(db, *, state: TaskState | None = None, stage: str | None = None,
             latest: int | None = None) -> Iterator[Attempt]:
    """The attempts of the journal open on ``db`` (by start; those never started last),
    filtered by state (a failed attempt that was retried counts as FAILED) and by stage uid
    (``p.s``); ``latest=n``: only the n that ended last, the newest first (the dashboard)."""
    tasks, failed = _columns(db, "tasks"), _columns(db, "failed_attempts")
    on_stage = " AND t.stage=?" if stage is not None else ""
    parts, params = [], []
    if failed and state in (None, TaskState.FAILED):
        parts.append(
            f"SELECT f.uid, t.pipeline, t.stage, t.kind, '{TaskState.FAILED.value}', f.attempt, f.started, "
            "f.finished, f.exit_code, f.failure, f.reason, "
            "CASE WHEN f.attempt = t.attempt THEN t.stderr_tail END, "  # the latest attempt's tail
            f"{_picked(failed, 'f', _USAGE)} FROM failed_attempts f JOIN tasks t ON t.uid = f.uid "
            f"WHERE 1{on_stage}")
        params += [stage] if stage is not None else []
    own = f"SELECT {_picked(tasks, 't', _BASE + _USAGE)} FROM tasks t WHERE 1{on_stage}"
    params += [stage] if stage is not None else []
    if failed:  # a FAILED row, or a PENDING one waiting to retry, is its last failed attempt,
        # listed from failed_attempts (a row that ran again after retry_failed reset its
        # attempts may share a number with a failure of the earlier run: it is listed)
        own += (f" AND NOT (t.state IN ('{TaskState.FAILED.value}', '{TaskState.PENDING.value}') AND EXISTS "
                "(SELECT 1 FROM failed_attempts f WHERE f.uid = t.uid AND f.attempt = t.attempt))")
    if state is not None:
        own += " AND t.state=?"
        params.append(state.value)
    parts.append(own)
    sql = f"SELECT * FROM ({' UNION ALL '.join(parts)}) "
    if latest is None:
        sql += "ORDER BY started IS NULL, started, uid, attempt"
    else:
        sql += f"WHERE finished IS NOT NULL ORDER BY finished DESC LIMIT {int(latest)}"
    for row in db.execute(sql, params):
        yield _attempt(row)


def _attempt(row) -> Attempt:
    values = dict(zip(_BASE + _USAGE, row, strict=True))
    values["uid"] = str(values["uid"])
    try:
        values["state"] = TaskState(values["state"])
    except ValueError:
        raise JournalError(f"a journal row of task {values['uid'][:200]!r} has the state "
                           f"{str(values['state'])[:60]!r}, which shoal never writes (damaged?)") from None
    values["attempt"] = values["attempt"] if isinstance(values["attempt"], int) else 0
    for name in ("started", "finished", "cpu_user", "cpu_sys"):  # a journal is a trust boundary:
        if not _number(values[name]):  # what is not a number shows as unknown
            values[name] = None
    for name in ("max_rss", "read_chars", "write_chars", "read_bytes", "write_bytes", "exit_code"):
        if not (isinstance(values[name], int) and not isinstance(values[name], bool)):
            values[name] = None
    for name in ("pipeline", "stage", "kind", "failure", "reason", "stderr_tail", "host", "node"):
        if values[name] is not None:
            values[name] = str(values[name])
    return Attempt(**values)


def fmt_bytes(n: int | None) -> str:
    """``1.5G``, ``200M``, ``12K``, ``512``; ``-`` when unknown."""
    if n is None:
        return "-"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit}" if n < 10 * size else f"{n // size}{unit}"
    return str(n)


def fmt_seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f}"


HEADER = ("task", "try", "state", "host", "node", "started", "secs", "exit", "cpu s", "peak rss",
          "read", "written")


def table_rows(items, clock) -> list[tuple[str, ...]]:
    """The cells of ``shoal status --tasks`` (``clock``: epoch seconds -> text)."""
    rows = []
    for a in items:
        rows.append((a.uid, str(a.attempt), a.state.value, a.host or "-", a.node or "-",
                     clock(a.started) if a.started is not None else "-", fmt_seconds(a.seconds),
                     "-" if a.exit_code is None else str(a.exit_code), fmt_seconds(a.cpu),
                     fmt_bytes(a.max_rss), fmt_bytes(a.read_chars), fmt_bytes(a.write_chars)))
    return rows


def table(items, clock) -> str:
    """Aligned text: one line per attempt under ``HEADER``."""
    rows = [HEADER, *table_rows(items, clock)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)
