"""The progress display of a run: ``run(progress=True)`` and ``shoal run``'s line on stderr.

``progress_callback(progress)`` turns ``run``'s ``progress=`` argument into the
callable the engine calls (at most every 0.5 s, and once at the end) with a
dict: done, running, failed, skipped, waiting, total, rate, eta, elapsed,
final.  ``Progress`` draws it: one line redrawn in place on a terminal, a plain
line every ``interval`` seconds elsewhere; it also publishes each dict to the
progress board (topic ``ensemble``), which ``shoal run --dashboard`` shows.
"""

from __future__ import annotations

import sys
import time

import shoal

from .._progress import State, progress_text
from .model import EnsembleError, TaskState


def settled(counts) -> int:
    """Tasks that ended (done, failed, skipped, canceled) in ``counts`` (TaskState -> n): what
    a rate counts, in the progress line, the run's report and ``shoal status`` alike."""
    return sum(counts.get(s, 0) for s in TaskState if s.terminal)


def progress_record(counts, replayed, total: int | None, running: int, waiting: int, elapsed: float,
                    final: bool) -> dict:
    """The dict a progress callback gets, from this session's ``counts`` (TaskState -> n) and the
    tasks a resume found finished (``replayed``)."""
    now = settled(counts)  # this session's
    rate = now / elapsed if elapsed > 0 else 0.0
    old = {s: replayed[s] for s in (TaskState.DONE, TaskState.FAILED, TaskState.SKIPPED, TaskState.CANCELED)}
    eta = None
    if total is not None:
        left = max(0, total - now - sum(old.values()))
        eta = 0.0 if left == 0 else (left / rate if rate > 0 else None)
    return {"done": counts[TaskState.DONE] + old[TaskState.DONE], "running": running,
            "failed": counts[TaskState.FAILED] + old[TaskState.FAILED],
            "skipped": counts[TaskState.SKIPPED] + old[TaskState.SKIPPED] + old[TaskState.CANCELED],
            "waiting": waiting, "total": total, "rate": rate, "eta": eta, "elapsed": elapsed, "final": final}


def progress_line(p: dict) -> str:
    """The run's line in shoal's one progress-line format (``progress_text``):
    ``ensemble: [########............] 4/10 tasks  2.0 tasks/s  done 3  running 2  failed 1
    elapsed 0:02  ETA 0:03`` (``4/? tasks`` and ``ETA ?`` while a lazy workflow's total is
    unknown; the last line ends in ``(done)``, or ``(failed)`` when a task failed)."""
    done, failed = p["done"], p["failed"]
    finished = done + failed + p.get("skipped", 0)
    state = None
    if p.get("final"):
        state = State.FAILED if failed else State.DONE
    return progress_text("ensemble", finished, "tasks", total=p.get("total"), bounded=True,
                         rate=p["rate"], fields=(("done", done), ("running", p["running"]),
                                                 ("failed", failed)),
                         elapsed=p["elapsed"], eta=p.get("eta"), state=state)


class Progress:
    """The ``shoal run`` progress display on ``stream`` (stderr).

    On a terminal: one line redrawn in place (the engine calls at most every
    0.5 s).  Elsewhere (a log file, a pipe): one plain line every ``interval``
    seconds at most, and one at the end.
    """

    def __init__(self, stream, interval: float = 10.0, clock=time.monotonic):
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval
        self.clock = clock
        self.last: float | None = None
        self.drawn = False

    def __call__(self, p: dict) -> None:
        try:
            shoal.publish("ensemble", p)  # for the dashboard of ``shoal run --dashboard``
        except (TypeError, ValueError):
            pass  # a progress display never stops the run
        line = progress_line(p)
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if p.get("final") else ""))
            self.drawn = not p.get("final")
        else:
            now = self.clock()
            if not p.get("final") and self.last is not None and now - self.last < self.interval:
                return
            if self.last is None and not p.get("final"):
                self.last = now  # the first line only after one interval: short runs print one line
                return
            self.last = now
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def progress_callback(progress):
    """``run(progress=...)``: True -> the ``shoal run`` line on stderr; False/None -> none; a callable."""
    if progress is None or progress is False:
        return None
    if progress is True:
        return Progress(sys.stderr)
    if not callable(progress):
        raise EnsembleError(f"progress={progress!r}: give True, False or a callable taking a dict")
    return progress
