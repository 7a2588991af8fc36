"""Live pages for a running pilot, the progress of skeletons, and ensemble journals.

Data flow::

    pilot's backend ──monitor() once a second──────────► PilotSource (sampler thread)
    shoal.publish(topic, record) ──► progress board ────┘      │
    run.db (SQLite, read-only) ──────────────► JournalSource    │
                                                    ▼           ▼
                          Starlette app (app.py): /workers /progress /journal,
                          /api/state (JSON), /events (server-sent events)
                                                    ▲
                          uvicorn in one daemon thread (server.py), 127.0.0.1 by default

``shoal.Pilot(dashboard=0)`` starts one (``pilot.dashboard_url``); ``shoal dashboard
run.db`` serves a journal; ``shoal run --dashboard`` both the journal and the run's
progress.  Closing the pilot tells open pages (a last event says so), stops the
sampler and the server, and frees the port.

Invariants: the runtime's hot path does nothing for the dashboard (workers are
asked for the counters they keep anyway, once per interval, answered between
tasks); a failing sampler shows an error on the page and never raises into the
pilot; nothing listens beyond 127.0.0.1 unless a host is given; a sample is
encoded once however many pages are open, and a page that stops reading costs
a bounded few KiB until it is dropped (broadcast.py).

Rejected: Bokeh (a server with its own document model and a large page for what
is a table, a heat strip and line charts); a hand-rolled ``http.server``;
websockets (one-way updates are what server-sent events are for, and EventSource
reconnects by itself).
"""

from __future__ import annotations

from .server import DEFAULT_HOST, parse_address

__all__ = ["Dashboard", "parse_address", "DEFAULT_HOST"]


class Dashboard:
    """The pages over a pilot's backend and/or a journal, served until ``close()``."""

    def __init__(self, *, backend=None, journal: str | None = None, address=0,
                 interval: float = 1.0, max_streams: int | None = None, stall_s: float = 10.0):
        """``max_streams``: event streams (open pages) served at once, past which ``/events``
        answers 503 (default ``$SHOAL_DASHBOARD_MAX_STREAMS``, else 256); ``stall_s``: a
        stream that has not taken a sample for this long is dropped (broadcast.py)."""
        try:
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as exc:
            from .._errors import install_hint

            raise ImportError(f"the dashboard needs starlette and uvicorn: "
                              f"{install_hint('dashboard', 'starlette uvicorn tqdm')} ({exc})") from None
        from .app import LOOPBACK_NAMES, host_name, make_app
        from .broadcast import max_streams_from
        from .server import WebServer
        from .sources import JournalSource, PilotSource

        if (isinstance(interval, bool) or not isinstance(interval, (int, float))
                or not 0 < interval < float("inf")):  # 0 spun the sampler at 100% CPU
            raise ValueError(f"Dashboard interval must be a number of seconds > 0, got {interval!r}")
        if (isinstance(stall_s, bool) or not isinstance(stall_s, (int, float))
                or not 0 < stall_s < float("inf")):
            raise ValueError(f"Dashboard stall_s must be a number of seconds > 0, got {stall_s!r}")
        max_streams = max_streams_from(max_streams)
        host, port = parse_address(address)
        self.sources: dict = {}
        self._stopping = False
        try:
            if journal is not None:
                self.sources["journal"] = JournalSource(journal, interval)
            if backend is not None:
                self.sources["pilot"] = PilotSource(backend, interval)
            if not self.sources:
                raise ValueError("Dashboard needs a backend= or a journal=")
            self.app = make_app(self.sources, lambda: self._stopping,
                                loopback_only=host_name(host) in LOOPBACK_NAMES,
                                abort=lambda client: self.server.abort(client),
                                unsent=lambda client: self.server.unsent(client),
                                max_streams=max_streams, stall_s=stall_s)
            self.server = WebServer(self.app, host, port)
            self.server.start()
        except BaseException:
            for src in self.sources.values():
                src.close()
            raise
        self.url = self.server.url
        self.closed = False

    def close(self) -> None:
        """Tell the pages (a last event), stop sampling and serving, free the port; idempotent."""
        if self.closed:
            return
        self.closed = True
        for src in self.sources.values():
            src.close()
        import time

        deadline = time.monotonic() + 1.0  # open event streams send "closed" and end (0.25 s)
        while self.app.state.streams and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.app.state.streams:  # pages that stopped reading still hold a stream
            self.server.reset_all()
        self._stopping = True
        self.server.close()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
