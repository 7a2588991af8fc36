"""The durable journal: one SQLite database (WAL mode) holding every task's state.

Driver-only (one connection, one thread).  Write-ahead rule: the engine
records a state change and ``commit()``s it *before* acting on it — a task is
journaled RUNNING before its process is spawned or its function submitted,
DONE before any successor may start.  Writes are grouped: one scheduling pass
journals all the tasks it is about to start in one transaction, and one
reaping pass all the tasks that ended, so the cost is two commits per batch,
not per task.

Resume: rows in a terminal state (DONE, FAILED, SKIPPED, CANCELED) are kept
and their tasks are not run again; rows left RUNNING by a killed driver are
turned back to PENDING (their processes, if still alive — pid and start time
both match — are killed first) and run again.  Tasks never journaled are
simply pending.  Function results are stored pickled, so ``when=`` and stage
``post_exec`` callbacks see the same values after a resume.

Durability: ``synchronous=NORMAL`` in WAL mode survives the driver being
killed (SIGKILL, OOM) at any instant — committed transactions are in the OS
page cache — but the last commits may be lost on power failure; pass
``durability="full"`` to fsync every commit.

Rejected alternatives: an append-only JSON log (resume would scan it all;
SQLite answers "state of uid X" with an index lookup and lets ``shoal status``
read while a run writes); a row per state change (the current row per task is
enough to resume, and keeps a million-task journal to a million rows).
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import time
from collections.abc import Iterator

from .model import EnsembleError, Failure, FailureKind, TaskState

SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS tasks (
    uid TEXT PRIMARY KEY, pipeline TEXT, stage TEXT, kind TEXT, state TEXT NOT NULL,
    attempt INTEGER DEFAULT 0, pid INTEGER, pid_start REAL, sandbox TEXT,
    started REAL, finished REAL, exit_code INTEGER, failure TEXT, reason TEXT,
    stderr_tail TEXT, result BLOB, outputs TEXT, session INTEGER);
CREATE TABLE IF NOT EXISTS stages (uid TEXT PRIMARY KEY, pipeline TEXT, state TEXT NOT NULL);
"""


