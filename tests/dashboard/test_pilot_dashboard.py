"""shoal.Pilot(dashboard=...) over plain HTTP with real worker processes: the state names every
worker's pid, counts grow, a killed worker's row shows its replacement, the event stream says
when the pilot closes, nothing listens beyond 127.0.0.1, the port is free after close."""

from __future__ import annotations

import functools
import http.client
import os
import signal
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request

import psutil
import pytest
from dash_tasks import (
    bits_children,
    bits_distance,
    get_state,
    is_solution,
    my_pid,
    nap,
    queens_children,
    wait_for,
    zero,
)

import shoal
from shoal.patterns import all_pairs, backtracking, branch_and_bound
from shoal.runtime.progress import BOARD


def _worker_pids(pilot) -> set[int]:
    return {w["pid"] for w in pilot.stats()["workers"]}


def _listening(port: int) -> list[str]:
    return [c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def test_state_names_every_worker_and_counts_grow():
    with shoal.Pilot(2, dashboard=0) as pilot:
        url = pilot.dashboard_url
        host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
        assert host == "127.0.0.1" and port > 0
        assert _listening(port) == ["127.0.0.1"]  # loopback only, by default
        futs = [pilot.submit(nap, 0.02, i) for i in range(150)]
        pids = _worker_pids(pilot)
        first = wait_for(lambda: (s := get_state(url)["pilot"]) and
                         {r["pid"] for r in s["workers"]} == pids and s["totals"]["tasks"] > 0 and s)
        assert {r["cpu"] for r in first["workers"]} == {0, 1}
        assert all(r["node"] == 0 for r in first["workers"])
        wait_for(lambda: get_state(url)["pilot"]["totals"]["tasks"] > first["totals"]["tasks"])
        assert [f.result() for f in futs] == list(range(150))
        with urllib.request.urlopen(url + "workers", timeout=10) as r:
            assert r.status == 200 and b"dashboard.js" in r.read()
        with urllib.request.urlopen(url + "static/dashboard.js", timeout=10) as r:
            assert b"EventSource" in r.read()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "api/state", timeout=5)
    assert _listening(port) == []
    with shoal.Pilot(1, dashboard=port) as again:  # the same port is free for the next pilot
        assert again.dashboard_url == url


def test_a_killed_worker_is_shown_replaced():
    with shoal.Pilot(2, dashboard=0) as pilot:
        url = pilot.dashboard_url
        victim = pilot.stats()["workers"][0]
        wait_for(lambda: victim["pid"] in {r["pid"] for r in get_state(url)["pilot"]["workers"]})
        os.kill(victim["pid"], signal.SIGKILL)
        row = wait_for(lambda: [r for r in get_state(url)["pilot"]["workers"]
                                if r["worker"] == victim["worker"] and r["replaced"]])
        assert row[0]["pid"] != victim["pid"] and row[0]["previous_pids"] == [victim["pid"]]
        assert pilot.submit(my_pid).result() in _worker_pids(pilot)  # the pilot goes on


def _refuses_work(pilot) -> bool:
    try:
        pilot.submit(int)
    except shoal.PilotClosed:
        return True
    return False


def test_rows_stay_while_the_pilot_drains_its_work_at_close():
    pilot = shoal.Pilot(2, dashboard=0)
    url = pilot.dashboard_url
    futs = [pilot.submit(nap, 2.5, i) for i in range(2)]
    wait_for(lambda: len(get_state(url)["pilot"]["workers"]) == 2)
    closer = threading.Thread(target=pilot.close)  # waits for the two tasks
    closer.start()
    try:
        wait_for(lambda: _refuses_work(pilot))  # closing (the public sign: submit raises)
        seq = get_state(url)["pilot"]["seq"]
        threading.Event().wait(1.5)  # the sampler runs at least once while closing
        state = get_state(url)["pilot"]
        assert len(state["workers"]) == 2 and not state["closed"]
        assert state["seq"] == seq  # nothing newer than the last real sample
    finally:
        closer.join(30)
    assert [f.result() for f in futs] == [0, 1]


