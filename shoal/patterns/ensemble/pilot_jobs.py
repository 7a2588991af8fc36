"""What a dask pilot's batch jobs did during a run, kept in the run's journal.

The job watch and the elastic pilot's scaler say what happens to the jobs on the logger
``"shoal.jobs"`` (a job PENDING -> RUNNING, still pending and why, an elastic pilot
submitting a job, cancelling a pending one, giving an idle one back, each with its reason).
While an ensemble runs on a dask pilot, ``JobLog`` listens there and the engine copies what
it heard into the journal's meta (key ``JOURNAL_KEY``, a JSON list of
``{"t", "level", "text"}``, the newest ``KEEP`` kept), so ``shoal status`` and the journal
dashboard show them after the pilot is gone::

    scaler / job watch thread ──log──► JobLog (a logging.Handler, a locked list)
    engine loop, each progress tick ──► JobLog.take() ──► journal meta "pilot_jobs"

Rejected: the engine polling ``pilot.stats()`` for the decisions (a round trip to every
node each tick, and only the scaler's steps, not the job watch's notes).
"""

from __future__ import annotations

import json
import logging
import threading

LOGGER = "shoal.jobs"
JOURNAL_KEY = "pilot_jobs"
KEEP = 500  # the newest events kept in the journal


class JobLog(logging.Handler):
    """Collects the ``"shoal.jobs"`` records (INFO and up) between ``attach`` and ``detach``."""

    def __init__(self):
        super().__init__(logging.INFO)
        self._events: list[dict] = []
        self._lock_events = threading.Lock()
        self._level: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_events:
            self._events.append({"t": round(record.created, 3), "level": record.levelname,
                                 "text": record.getMessage()})

    def attach(self) -> JobLog:
        log = logging.getLogger(LOGGER)
        self._level = log.level
        if not log.isEnabledFor(logging.INFO):
            log.setLevel(logging.INFO)  # the job notes are INFO: let them reach this handler
        log.addHandler(self)
        return self

    def detach(self) -> None:
        log = logging.getLogger(LOGGER)
        log.removeHandler(self)
        if self._level is not None:
            log.setLevel(self._level)
            self._level = None

    def take(self) -> list[dict]:
        """The events heard since the last ``take``."""
        with self._lock_events:
            events, self._events = self._events, []
        return events


def merged(stored: str | None, new: list[dict]) -> str:
    """The journal's JSON list with ``new`` appended (the newest ``KEEP`` kept)."""
    try:
        old = json.loads(stored) if stored else []
    except ValueError:
        old = []
    return json.dumps((old + new)[-KEEP:])


def read(stored: str | None) -> tuple[dict, ...]:
    """The events from the journal's meta value (nothing when absent or unreadable)."""
    try:
        events = json.loads(stored) if stored else []
    except ValueError:
        return ()
    return tuple(e for e in events if isinstance(e, dict) and isinstance(e.get("text"), str))


__all__ = ["JobLog", "JOURNAL_KEY", "LOGGER", "KEEP", "merged", "read"]
