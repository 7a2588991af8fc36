"""The Starlette app: three pages, one JSON endpoint, one server-sent event stream.

Routes::

    /            -> the first page there is (workers, else journal)
    /workers     the pilot's workers (one row each) and the last minute's timeline
    /progress    every topic on the progress board (search, all_pairs, training, ...)
    /journal     an ensemble journal: states by pipeline and stage, ETA, failures
    /api/state   {"pages": [...], "pilot": {...}, "journal": {...}}  (JSON)
    /events      the same object as server-sent events, whenever a source's seq grows;
                 a last event with "closed": true when the pilot closes, then the end

The pages are static HTML plus ``static/dashboard.js`` (rendering, and a small SVG
chart drawer of our own, so nothing is fetched from the internet); they draw
whatever state arrives and say when the stream ends or breaks.
"""

from __future__ import annotations

import asyncio
import json
import os

from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
PAGES = ("workers", "progress", "journal")


def _dumps(obj) -> str:
    return json.dumps(obj, default=str, separators=(",", ":"))


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


def make_app(sources: dict, stopping=lambda: False, *, loopback_only: bool = False) -> Starlette:
    """An app over ``sources`` (``{"pilot": PilotSource, "journal": JournalSource}``, either
    optional); ``stopping()`` true ends every event stream (the server is closing).
    ``app.state.streams`` counts the event streams open now.  ``loopback_only``: refuse
    requests whose Host header is not a loopback name (``LoopbackOnly``)."""

    def pages() -> list[str]:
        out = []
        if "pilot" in sources:
            out += ["workers", "progress"]
        if "journal" in sources:
            out += ["journal"] if "pilot" in sources else ["journal", "progress"]
        return out

    def snapshot() -> dict:
        state = {"pages": pages()}
        for name, src in sources.items():
            state[name] = src.state()
        state["closed"] = all(src.closed for src in sources.values())
        return state

    with open(os.path.join(STATIC, "page.html"), encoding="utf-8") as f:
        template = f.read()

    async def page(request):
        name = request.url.path.strip("/")
        if name not in pages():
            return HTMLResponse(f"<h1>no {name} page here</h1><p>pages: {', '.join(pages())}</p>",
                                status_code=404)
        nav = " ".join(f'<a href="/{p}" class="{"on" if p == name else ""}">{p}</a>' for p in pages())
        return HTMLResponse(template.replace("{{page}}", name).replace("{{nav}}", nav))

    async def root(request):
        return RedirectResponse(f"/{pages()[0]}")

    async def api_state(request):
        state = await asyncio.to_thread(snapshot)
        return JSONResponse(json.loads(_dumps(state)))

    async def events(request):
        async def stream():
            last = None
            yield "retry: 2000\n\n"
            app.state.streams += 1
            try:
                async for chunk in updates(last):
                    yield chunk
            finally:
                app.state.streams -= 1

        async def updates(last):
            while True:
                state = await asyncio.to_thread(snapshot)
                key = tuple(s.get("seq") for k, s in state.items() if isinstance(s, dict))
                if key != last or state["closed"]:
                    last = key
                    yield f"data: {_dumps(state)}\n\n"
                if state["closed"] or stopping():
                    yield "event: end\ndata: {}\n\n"
                    return
                await asyncio.sleep(0.25)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    routes = [Route("/", root), Route("/api/state", api_state), Route("/events", events)]
    routes += [Route(f"/{p}", page) for p in PAGES]
    routes.append(Mount("/static", app=StaticFiles(directory=STATIC), name="static"))
    from starlette.middleware import Middleware

    app = Starlette(routes=routes, middleware=[Middleware(LoopbackOnly)] if loopback_only else [])
    app.state.streams = 0
    return app
