"""The dashboard's graph page over a real server: /graph is listed beside /journal, and
/api/graph.svg is Graphviz's picture of the journal, drawn again when a state changes
(503 and one line when Graphviz is missing)."""

from __future__ import annotations

import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

import pytest
from dash_tasks import nap

from shoal.dashboard import Dashboard
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.patterns.ensemble.graph import graphviz_available

SVG = "{http://www.w3.org/2000/svg}"


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


@pytest.mark.skipif(not graphviz_available(), reason="Graphviz's dot is not installed: apt-get install "
                    "graphviz (scripts/install-graphviz as root; .ci/run does it)")
def test_the_graph_page_draws_the_journal_and_follows_its_states(tmp_path):
    db = str(tmp_path / "run.db")
    run([Pipeline([Stage([Task(function=nap, args=(0, i)) for i in range(3)], name="sim")], name="p")],
        journal=db, workers=1)
    with Dashboard(journal=db, address=0) as dash:
        status, body, _ = _get(dash.url + "graph")
        assert status == 200 and b'href="/graph"' in body and b"/api/graph.svg" in body
        status, svg, kind = _get(dash.url + "api/graph.svg")
        assert status == 200 and kind.startswith("image/svg+xml")
        texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
        assert {"t0", "t1", "t2", "stage sim"} <= set(texts)
        assert b"#2e7d32" in svg  # done
        run([Pipeline([Stage([Task(function=nap, args=(0, i)) for i in range(3)] +
                             [Task(executable="/bin/false")], name="sim")], name="p")],
            journal=db, workers=1, new=True)
        dash_state = _get(dash.url + "api/state")  # the journal source reads the file again
        assert dash_state[0] == 200
        status, svg2, _ = _get(dash.url + "api/graph.svg")
        assert status == 200 and b"#c62828" in svg2 and svg2 != svg  # the failed task, drawn


def test_without_graphviz_the_picture_is_one_line_saying_how_to_install_it(tmp_path, monkeypatch):
    db = str(tmp_path / "run.db")
    run([Pipeline([Stage([Task(function=nap, args=(0, 1))])])], journal=db, workers=1)
    monkeypatch.setenv("PATH", str(tmp_path))
    with Dashboard(journal=db, address=0) as dash:
        status, body, _ = _get(dash.url + "api/graph.svg")
    assert status == 503 and b"apt-get install graphviz" in body and body.count(b"\n") == 0