class Unpicklable:
    """Stands in for a function result that could not be pickled into the journal."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"<unpicklable result {self.text}>"


def _dump(value) -> bytes | None:
    if value is None:
        return None
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return pickle.dumps(Unpicklable(repr(value)[:200]))


class Journal:
    """The run's SQLite journal; driver thread only."""

    def __init__(self, path: str, *, resume: bool = False, durability: str = "normal"):
        self.path = os.path.abspath(path)
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise EnsembleError(f"journal {path!r}: directory {parent} does not exist; create it first")
        existed = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            sync = {"normal": "NORMAL", "full": "FULL", "off": "OFF"}.get(durability)
            if sync is None:
                raise EnsembleError(f"durability={durability!r}: choose 'normal', 'full' or 'off'")
            self.db.execute(f"PRAGMA synchronous={sync}")
            self.db.executescript(_SCHEMA)
            if existed:
                version = self._meta("schema")
                if version not in (None, SCHEMA_VERSION):
                    raise EnsembleError(f"journal {path}: schema {version}, this shoal writes {SCHEMA_VERSION}")
                has_rows = self.db.execute("SELECT 1 FROM tasks LIMIT 1").fetchone() is not None
                if has_rows and not resume:
                    raise EnsembleError(
                        f"journal {path} already holds a run; pass resume=True (shoal run --resume) "
                        "to finish it, or use another journal path"
                    )
            self.session = int(self._meta("sessions") or 0) + 1
            self.db.execute("BEGIN")
            self._set_meta("schema", SCHEMA_VERSION)
            self._set_meta("sessions", str(self.session))
            self._set_meta(f"session.{self.session}.started", repr(time.time()))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.close()
            raise
        self._in_tx = False

    # -- plumbing ---------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def _tx(self) -> None:
        if not self._in_tx:
            self.db.execute("BEGIN")
            self._in_tx = True

    def commit(self) -> None:
        """Make every change since the last commit durable; the engine acts only after this."""
        if self._in_tx:
            self.db.execute("COMMIT")
            self._in_tx = False

    def close(self) -> None:
        try:
            self.commit()
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self.db.close()

    def set_meta(self, key: str, value: str) -> None:
        self._tx()
        self._set_meta(key, value)

    def meta(self, key: str) -> str | None:
        return self._meta(key)

    # -- reads ------------------------------------------------------------------------
    def state(self, uid: str) -> TaskState | None:
        row = self.db.execute("SELECT state FROM tasks WHERE uid=?", (uid,)).fetchone()
        return TaskState(row[0]) if row else None

    def attempt(self, uid: str) -> int:
        row = self.db.execute("SELECT attempt FROM tasks WHERE uid=?", (uid,)).fetchone()
        return row[0] if row and row[0] else 0

    def result(self, uid: str):
        row = self.db.execute("SELECT state, result, exit_code, kind FROM tasks WHERE uid=?", (uid,)).fetchone()
        if row is None:
            raise KeyError(uid)
        state, blob, exit_code, kind = row
        if kind == "executable":
            return exit_code
        return pickle.loads(blob) if blob is not None else None

    def row(self, uid: str) -> dict | None:
        cur = self.db.execute("SELECT * FROM tasks WHERE uid=?", (uid,))
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cur.description], row, strict=True))

    def stage_state(self, uid: str) -> TaskState | None:
        row = self.db.execute("SELECT state FROM stages WHERE uid=?", (uid,)).fetchone()
        return TaskState(row[0]) if row else None

    def counts(self) -> dict[TaskState, int]:
        rows = self.db.execute("SELECT state, count(*) FROM tasks GROUP BY state")
        return {TaskState(s): n for s, n in rows}

    def stage_counts(self) -> dict[str, dict[TaskState, int]]:
        out: dict[str, dict[TaskState, int]] = {}
        for stage, state, n in self.db.execute(
            "SELECT stage, state, count(*) FROM tasks GROUP BY stage, state ORDER BY min(rowid)"
        ):
            out.setdefault(stage, {})[TaskState(state)] = n
        return out

    def failures(self, limit: int | None = None) -> Iterator[dict]:
        sql = ("SELECT uid, failure, exit_code, reason, stderr_tail, attempt FROM tasks "
               "WHERE state=? ORDER BY finished")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        for uid, kind, code, reason, tail, attempt in self.db.execute(sql, (TaskState.FAILED.value,)):
            yield {"uid": uid, "kind": FailureKind(kind) if kind else None, "exit_code": code,
                   "reason": reason, "stderr_tail": tail or "", "attempts": attempt}

    def outputs(self) -> dict[str, list[str]]:
        out = {}
        for uid, text in self.db.execute("SELECT uid, outputs FROM tasks WHERE outputs IS NOT NULL"):
            out[uid] = [p for p in text.split("\n") if p]
        return out

    def timings(self) -> tuple[float | None, float | None]:
        return self.db.execute("SELECT min(started), max(finished) FROM tasks").fetchone()

    # -- writes (each inside the current transaction; commit() publishes) -------------
    def running(self, uid: str, pipeline: str, stage: str, kind: str, attempt: int,
                sandbox: str | None, now: float) -> None:
        self._tx()
        self.db.execute(
            "INSERT INTO tasks (uid, pipeline, stage, kind, state, attempt, sandbox, started, session) "
            "VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO UPDATE SET state=excluded.state, "
            "attempt=excluded.attempt, sandbox=excluded.sandbox, started=excluded.started, "
            "session=excluded.session, pid=NULL, pid_start=NULL",
            (uid, pipeline, stage, kind, TaskState.RUNNING.value, attempt, sandbox, now, self.session),
        )

    def pid(self, uid: str, pid: int, start: float) -> None:
        self._tx()
        self.db.execute("UPDATE tasks SET pid=?, pid_start=? WHERE uid=?", (pid, start, uid))

    def done(self, uid: str, now: float, *, result=None, exit_code: int | None = None,
             outputs: list[str] | None = None) -> None:
        self._tx()
        self.db.execute(
            "UPDATE tasks SET state=?, finished=?, result=?, exit_code=?, outputs=?, failure=NULL, "
            "reason=NULL, pid=NULL WHERE uid=?",
            (TaskState.DONE.value, now, _dump(result), exit_code,
             "\n".join(outputs) if outputs else None, uid),
        )

    def failed(self, uid: str, failure: Failure, now: float, *, final: bool) -> None:
        """Record a failed attempt: FAILED if ``final``, else back to PENDING for a retry."""
        self._tx()
        state = TaskState.FAILED if final else TaskState.PENDING
        self.db.execute(
            "UPDATE tasks SET state=?, finished=?, failure=?, exit_code=?, reason=?, stderr_tail=?, "
            "pid=NULL WHERE uid=?",
            (state.value, now, failure.kind.value, failure.exit_code, failure.message,
             failure.stderr_tail, uid),
        )

    def settled(self, uid: str, pipeline: str, stage: str, kind: str, state: TaskState,
                reason: str, now: float) -> None:
        """A task that never ran: SKIPPED (when=/dependency) or CANCELED."""
        self._tx()
        self.db.execute(
            "INSERT INTO tasks (uid, pipeline, stage, kind, state, reason, finished, session) "
            "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO UPDATE SET state=excluded.state, "
            "reason=excluded.reason, finished=excluded.finished",
            (uid, pipeline, stage, kind, state.value, reason, now, self.session),
        )

    def unstart(self, uid: str) -> None:
        """A RUNNING task stopped by the walltime: PENDING again, so resume runs it."""
        self._tx()
        self.db.execute("UPDATE tasks SET state=?, pid=NULL WHERE uid=?", (TaskState.PENDING.value, uid))

    def stage(self, uid: str, pipeline: str, state: TaskState) -> None:
        self._tx()
        self.db.execute("INSERT OR REPLACE INTO stages VALUES (?,?,?)", (uid, pipeline, state.value))

    def take_over(self) -> list[tuple[str, int, float]]:
        """On resume: RUNNING rows -> PENDING; returns (uid, pid, pid_start) of those with a pid."""
        self._tx()
        rows = self.db.execute(
            "SELECT uid, pid, pid_start FROM tasks WHERE state=?", (TaskState.RUNNING.value,)
        ).fetchall()
        self.db.execute("UPDATE tasks SET state=? WHERE state=?",
                        (TaskState.PENDING.value, TaskState.RUNNING.value))
        self.commit()
        return [(u, p, s) for u, p, s in rows if p]


def open_readonly(path: str) -> sqlite3.Connection:
    """A read-only connection (``shoal status`` while a run writes)."""
    if not os.path.exists(path):
        raise EnsembleError(f"no journal at {path}; run a workflow with journal={path!r} first")
    return sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True)
