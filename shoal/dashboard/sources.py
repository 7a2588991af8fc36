"""What the pages show: a live pilot (sampled by a thread) and an ensemble journal (read on demand).

A source has ``state() -> dict`` (JSON-ready, with ``seq``, which grows when the
state changed), ``closed`` and ``close()``.  The app only ever calls those, so
the pages do not care where the numbers come from.

``PilotSource``: a daemon thread ("shoal-dashboard-sampler") calls the
backend's ``monitor()`` (``runtime.api.Backend``: no probing) once per ``interval``, measures each
worker's CPU with psutil, folds the sample into ``workers.Workers`` and takes
the progress board's latest records.  One sample per interval whatever the
number of pages open; tasks never send anything for it.

``JournalSource``: reads the SQLite journal read-only, at most once per
``interval``, whoever asks; a missing or unreadable journal is an ``error``
field the page shows (the file may appear later: a run that is starting).
"""

from __future__ import annotations

import os
import socket
import threading
import time

from ..runtime.progress import BOARD
from . import workers as workers_view


class PilotSource:
    """A live pilot's workers and the progress board; the sampler thread writes, pages read."""

    kind = "pilot"

    def __init__(self, backend, interval: float = 1.0, board=BOARD):
        self.backend = backend
        self.interval = interval
        self.board = board
        self.view = workers_view.Workers(interval)
        self.closed = False
        self.closed_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._procs: dict[int, object] = {}
        self._state: dict = {"kind": self.kind, "seq": 0, "workers": [], "progress": {}}
        self.sample()
        self.thread = threading.Thread(target=self._loop, name="shoal-dashboard-sampler", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - shown on the page, never raised into the pilot
                with self._lock:
                    self._state = {**self._state, "error": f"sampling failed: {exc!r}",
                                   "seq": self._state["seq"] + 1}

    def _cpu_percent(self, pids) -> dict[int, float]:
        import psutil

        out = {}
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first call starts the measurement
                    continue
                out[pid] = round(proc.cpu_percent(None), 1)
            except psutil.Error:
                self._procs.pop(pid, None)
        for pid in set(self._procs) - set(pids):
            del self._procs[pid]
        return out

    def sample(self) -> None:
        raw = self.backend.monitor()  # runtime.api.Backend: every backend has it
        if raw.get("closing"):
            return  # the pilot is shutting down: the page keeps the last numbers
        now = time.time()
        # CPU % from this host's /proc: only for workers on this host (a pid of another
        # host names nothing here, or another process)
        here = socket.gethostname()
        pids = [w.get("pid") for w in raw.get("workers", [])
                if w.get("pid") and w.get("host", here) in (here, None)]
        rows = self.view.update(raw, now, self._cpu_percent(pids))
        progress = self.board.snapshot(last=240)
        with self._lock:
            if self.closed:
                return
            self._state = {
                "kind": self.kind, "seq": self._state["seq"] + 1, "t": now,
                "backend": raw.get("backend", self.backend.kind),
                "workers": rows, "totals": workers_view.totals(rows),
                "driver": raw.get("driver", {}), "nodes": sorted({r["dask_worker"] for r in rows
                                                                 if r.get("dask_worker")}),
                "hosts": workers_view.hosts_of(rows),
                "dask_dashboard": raw.get("dashboard_link"), "progress": progress,
                "interval": self.interval, "closed": False,
            }

    def state(self) -> dict:
        with self._lock:
            return self._state

    def close(self) -> None:
        """The pilot is closing: stop sampling; pages are told (``closed``)."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(5.0)
        with self._lock:
            if not self.closed:
                self.closed, self.closed_at = True, time.time()
                self._state = {**self._state, "closed": True, "closed_at": self.closed_at,
                               "seq": self._state["seq"] + 1,
                               "progress": self.board.snapshot(last=240)}


class JournalSource:
    """An ensemble journal's state, re-read at most once per ``interval``; any thread."""

    kind = "journal"

    def __init__(self, path: str, interval: float = 1.0, board=BOARD):
        self.path = os.path.abspath(path)
        self.board = board
        self.interval = interval
        self.closed = False
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._seq = 0
        self._state: dict = {}

    def state(self) -> dict:
        from .journal import journal_state

        with self._lock:
            now = time.monotonic()
            if self._state and now - self._read_at < self.interval:
                return self._state
            self._read_at = now
            self._seq += 1
            progress = self.board.snapshot(last=240)
            ens = (progress.get("ensemble") or [{}])[-1]  # shoal run's own progress, if here
            self._state = {"kind": self.kind, "seq": self._seq, "t": time.time(),
                           "closed": self.closed, "progress": progress,
                           **journal_state(self.path, total=ens.get("total"))}
            return self._state

    def close(self) -> None:
        self.closed = True
