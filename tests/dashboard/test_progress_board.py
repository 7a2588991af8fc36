"""The progress board (shoal.publish) and the skeletons' ticker: validation, bounds, the
terminal line on a real pseudo-terminal and off elsewhere."""

from __future__ import annotations

import fcntl
import io
import math
import os
import select
import struct
import termios

import pytest

import shoal
from shoal.patterns import _progress
from shoal.runtime.progress import BOARD, Board


def test_publish_records_by_topic_with_time_and_sequence():
    b = Board(keep=3)
    for i in range(5):
        b.publish("train", {"epoch": i, "loss": 1.0 / (i + 1)})
    b.publish("stream", {"events_per_s": 10})
    recs = b.records("train")
    assert [r["epoch"] for r in recs] == [2, 3, 4]  # bounded: the newest 3
    assert all("t" in r and "seq" in r for r in recs)
    assert [r["seq"] for r in recs] == sorted(r["seq"] for r in recs)
    assert b.records("train", since=recs[1]["seq"]) == [recs[2]]
    assert set(b.snapshot()) == {"train", "stream"}
    assert b.snapshot(last=1)["train"] == [recs[-1]]


def test_public_publish_takes_a_mapping_or_keywords():
    shoal.publish("test-topic", {"a": 1}, b=2.5)
    shoal.publish("test-topic", c="x", d=None, e=True, f=math.inf)
    first, second = BOARD.records("test-topic")[-2:]
    assert first["a"] == 1 and first["b"] == 2.5
    assert second["c"] == "x" and second["d"] is None and second["e"] is True
    assert second["f"] is None  # JSON has no inf: an unknown value


@pytest.mark.parametrize("topic, record, culprit", [
    ("", {"a": 1}, "topic"),
    (3, {"a": 1}, "topic"),
    ("t", [1, 2], "mapping"),
    ("t", {"a": [1, 2]}, "'a'"),
    ("t", {"a": object()}, "'a'"),
    ("t", {1: 2}, "field names"),
])
def test_bad_records_are_refused_naming_the_culprit(topic, record, culprit):
    with pytest.raises(TypeError, match=culprit):
        shoal.publish(topic, record)


def test_numpy_scalars_become_plain_numbers():
    np = pytest.importorskip("numpy")
    b = Board()
    b.publish("n", {"x": np.int64(3), "y": np.float32(0.5)})
    rec = b.records("n")[0]
    assert type(rec["x"]) is int and type(rec["y"]) is float


def test_a_failing_subscriber_does_not_break_the_publisher():
    b = Board()
    seen = []
    b.subscribe(lambda topic, rec: 1 / 0)
    unsubscribe = b.subscribe(lambda topic, rec: seen.append((topic, rec["v"])))
    b.publish("t", {"v": 1})
    unsubscribe()
    b.publish("t", {"v": 2})
    assert seen == [("t", 1)]


def test_ticker_publishes_rates_and_a_final_record():
    now = [100.0]
    values = iter([{"nodes": 0}, {"nodes": 500}, {"nodes": 800}])
    b_before = len(BOARD.records("ticker-test"))
    t = _progress.Ticker("ticker-test", lambda: next(values), rates=("nodes",), interval=0.5,
                         clock=lambda: now[0])
    assert t.timeout() == pytest.approx(0.5)
    t.tick()  # not due yet: nothing sampled
    now[0] += 0.5
    t.tick()
    now[0] += 0.5
    t.tick()
    now[0] += 0.1
    t.close()
    recs = BOARD.records("ticker-test")[b_before:]
    assert [r["nodes"] for r in recs] == [0, 500, 800]
    assert recs[1]["nodes_per_s"] == pytest.approx(1000.0)
    assert recs[-1]["state"] == "done" and recs[0]["state"] == "running"


def _nodes_line(rec: dict) -> str:
    return _progress.progress_text("tty-test", rec["nodes"], "nodes", elapsed=rec["elapsed_s"])


def test_terminal_line_is_drawn_on_a_tty_and_not_elsewhere(monkeypatch):
    pytest.importorskip("tqdm")
    monkeypatch.setattr(_progress, "LINE_AFTER_S", 0.0)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal's size
    try:
        with os.fdopen(slave, "w", closefd=True) as tty:
            monkeypatch.setattr("sys.stderr", tty)
            t = _progress.Ticker("tty-test", lambda: {"nodes": 12345}, interval=0.0,
                                 text=_nodes_line)
            t.tick()
            tty.flush()
            out = ""
            while "nodes" not in out and select.select([master], [], [], 2)[0]:
                out += os.read(master, 65536).decode(errors="replace")
            t.close()
    finally:
        os.close(master)
    assert "tty-test: 12,345 nodes  elapsed 0:00" in out
    piped = io.StringIO()
    monkeypatch.setattr("sys.stderr", piped)
    t = _progress.Ticker("pipe-test", lambda: {"nodes": 1}, interval=0.0, text=_nodes_line)
    t.tick()
    t.close()
    assert piped.getvalue() == ""  # not a terminal: no line, no escape codes


def test_terminal_line_off_with_shoal_progress_0(monkeypatch):
    monkeypatch.setenv("SHOAL_PROGRESS", "0")
    assert not _progress._Line("x").enabled
