"""An ensemble journal as the journal page's state: read-only SQL over the run's SQLite file.

Counts by state for the run, each pipeline and each stage; the rate so far and an
ETA when the total is known (``total`` from the engine's progress record, which
``shoal run --dashboard`` publishes; a bare journal does not know the tasks
never journaled); failures with their stderr tails.  Works while a run writes
the journal (WAL readers never block the writer) and on a finished one.

Errors (no file, not a journal, a locked or corrupt file) come back as an
``error`` string that names the path, never as an exception to the page.  Rows
whose cells are not what shoal writes (``started='abc'``, ``finished=+Inf``) are
listed in ``malformed`` (``RunStatus.malformed``) and the rest is shown.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time

from ..patterns.ensemble.journal import open_readonly
from ..patterns.ensemble.model import EnsembleError, TaskState

STATES = [s.value for s in TaskState]
INTERRUPTED = "interrupted"  # the column of rows a dead driver left RUNNING (RunStatus.interrupted)
FAILURES_SHOWN = 50
RECENT_SHOWN = 20  # the attempts that ended last, with host, CPU time and peak RSS
JOB_EVENTS_SHOWN = 50  # the newest of a dask pilot's job events (grow, shrink, queue state)


def check_journal(path: str) -> str:
    """``path`` if it holds an ensemble journal; EnsembleError naming it otherwise."""
    if not os.path.exists(path):
        raise EnsembleError(f"no journal at {path}; run a workflow with journal={path!r} "
                            "(shoal run ... --journal PATH) first")
    if os.path.isdir(path):
        raise EnsembleError(f"{path} is a directory, not an ensemble journal (an SQLite file)")
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open() forever
        raise EnsembleError(f"{path} is not a regular file (a FIFO, a device?), not an ensemble "
                            "journal (an SQLite file)")
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
    """The journal page's state (JSON-ready); ``{"error": ...}`` when it cannot be read.

    Built on ``RunStatus`` (the same reading as ``shoal status``: planned tasks never
    journaled count as pending, the driver's liveness, rate and ETA from the journal);
    ``total`` (from a running ``shoal run``'s own progress) fills a missing ETA.
    """
    from ..patterns.ensemble.status import RunStatus, failure_line

    try:
        check_journal(path)
        st = RunStatus.load(path, failures=FAILURES_SHOWN)
    except (EnsembleError, sqlite3.DatabaseError, ValueError, KeyError) as exc:
        return {"path": path, "error": str(exc) if isinstance(exc, EnsembleError)
                else f"cannot read the journal {path}: {exc!r}"}
    d = st.to_dict()

    def with_pending(counts: dict, pending, columns) -> dict:
        out = dict.fromkeys(columns, 0)
        out.update(counts)
        if pending is not None:
            out[TaskState.PENDING.value] = pending
        return out

    # rows a dead driver left RUNNING are their own column, as in ``shoal status``: nothing
    # runs them, so they are not "running" (a resume runs them again)
    columns = STATES + ([INTERRUPTED] if d["interrupted"] else [])
    pipelines: dict[str, dict] = {}
    stages: dict[str, dict] = {}
    labels: dict[str, str] = {}
    for p in d["pipelines"]:
        agg = pipelines.setdefault(p["uid"], dict.fromkeys(columns, 0))
        for s in p["stages"]:
            row = with_pending(s["counts"], s["pending"], columns)
            if s["interrupted"]:
                row[INTERRUPTED] = s["interrupted"]
            stages[s["uid"]] = row
            labels[s["uid"]] = s["label"]
            for k, n in row.items():
                agg[k] += n
    counts = with_pending(d["counts"], None, columns)
    if d["interrupted"]:
        counts[INTERRUPTED] = d["interrupted"]
    settled = sum(counts[s.value] for s in TaskState if s.terminal)
    known = sum(counts.values())
    total = d["total"] if d["total"] is not None else total
    finished = d["finished"] or (known > 0 and counts[TaskState.PENDING.value] == 0
                                 and counts[TaskState.RUNNING.value] == 0 and not d["interrupted"])
    now = time.time()
    first, last = d["started"], d["updated"]
    elapsed = ((last if finished and last else now) - first) if first else 0.0
    rate = d["rate"]  # this session's tasks only (None: none settled yet), as shoal status says
    eta = d["eta"]
    if finished:
        eta = 0.0
    elif eta is None and total is not None and rate and d["driver"]["state"] == "alive":
        eta = max(0, total - settled) / rate
    recent = _recent(path)
    failures = [{**f, "stderr_tail": (f["stderr_tail"] or "")[-2000:],
                 "line": failure_line(f["uid"], f["reason"], f["exit_code"], f["attempts"])}
                for f in d["failures"]]
    return {
        "path": path, "error": None, "counts": counts, "pipelines": pipelines, "stages": stages,
        "labels": labels,
        "failures": failures[::-1], "settled": settled, "known": known, "total": total,
        "started": first, "last_finished": last, "driver": d["driver"]["state"],
        "interrupted": d["interrupted"], "elapsed_s": round(elapsed, 3), "rate": None if rate is None else round(rate, 3),
        "eta_s": eta, "finished": finished, "malformed": d["malformed"],
        "job_events": d["job_events"][-JOB_EVENTS_SHOWN:][::-1],  # newest first
        "recent": recent,
    }


def _recent(path: str) -> list[dict]:
    """The attempts that ended last (newest first), with what they used (attempts.py)."""
    from ..patterns.ensemble.attempts import attempts

    try:
        db = open_readonly(path)
        try:
            return [{"uid": a.uid, "attempt": a.attempt, "state": a.state.value, "host": a.host,
                     "node": a.node, "seconds": a.seconds, "cpu": a.cpu, "max_rss": a.max_rss}
                    for a in attempts(db, latest=RECENT_SHOWN)]
        finally:
            db.close()
    except (EnsembleError, sqlite3.DatabaseError):  # the rest of the page says what is wrong
        return []
