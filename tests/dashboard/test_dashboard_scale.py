"""The dashboard under many viewers and hostile input, against the real server on 127.0.0.1:
streams that share one encoding, a stream that never reads (dropped, and told on reconnect),
the cap on streams, a malformed journal row, and the CLI's port and host errors."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

import pytest
from dash_tasks import nap, wait_for

from shoal.dashboard import Dashboard
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.runtime.progress import Board

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def strict_json(text):
    """json.loads that refuses NaN/Infinity, as JSON.parse in a browser does."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _journal(path, n=3):
    run([Pipeline([Stage([Task(function=nap, args=(0, i), name=f"t{i}") for i in range(n)])],
                  name="p")], journal=str(path), workers=1)
    return str(path)


class SSE:
    """A raw event-stream client on a real socket: ``read_event()`` parses one event."""

    def __init__(self, url, headers=(), rcvbuf=None, gzip=False):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(30)
        self.sock.connect((parts.hostname, parts.port))
        headers = list(headers) + ([("Accept-Encoding", "gzip, deflate, br")] if gzip else [])
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        self.sock.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{parts.port}\r\n{extra}\r\n".encode())
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        self.status = int(head.split()[1])
        self.chunked = b"chunked" in head.lower()
        self.gunzip = zlib.decompressobj(31) if b"content-encoding: gzip" in head.lower() else None
        self.body = b""

    def _until(self, sep):
        while sep not in self.buf:
            got = self.sock.recv(65536)
            if not got:
                raise EOFError("the server closed the stream")
            self.buf += got
        out, _, self.buf = self.buf.partition(sep)
        return out

    def _more_body(self):
        if not self.chunked:
            got = self.buf or self.sock.recv(65536)
            self.buf = b""
            if not got:
                raise EOFError("the server closed the stream")
            self.body += got
            return
        size = int(self._until(b"\r\n"), 16)
        while len(self.buf) < size + 2:
            got = self.sock.recv(65536)
            if not got:
                raise EOFError("the server closed the stream")
            self.buf += got
        piece = self.buf[:size]
        self.body += self.gunzip.decompress(piece) if self.gunzip is not None else piece
        self.buf = self.buf[size + 2:]

    def read_event(self) -> dict:
        while b"\n\n" not in self.body:
            self._more_body()
        raw, _, self.body = self.body.partition(b"\n\n")
        event = {"event": "message", "data": ""}
        for line in raw.decode().splitlines():
            key, _, value = line.partition(": ")
            event[key] = value
        return event

    def next_state(self) -> str:
        """The data of the next state event (skipping hello, dropped)."""
        while True:
            event = self.read_event()
            if event["event"] == "message" and event["data"].startswith("{"):
                return event["data"]

    def tcp_state(self) -> int:  # 1: ESTABLISHED
        return struct.unpack("B", self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1))[0]

    def close(self):
        self.sock.close()


def test_a_sample_is_encoded_once_for_all_streams(tmp_path):
    # Before: every stream called snapshot() and json.dumps() on its own, 4 times a second:
    # 20 streams took the sources' state 80 times a second and encoded it as often.
    db = _journal(tmp_path / "run.db")
    with Dashboard(journal=db, address=0, interval=0.2) as dash:
        src = dash.sources["journal"]
        calls = []
        inner = src.state
        src.state = lambda: calls.append(1) or inner()
        streams = [SSE(dash.url, gzip=i % 2 == 1) for i in range(20)]  # half take gzip
        try:
            firsts = [s.next_state() for s in streams]
            t0, n0 = time.monotonic(), len(calls)
            seconds = [s.next_state() for s in streams]
            for s in streams:
                s.next_state()
            elapsed, n = time.monotonic() - t0, len(calls) - n0
        finally:
            for s in streams:
                s.close()
    assert sum(s.gunzip is not None for s in streams) == 10
    assert all(strict_json(d)["journal"]["counts"]["done"] == 3 for d in firsts + seconds)
    ticks = elapsed / 0.25 + 2
    assert n <= 2 * ticks, f"{n} state() calls in {elapsed:.2f} s for 20 streams"


@pytest.mark.timeout(180)
def test_a_stream_that_never_reads_is_dropped_and_told_so_on_reconnect(tmp_path):
    # Before: a client that connected and never read kept its stream, and the driver buffered
    # for it, forever (200 such clients: driver memory 44 -> 118 MiB); nothing told it why.
    db = _journal(tmp_path / "run.db")
    with Dashboard(journal=db, address=0, interval=0.05, stall_s=1.0) as dash:
        board = dash.sources["journal"].board = Board()
        for i in range(600):  # a ~400 KB state, a new sample every tick
            board.publish("big", {"step": i, "note": "x" * 600})
        bc = dash.app.state.broadcaster
        reader = SSE(dash.url)  # a page that keeps reading is not dropped
        stalled = SSE(dash.url, rcvbuf=4096)
        hello = stalled.read_event()
        assert hello["event"] == "hello"
        token = hello["id"]
        stop = threading.Event()

        def keep_reading():
            try:
                while not stop.is_set():
                    reader.read_event()
            except (OSError, EOFError):
                if not stop.is_set():
                    raise

        t = threading.Thread(target=keep_reading, daemon=True)
        t.start()
        try:
            wait_for(lambda: bc.drops >= 1, timeout=120)
            wait_for(lambda: stalled.tcp_state() != 1, timeout=10)  # aborted: the socket is dead
            assert bc.drops == 1 and len(bc.streams) == 1 and t.is_alive()
            again = SSE(dash.url, headers=[("Last-Event-ID", token)])
            assert again.read_event()["event"] == "hello"
            notice = again.read_event()
            assert notice["event"] == "dropped"
            assert "a page that stopped reading" in strict_json(notice["data"])["reason"]
            assert again.read_event()["event"] == "message"  # and then the states, as before
            again.close()
            fresh = SSE(dash.url, headers=[("Last-Event-ID", token)])  # told once, not again
            fresh.read_event()
            assert fresh.read_event()["event"] == "message"
            fresh.close()
        finally:
            stop.set()
            stalled.close()
            reader.sock.shutdown(socket.SHUT_RDWR)
            t.join(10)
            reader.close()


