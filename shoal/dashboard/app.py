"""The Starlette app: three pages, one JSON endpoint, one server-sent event stream.

Routes::

    /            -> the first page there is (workers, else journal)
    /workers     the pilot's workers (one row each) and the last minute's timeline
    /progress    every topic on the progress board (search, all_pairs, training, ...)
    /journal     an ensemble journal: states by pipeline and stage, ETA, failures
    /graph       the journal's workflow drawn: pipelines, stages, tasks by state (Graphviz)
    /api/graph.svg  that picture (503 and one line when Graphviz is not installed)
    /api/state   {"pages": [...], "pilot": {...}, "journal": {...}}  (JSON)
    /events      the same object as server-sent events, whenever a source's seq grows;
                 a last event with "closed": true when the pilot closes, then the end.
                 One encoding per sample for all streams, slow streams dropped, at most
                 ``max_streams`` open (broadcast.py)

The pages are static HTML plus ``static/dashboard.js`` (rendering, and a small SVG
chart drawer of our own, so nothing is fetched from the internet); they draw
whatever state arrives and say when the stream ends or breaks.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import time

from starlette.applications import Starlette
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._json import dumps
from .broadcast import (
    DEFAULT_MAX_STREAMS,
    GZIP_HEADER,
    MAX_STREAMS_ENV,
    SLICE_BYTES,
    Broadcaster,
    StreamsFull,
    gzip_block,
)
from .plain import page_text

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
PAGES = ("workers", "progress", "journal", "graph")


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without port or brackets: ``[::1]:80`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header[1:]
    return header.rsplit(":", 1)[0].rstrip(".") if ":" in header else header.rstrip(".")


class LoopbackOnly:
    """ASGI middleware: answer 403 to a request whose ``Host`` is not a loopback name.

    A server on 127.0.0.1 is still reachable from a web page the user opens
    elsewhere, by DNS rebinding: evil.example resolves to 127.0.0.1 after the page
    loaded, and the browser sends the page's requests (same origin, as far as it
    knows) with ``Host: evil.example:PORT``; /api/state would hand over the paths,
    task names and stderr tails on it.  The browser cannot forge the Host header,
    so checking it closes that door (Jupyter's ``allow_remote_access`` check).
    Only for a loopback listener: ``dashboard="HOST:PORT"`` chose to be reached by
    other names."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = dict(scope.get("headers") or ()).get(b"host")
            if host is not None and host_name(host.decode("latin-1")) not in LOOPBACK_NAMES:
                body = b"this dashboard answers only to 127.0.0.1/localhost (Host header)"
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def make_app(sources: dict, stopping=lambda: False, *, loopback_only: bool = False,
             abort=lambda client: None, unsent=lambda client: 0,
             max_streams: int = DEFAULT_MAX_STREAMS, stall_s: float = 10.0) -> Starlette:
    """An app over ``sources`` (``{"pilot": PilotSource, "journal": JournalSource}``, either
    optional); ``stopping()`` true ends every event stream (the server is closing).
    ``app.state.streams`` counts the event streams open now, ``app.state.broadcaster`` is
    the sampler they share (broadcast.py: ``abort``, ``unsent``, ``max_streams``, ``stall_s``).
    ``loopback_only``: refuse requests whose Host header is not a loopback name."""

    def pages() -> list[str]:
        out = []
        if "pilot" in sources:
            out += ["workers", "progress"]
        if "journal" in sources:
            out += ["journal", "graph"] if "pilot" in sources else ["journal", "graph", "progress"]
        return out

    def snapshot() -> dict:
        state = {"pages": pages()}
        for name, src in sources.items():
            state[name] = src.state()
        state["closed"] = all(src.closed for src in sources.values())
        return state

    with open(os.path.join(STATIC, "page.html"), encoding="utf-8") as f:
        template = f.read()
    broadcaster = Broadcaster(snapshot, abort=abort, unsent=unsent, stopping=stopping,
                              max_streams=max_streams, stall_s=stall_s)

    async def page(request):
        name = request.url.path.strip("/")
        if name not in pages():
            return HTMLResponse(f"<h1>no {name} page here</h1><p>pages: {', '.join(pages())}</p>",
                                status_code=404)
        nav = " ".join(f'<a href="/{p}" class="{"on" if p == name else ""}">{p}</a>' for p in pages())
        _, body, _ = await broadcaster.current()  # the sample /api/state and the streams share
        plain = (f'<pre id="plain">{html.escape(page_text(name, json.loads(body)))}</pre>'
                 '<p class="muted" id="plain-note">The numbers when this page was served; its script '
                 'redraws it live. Without a browser read <a href="/api/state">/api/state</a> (JSON) '
                 'or <code>/events</code> (the same object, streamed).</p>')
        # the sample last: a task name or stderr line reading "{{nav}}" stays text
        return HTMLResponse(template.replace("{{page}}", name).replace("{{nav}}", nav).replace("{{plain}}", plain))

    async def root(request):
        return RedirectResponse(f"/{pages()[0]}")

    async def api_state(request):
        _, body, _ = await broadcaster.current()  # the sample the streams share
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})

    graphs = GraphCache(sources.get("journal"))

    async def api_graph(request):
        status, body, media = await asyncio.to_thread(graphs.svg)
        return Response(body, status_code=status, media_type=media, headers={"Cache-Control": "no-store"})

    routes = [Route("/", root), Route("/api/state", api_state), Route("/api/graph.svg", api_graph),
              Route("/events", EventStream(broadcaster, app_state=lambda: app.state))]
    routes += [Route(f"/{p}", page) for p in PAGES]
    routes.append(Mount("/static", app=StaticFiles(directory=STATIC), name="static"))
    from starlette.middleware import Middleware

    app = Starlette(routes=routes, middleware=[Middleware(LoopbackOnly)] if loopback_only else [])
    app.state.streams = 0
    app.state.broadcaster = broadcaster
    return app