def test_the_event_stream_says_the_pilot_closed_and_ends():
    pilot = shoal.Pilot(1, dashboard=0)
    parts = urllib.parse.urlsplit(pilot.dashboard_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    conn.request("GET", "/events")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    lines: list[str] = []

    def read():
        for raw in resp:
            lines.append(raw.decode())

    reader = threading.Thread(target=read)
    reader.start()
    wait_for(lambda: any(x.startswith("data: ") for x in lines))
    pilot.close()
    reader.join(20)
    conn.close()
    assert not reader.is_alive()
    data = [x for x in lines if x.startswith("data: {\"")]
    assert '"closed":true' in data[-1] and '"closed":true' not in data[0]
    assert lines[-3:] == ["event: end\n", "data: {}\n", "\n"]


def test_hostile_paths_are_refused():
    with shoal.Pilot(1, dashboard=0) as pilot:
        parts = urllib.parse.urlsplit(pilot.dashboard_url)
        for path, status in [("/static/../../../../etc/passwd", 404), ("/static/%2e%2e/app.py", 404),
                             ("/nope", 404), ("/journal", 404)]:  # no journal on a pilot's server
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            assert resp.status == status, path
            assert b"root:" not in body and b"make_app" not in body
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("POST", "/api/state", body=b"x")
        assert conn.getresponse().status == 405
        conn.close()


def test_host_and_port_options_and_bad_values():
    with shoal.Pilot(1, dashboard="0.0.0.0:0") as pilot:  # told otherwise: every interface
        port = urllib.parse.urlsplit(pilot.dashboard_url).port
        assert _listening(port) == ["0.0.0.0"]
    for bad, err in [(True, TypeError), ("localhost:x", ValueError), (70000, ValueError),
                     (1.5, TypeError)]:
        with pytest.raises(err, match="dashboard"):
            shoal.Pilot(1, dashboard=bad)


def test_a_port_in_use_is_a_clear_error_and_leaves_no_workers():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            shoal.Pilot(1, dashboard=port)


def test_search_progress_reaches_the_page_and_its_final_node_count_is_exact():
    """nodes/s comes from Control's NODES column; at the end it equals the search's own count."""
    with shoal.Pilot(2, dashboard=0) as pilot:
        got = backtracking.count(pilot, (), functools.partial(queens_children, 8),
                                 accept=functools.partial(is_solution, 8), stats=True)
        assert got == 92  # OEIS A000170
        last = BOARD.records("search")[-1]
        assert last["state"] == "done" and last["nodes"] == got.stats.nodes
        assert last["goal"] == "count" and last["frontier"] == 0
        page = wait_for(lambda: [r for r in get_state(pilot.dashboard_url)["pilot"]["progress"]
                                 .get("search", []) if r["seq"] == last["seq"]])
        assert page[0]["nodes"] == got.stats.nodes


def test_minimise_publishes_the_incumbent_in_the_users_sign_and_work_inflation():
    with shoal.Pilot(2) as pilot:
        res = branch_and_bound.minimise(pilot, (), functools.partial(bits_children, 9),
                                        functools.partial(bits_distance, 300, 9), zero,
                                        reference_nodes=500, stats=True)
    assert res.value == 0 and res.path is not None  # 300 is reachable with 9 bits
    last = BOARD.records("search")[-1]
    assert last["goal"] == "optimise" and last["incumbent"] == 0
    assert last["nodes"] == res.stats.nodes
    assert last["work_inflation"] == pytest.approx(res.stats.work_inflation, abs=1e-4)


def test_all_pairs_progress_counts_tiles_and_cache_hits():
    np = pytest.importorskip("numpy")
    items = [np.arange(i, i + 4, dtype=float) for i in range(40)]
    with shoal.Pilot(2) as pilot:
        res = all_pairs.compute(pilot, items, _dist, tile=4)
    last = BOARD.records("all_pairs")[-1]
    assert last["state"] == "done" and last["tiles"] == res.stats.tiles
    assert last["pairs"] == last["pairs_total"] == 40 * 41 // 2 and last["percent_done"] == 100.0
    assert last["cache_hits"] == res.stats.cache_hits


def _dist(a, b):
    return float(((a - b) ** 2).sum())