def test_past_the_cap_events_answers_503_with_a_line(tmp_path, monkeypatch):
    # Before: no cap: every connection got a stream (and its own encodings) however many.
    db = _journal(tmp_path / "run.db")
    with Dashboard(journal=db, address=0, max_streams=2) as dash:
        a, b = SSE(dash.url), SSE(dash.url)
        a.read_event(), b.read_event()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(dash.url + "events", timeout=10)
        assert err.value.code == 503 and err.value.headers["Retry-After"] == "10"
        assert "2 live streams open, its cap (max_streams" in err.value.read().decode()
        assert urllib.request.urlopen(dash.url + "api/state", timeout=10).status == 200
        a.close()
        wait_for(lambda: len(dash.app.state.broadcaster.streams) == 1)
        c = SSE(dash.url)
        assert c.status == 200 and c.read_event()["event"] == "hello"
        b.close(), c.close()
    monkeypatch.setenv("SHOAL_DASHBOARD_MAX_STREAMS", "1")
    with Dashboard(journal=db, address=0) as dash:
        assert dash.app.state.broadcaster.max_streams == 1
    for bad in ("0", "many"):
        monkeypatch.setenv("SHOAL_DASHBOARD_MAX_STREAMS", bad)
        with pytest.raises(ValueError, match="SHOAL_DASHBOARD_MAX_STREAMS"):
            Dashboard(journal=db, address=0)


def _malform(db):
    con = sqlite3.connect(db)
    con.execute("UPDATE tasks SET started='abc' WHERE rowid=1")
    con.execute("UPDATE tasks SET finished=9e999 WHERE rowid=2")  # +Inf
    con.commit()
    con.close()


def test_a_malformed_journal_row_is_shown_not_a_500(tmp_path, capsys):
    # Before: /api/state answered 500 (Starlette refuses Infinity), /events sent "Infinity"
    # (JSON.parse throws: the page never updated) and shoal status --json printed Infinity.
    from shoal.cli import main

    db = _journal(tmp_path / "run.db")
    _malform(db)
    with Dashboard(journal=db, address=0) as dash:
        with urllib.request.urlopen(dash.url + "api/state", timeout=10) as resp:
            st = strict_json(resp.read())["journal"]
        stream = SSE(dash.url)
        stream.read_event()
        from_events = strict_json(stream.read_event()["data"])["journal"]
        stream.close()
    for j in (st, from_events):
        assert j["error"] is None and j["counts"]["done"] == 3
        (a, b) = j["malformed"]
        assert "started='abc' is not a time" in a and "finished=inf is not a time" in b
    assert main(["status", db, "--json"]) == 0
    out = strict_json(capsys.readouterr().out)
    assert out["updated"] is None or out["updated"] < 1e13
    assert len(out["malformed"]) == 2
    assert main(["status", db]) == 0
    assert "MALFORMED task 'p.s0.t0': started='abc'" in capsys.readouterr().out


def test_non_finite_numbers_go_out_as_null():
    from shoal._json import dumps

    text = dumps({"a": float("inf"), "b": [float("nan"), -float("inf"), 1.5], "c": "Infinity"})
    assert strict_json(text) == {"a": None, "b": [None, None, 1.5], "c": "Infinity"}


WORKFLOW = """
from shoal.ensemble import Pipeline, Stage, Task
WORKFLOW = [Pipeline([Stage([Task(executable="/bin/true")])])]
"""


@pytest.fixture(scope="module")
def one_task_journal(tmp_path_factory):
    return _journal(tmp_path_factory.mktemp("journal") / "run.db", n=1)


@pytest.mark.parametrize("how", ["taken", "out-of-range", "no-such-host", "not-ours",
                                 "run-taken", "run-not-a-number"])
def test_port_and_host_errors_are_one_line_and_status_2(tmp_path, how, one_task_journal):
    # Before: an 18-line traceback and exit status 1 from both commands.
    db = one_task_journal
    wf = tmp_path / "wf.py"
    wf.write_text(WORKFLOW)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    argv = {"taken": ["dashboard", db, "--port", str(taken)],
            "out-of-range": ["dashboard", db, "--port", "99999"],
            "no-such-host": ["dashboard", db, "--host", "no-such-host.invalid", "--port", "0"],
            "not-ours": ["dashboard", db, "--host", "198.18.255.254", "--port", "0"],
            "run-taken": ["run", str(wf), "--journal", str(tmp_path / "r.db"), "--dashboard", str(taken)],
            "run-not-a-number": ["run", str(wf), "--journal", str(tmp_path / "r.db"),
                                 "--dashboard", "127.0.0.1:http"]}[how]
    try:
        proc = subprocess.run([sys.executable, "-m", "shoal", *argv], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    finally:
        holder.close()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("shoal: error: dashboard"), proc.stderr
    assert "Traceback" not in proc.stderr
    if how.endswith("taken"):
        assert f"127.0.0.1:{taken}: Address already in use" in lines[0]
    if how.startswith("run"):
        assert not os.path.exists(tmp_path / "r.db")  # refused before the run started
