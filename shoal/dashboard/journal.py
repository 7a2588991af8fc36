"""An ensemble journal as the journal page's state: read-only SQL over the run's SQLite file.

Counts by state for the run, each pipeline and each stage; the rate so far and an
ETA when the total is known (``total`` from the engine's progress record, which
``shoal run --dashboard`` publishes; a bare journal does not know the tasks
never journaled); failures with their stderr tails.  Works while a run writes
the journal (WAL readers never block the writer) and on a finished one.

Errors (no file, not a journal, a locked or corrupt file) come back as an
``error`` string that names the path, never as an exception to the page.
"""

from __future__ import annotations

import os
import sqlite3
import time

from ..patterns.ensemble.journal import open_readonly
from ..patterns.ensemble.model import EnsembleError, TaskState

STATES = [s.value for s in TaskState]
FAILURES_SHOWN = 50


def check_journal(path: str) -> str:
    """``path`` if it holds an ensemble journal; EnsembleError naming it otherwise."""
    if not os.path.exists(path):
        raise EnsembleError(f"no journal at {path}; run a workflow with journal={path!r} "
                            "(shoal run ... --journal PATH) first")
    if os.path.isdir(path):
        raise EnsembleError(f"{path} is a directory, not an ensemble journal (an SQLite file)")
    try:
        db = open_readonly(path)
        try:
            db.execute("SELECT uid, pipeline, stage, state FROM tasks LIMIT 1").fetchall()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise EnsembleError(f"{path} is not an ensemble journal: {exc}") from None
    return path


def journal_state(path: str, total: int | None = None) -> dict:
    """The journal page's state (JSON-ready); ``{"error": ...}`` when it cannot be read."""
    try:
        check_journal(path)
        db = open_readonly(path)
    except EnsembleError as exc:
        return {"path": path, "error": str(exc)}
    try:
        counts = dict.fromkeys(STATES, 0)
        for state, n in db.execute("SELECT state, count(*) FROM tasks GROUP BY state"):
            counts[state] = n
        pipelines: dict[str, dict] = {}
        stages: dict[str, dict] = {}
        for pipeline, stage, state, n in db.execute(
                "SELECT pipeline, stage, state, count(*) FROM tasks GROUP BY pipeline, stage, state "
                "ORDER BY min(rowid)"):
            pipelines.setdefault(pipeline, dict.fromkeys(STATES, 0))[state] += n
            stages.setdefault(stage, dict.fromkeys(STATES, 0))[state] += n
        failures = [
            {"uid": u, "kind": k, "exit_code": c, "reason": r, "stderr_tail": (t or "")[-2000:],
             "attempts": a}
            for u, k, c, r, t, a in db.execute(
                "SELECT uid, failure, exit_code, reason, stderr_tail, attempt FROM tasks "
                "WHERE state=? ORDER BY finished DESC LIMIT ?", (TaskState.FAILED.value, FAILURES_SHOWN))
        ]
        first, last = db.execute("SELECT min(started), max(finished) FROM tasks").fetchone()
        running_since = db.execute("SELECT min(started) FROM tasks WHERE state=?",
                                   (TaskState.RUNNING.value,)).fetchone()[0]
    except sqlite3.DatabaseError as exc:
        return {"path": path, "error": f"cannot read the journal {path}: {exc}"}
    finally:
        db.close()
    settled = sum(counts[s.value] for s in TaskState if s.terminal)
    known = sum(counts.values())
    finished = counts[TaskState.RUNNING.value] == 0 and counts[TaskState.PENDING.value] == 0
    now = time.time()
    end = last if finished and last else now
    elapsed = (end - first) if first else 0.0
    rate = settled / elapsed if elapsed > 0 else 0.0
    eta = None
    if total is not None:
        left = max(0, total - settled)
        eta = 0.0 if left == 0 else (left / rate if rate > 0 else None)
    elif finished and known:
        eta = 0.0
    return {
        "path": path, "error": None, "counts": counts, "pipelines": pipelines, "stages": stages,
        "failures": failures, "settled": settled, "known": known, "total": total,
        "started": first, "last_finished": last, "running_since": running_since,
        "elapsed_s": round(elapsed, 3), "rate": round(rate, 3), "eta_s": eta,
        "finished": finished and known > 0,
    }
