"""The dashboard attacked: a browser's DNS-rebinding idiom against the real server,
and the backend reached only through the runtime.api.Backend protocol."""

from __future__ import annotations

import ast
import http.client
import os
import urllib.parse

import pytest

import shoal
from shoal.dashboard import Dashboard

HERE = os.path.dirname(os.path.abspath(__file__))
DASHBOARD = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shoal", "dashboard")


def _get(url: str, path: str, host: str | None):
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path, headers={} if host is None else {"Host": host})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_rebound_host_name_gets_nothing_from_a_loopback_dashboard():
    # Before: GET /api/state with "Host: evil.example:PORT" (what a browser sends for a page
    # of evil.example whose name was rebound to 127.0.0.1) answered 200 with the whole state.
    with shoal.Pilot(1, dashboard=0) as pilot:
        port = urllib.parse.urlsplit(pilot.dashboard_url).port
        for path in ("/api/state", "/events", "/workers", "/static/dashboard.js"):
            status, body = _get(pilot.dashboard_url, path, f"evil.example:{port}")
            assert status == 403 and b"pilot" not in body, path
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", None):
            status, body = _get(pilot.dashboard_url, "/api/state", host)
            assert status == 200 and b'"pilot"' in body, host


def test_a_dashboard_told_to_listen_beyond_loopback_answers_any_host_name():
    with shoal.Pilot(1, dashboard="0.0.0.0:0") as pilot:
        port = urllib.parse.urlsplit(pilot.dashboard_url).port
        url = f"http://127.0.0.1:{port}/"
        assert _get(url, "/api/state", f"node17.cluster:{port}")[0] == 200


@pytest.mark.parametrize("header, name", [("127.0.0.1:80", "127.0.0.1"), ("[::1]:8787", "::1"),
                                          ("[::1]", "::1"), ("LocalHost.:1", "localhost"),
                                          ("evil.example", "evil.example")])
def test_host_name(header, name):
    from shoal.dashboard.app import host_name

    assert host_name(header) == name


def test_the_dashboard_reaches_the_backend_only_through_the_protocol():
    # Before: sources.py probed getattr(backend, "monitor", None), getattr(backend, "client")
    # and getattr(backend, "kind", "?"): a renamed member became a silent fallback.
    for fname in os.listdir(DASHBOARD):
        if not fname.endswith(".py"):
            continue
        with open(os.path.join(DASHBOARD, fname), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr",
                                                                                  "hasattr"):
                target = ast.unparse(node.args[0])
                assert "backend" not in target and "client" not in target, \
                    f"{fname}:{node.lineno}: {ast.unparse(node)} probes the backend"


def test_a_backend_without_monitor_is_a_clear_error_not_a_fallback():
    class NotABackend:  # the protocol's one member the sampler calls, missing
        kind = "local"

        def stats(self, timeout=2.0):
            return {"backend": "local", "workers": []}

    with pytest.raises(AttributeError, match="monitor"):
        Dashboard(backend=NotABackend())


@pytest.mark.timeout(30)  # a regression blocks in open(): fail instead
def test_a_fifo_as_journal_is_an_error_on_the_page_not_a_hung_server(tmp_path):
    # Before: check_journal opened the path to read SQLite's magic: open() of a FIFO blocks
    # until a writer comes, so `shoal dashboard fifo` hung at start and a JournalSource on one
    # hung every page request (each in a thread of its own, under the source's lock).
    from shoal.dashboard.journal import journal_state

    fifo = str(tmp_path / "run.db")
    os.mkfifo(fifo)
    state = journal_state(fifo)
    assert "not a regular file" in state["error"]


@pytest.mark.timeout(60)
def test_a_forked_child_does_not_keep_the_closed_dashboards_port():
    # Before: a child forked while the dashboard ran (multiprocessing's fork, a DataLoader
    # worker) kept a copy of the listening socket; after the pilot's close() the port stayed
    # bound, and a client connecting got no "refused" but a request that hung.
    import faulthandler
    import socket

    read_end, write_end = os.pipe()
    pilot = shoal.Pilot(1, dashboard=0)
    try:
        parts = urllib.parse.urlsplit(pilot.dashboard_url)
        faulthandler.cancel_dump_traceback_later()  # its watchdog can hang a forked child
        pid = os.fork()
        if pid == 0:  # the child: wait until the parent has looked, then leave
            os.close(write_end)
            os.read(read_end, 1)
            os._exit(0)
        os.close(read_end)
    finally:
        pilot.close()
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((parts.hostname, parts.port), timeout=5).close()
    finally:
        os.close(write_end)
        os.waitpid(pid, 0)


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_a_real_browser_on_a_rebound_name_reads_nothing(tmp_path):
    # DNS rebinding as a browser does it: Chromium resolves evil.example to 127.0.0.1
    # (--host-resolver-rules), opens the attacker's page there and fetches /api/state from
    # it (same origin as far as the browser knows).  Before: 200 and the whole state.
    from chromium import chromium

    with shoal.Pilot(1, dashboard=0) as pilot, chromium(
            tmp_path / "profile", ["--host-resolver-rules=MAP evil.example 127.0.0.1"]) as ctx:
        port = urllib.parse.urlsplit(pilot.dashboard_url).port
        page = ctx.new_page()
        resp = page.goto(f"http://evil.example:{port}/workers")
        assert resp.status == 403
        got = page.evaluate("fetch('/api/state').then(r => r.status)")
        assert got == 403
        resp = page.goto(pilot.dashboard_url + "api/state")  # the user's own tab: fine
        assert resp.status == 200 and '"pilot"' in resp.text()


@pytest.mark.parametrize("interval", [0, -1, float("nan"), float("inf"), "1"])
def test_a_sampling_interval_that_is_not_a_positive_number_is_refused(interval):
    # Before: interval=0 made the sampler thread wait(0) in a loop (a core at 100%), nan
    # raised inside the thread, inf sampled once.
    with pytest.raises(ValueError, match="interval must be a number of seconds > 0"):
        Dashboard(journal="run.db", interval=interval)


@pytest.mark.timeout(30)  # a regression blocks in open(): fail instead
def test_a_fifo_or_directory_as_trace_file_is_named(tmp_path):
    # Before: `shoal trace FIFO --html out.html` blocked in open() until a writer came.
    from shoal.dashboard.report import TraceError, load

    fifo = str(tmp_path / "trace.json")
    os.mkfifo(fifo)
    for path in (fifo, str(tmp_path)):
        with pytest.raises(TraceError, match="is not a regular file"):
            load(path)
