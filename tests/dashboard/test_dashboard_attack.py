"""The dashboard attacked (r-break): a browser's DNS-rebinding idiom against the real server,
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