class GraphCache:
    """``/api/graph.svg``: the journal's graph (patterns/ensemble/graph.py), laid out again only
    when its DOT text changed (a state changed), one layout at a time; any thread."""

    def __init__(self, journal_source):
        import threading

        self.source = journal_source
        self._lock = threading.Lock()
        self._dot: str | None = None
        self._svg = b""

    def svg(self) -> tuple[int, bytes, str]:
        from ..patterns.ensemble.graph import (
            GraphError,
            GraphvizMissing,
            from_journal,
            render_svg,
            to_dot,
        )
        from ..patterns.ensemble.model import EnsembleError

        if self.source is None:
            return 404, b"no journal here: the graph page draws an ensemble journal", "text/plain"
        with self._lock:
            try:
                dot = to_dot(from_journal(self.source.path))
                if dot != self._dot:
                    self._svg, self._dot = render_svg(dot), dot
            except (GraphError, EnsembleError) as exc:
                code = 503 if isinstance(exc, GraphvizMissing) else 500
                return code, str(exc).encode(), "text/plain; charset=utf-8"
            return 200, self._svg, "image/svg+xml"


class EventStream:
    """``/events`` (ASGI): one stream's pump over the broadcaster's shared samples.

    Events: first ``hello`` (its ``id:`` names this stream, so a browser's reconnect
    sends it back as ``Last-Event-ID``), then ``dropped`` if the stream this one replaces
    was dropped for falling behind, then the states (``data:``), and ``end`` after the
    last.  Past ``max_streams``: 503 and one line saying so."""

    def __init__(self, broadcaster: Broadcaster, app_state):
        self.broadcaster = broadcaster
        self.app_state = app_state

    async def __call__(self, scope, receive, send) -> None:
        headers = dict(scope.get("headers") or ())
        last_id = headers.get(b"last-event-id", b"").decode("latin-1").strip() or None
        try:
            stream, notice = self.broadcaster.subscribe(scope.get("client"), last_id)
        except StreamsFull as full:
            body = (f"this dashboard has {full.args[0]} live streams open, its cap (max_streams, "
                    f"${MAX_STREAMS_ENV}); close some pages, or read /api/state\n").encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"retry-after", b"10"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        state = self.app_state()
        state.streams += 1
        watcher = None
        accept = headers.get(b"accept-encoding", b"").decode("latin-1").replace(" ", "").lower()
        stream.gzip = "gzip" in accept and "gzip;q=0" not in accept
        try:
            head = [(b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no"),
                    (b"vary", b"accept-encoding")]
            if stream.gzip:
                head.append((b"content-encoding", b"gzip"))
            await send({"type": "http.response.start", "status": 200, "headers": head})
            hello = dumps({"stream": stream.token, "max_streams": self.broadcaster.max_streams,
                           "stall_s": self.broadcaster.stall_s}, compact=True)
            first = f"retry: 2000\nid: {stream.token}\nevent: hello\ndata: {hello}\n\n"
            if notice is not None:
                first += f"event: dropped\ndata: {dumps(notice, compact=True)}\n\n"
            body = GZIP_HEADER + gzip_block(first.encode()) if stream.gzip else first.encode()
            await send({"type": "http.response.body", "body": body, "more_body": True})
            watcher = asyncio.ensure_future(self._until_disconnect(receive, stream))
            await self._pump(stream, send)
        finally:
            state.streams -= 1
            self.broadcaster.unsubscribe(stream)
            if watcher is not None:
                watcher.cancel()

    @staticmethod
    async def _until_disconnect(receive, stream) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        stream.dropped = stream.dropped or "the client went away"
        stream.wake.set()

    @staticmethod
    async def _pump(stream, send) -> None:
        while True:
            await stream.wake.wait()
            stream.wake.clear()
            if stream.dropped:
                return  # aborted by the server, or gone: nothing more can be sent
            frames, final = stream.pending, stream.final
            stream.pending = None
            if frames is not None:
                frame = frames[1] if stream.gzip else frames[0]
                stream.sending_since = time.monotonic()
                for i in range(0, len(frame), SLICE_BYTES):
                    await send({"type": "http.response.body", "body": frame[i:i + SLICE_BYTES],
                                "more_body": True})
                    if stream.dropped:
                        return
                stream.sending_since = None
                stream.sent += 1
            if final or stream.ending:
                end = _END_GZIP if stream.gzip else _END
                await send({"type": "http.response.body", "body": end, "more_body": False})
                return


_END = b"event: end\ndata: {}\n\n"
_END_GZIP = gzip_block(_END)  # then the stream just ends: no final block, no trailer (its CRC
# would be per stream); the page has closed its EventSource on "end" by then
