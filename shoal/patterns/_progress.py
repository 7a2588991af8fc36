"""A skeleton driver's progress: sample, publish, draw a terminal line.

A driver loop that waits for tasks calls ``cf.wait(..., timeout=ticker.timeout())``
and then ``ticker.tick()``; every ``interval`` seconds the ticker calls
``sample()`` (a read of shared counters the workers already keep: no message, no
per-task cost), adds rates and the elapsed time, publishes the record with
``shoal.publish`` (the dashboard's progress page reads it) and, on a terminal,
redraws one progress line on stderr once the call has run ``LINE_AFTER_S``.

``progress_text`` is shoal's one progress-line format, used by every line shoal
draws: the search skeletons' ``progress=``, ``all_pairs.compute``'s terminal line and
``shoal run``'s (and EnTK's) ensemble line::

    search: 1,234,567 nodes  456,789 nodes/s  incumbent 34  elapsed 0:03
    ensemble: [#####...............] 120/400 tasks  31.0 tasks/s  done 118  running 2  failed 2  elapsed 0:04  ETA 0:09
    search: 2,057 nodes  41,140 nodes/s  elapsed 0:00 (done)

The topic first (the dashboard topic the same numbers are published on), then the
count of the unit the work is measured in (with a bar and the total when there is
one), its rate, the fields of that kind of work, the elapsed time, the ETA when a
total exists, and on the last line ``(done)`` or ``(failed)``.

The line is off when stderr is not a TTY, when ``SHOAL_PROGRESS=0``, or when
tqdm is not installed (it comes with ``shoal[dashboard]``).
"""

from __future__ import annotations

import enum
import os
import sys
import time
from collections.abc import Callable

import shoal

INTERVAL_S = 0.5


class State(enum.Enum):
    """A progress record's ``state`` (its value is what the record holds)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


_runs: dict[str, int] = {}
LINE_AFTER_S = 2.0  # short calls draw nothing


def clock(seconds: float | None) -> str:
    """``M:SS`` or ``H:MM:SS``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    seconds = int(seconds + 0.5)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def progress_text(topic: str, count: int, unit: str, *, total: int | None = None,
                  bounded: bool = False, rate: float | None = None, fields=(),
                  elapsed: float | None = None, eta: float | None = None,
                  state: State | None = None, width: int = 20) -> str:
    """One progress line (the module docstring shows the format).

    ``total``: the count when the work is finished (a bar and ``count/total`` are drawn,
    and an ETA); ``bounded``: the work has a total that is not known yet (``count/?``,
    ``ETA ?``).  ``fields``: ``(name, value)`` pairs, Nones left out.  ``state``: the last
    line's ``State.DONE`` or ``State.FAILED``; ``State.RUNNING`` or None adds nothing.
    """
    if total is not None:
        filled = min(width, width * count // total) if total > 0 else width
        head = f"[{'#' * filled}{'.' * (width - filled)}] {count:,}/{total:,} {unit}"
    elif bounded:
        head = f"{count:,}/? {unit}"
    else:
        head = f"{count:,} {unit}"
    parts = [head]
    if rate is not None:
        parts.append(f"{_rate(rate)} {unit}/s")
    parts += [f"{name.replace('_', ' ')} {_fmt(value)}" for name, value in fields if value is not None]
    if elapsed is not None:
        parts.append(f"elapsed {clock(elapsed)}")
    if total is not None or bounded:
        parts.append(f"ETA {clock(eta)}")
    line = f"{topic}: " + "  ".join(parts)
    if state is not None and state is not State.RUNNING:
        line += f" ({state.value})"
    return line


def _fmt(value) -> str:
    if isinstance(value, float):
        if abs(value) >= 1e4:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


class _Line:
    """One redrawn line on stderr (tqdm), only on a terminal."""

    def __init__(self, topic: str):
        self.topic = topic
        self.bar = None
        self.enabled = os.environ.get("SHOAL_PROGRESS", "1") != "0" and _isatty(sys.stderr)

    def draw(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                self.enabled = False
                return
            tqdm.monitor_interval = 0  # no monitor thread: the line is redrawn by tick()
            try:
                cols, rows = os.get_terminal_size(sys.stderr.fileno())
            except (OSError, ValueError, AttributeError):
                cols, rows = 100, 24
            # (a terminal that reports 0 rows or columns, e.g. under script(1), still gets a line)
            self.bar = tqdm(total=None, bar_format="{desc}", file=sys.stderr, leave=False,
                            ncols=cols or 100, nrows=rows or 24)
        self.bar.set_description_str(text, refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Ticker:
    """Samples a running skeleton for the dashboard and the terminal: driver thread only."""

    def __init__(self, topic: str, sample: Callable[[], dict], *, rates=(),
                 text: Callable[[dict], str] | None = None, interval: float = INTERVAL_S,
                 clock=time.monotonic):
        self.topic = topic
        self.sample = sample
        self.rates = tuple(rates)  # fields that also get a ``<field>_per_s``
        self.text = text  # record -> the terminal line (progress_text); None: no line
        self.interval = interval
        self.clock = clock
        self.t0 = clock()
        self.next = self.t0 + interval
        self.prev: tuple[float, dict] | None = None
        self.line = _Line(topic)
        if text is None:  # the caller draws its own line (the search skeletons' progress=)
            self.line.enabled = False
        _runs[topic] = self.run = _runs.get(topic, 0) + 1  # pages show the latest call's records

    def timeout(self) -> float:
        """Seconds until the next sample is due (a wait's timeout)."""
        return max(0.0, self.next - self.clock())

    wait_s = timeout  # the name the search driver's progress objects use

    def tick(self, final: bool = False, failed: bool = False) -> None:
        """A record when one is due; ``final``: the last one (state ``done``, or ``failed``
        when the work raised)."""
        now = self.clock()
        if now < self.next and not final:
            return
        self.next = now + self.interval
        try:
            rec = dict(self.sample())
        except Exception:  # progress never breaks the work it reports
            return
        rec["elapsed_s"] = round(now - self.t0, 3)
        rec["run"] = self.run
        if self.prev is not None:
            t_prev, r_prev = self.prev
            dt = now - t_prev
            for k in self.rates:
                if dt > 0 and isinstance(rec.get(k), (int, float)) and isinstance(r_prev.get(k), (int, float)):
                    rec[f"{k}_per_s"] = round((rec[k] - r_prev[k]) / dt, 3)
        self.prev = (now, rec)
        state = (State.FAILED if failed else State.DONE) if final else State.RUNNING
        rec["state"] = state.value
        try:
            shoal.publish(self.topic, rec)
        except (TypeError, ValueError):
            return
        if now - self.t0 >= LINE_AFTER_S and not final and self.text is not None:
            try:
                self.line.draw(self.text(rec))
            except Exception:  # progress never breaks the work it reports
                return

    def close(self, final: bool = True, failed: bool = False) -> None:
        """The last record (state ``done``, or ``failed``) and the line erased."""
        if final:
            self.tick(final=True, failed=failed)
        self.line.close()

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # an exception still ends the record (state failed): it stayed "running" before
        self.close(final=True, failed=exc_type is not None)


class Both:
    """Several progress objects (``wait_s()``/``tick(final)``) driven as one; Nones dropped."""

    def __init__(self, *progs):
        self.progs = [p for p in progs if p is not None]

    def wait_s(self) -> float:
        return min(p.wait_s() for p in self.progs)

    def tick(self, final: bool = False, failed: bool = False) -> None:
        for p in self.progs:
            p.tick(final=final, failed=failed)
