"""The dashboard's pages in a real headless Chromium while real work runs (-m browser).

What is asserted is the rendered DOM (after the page's script drew the streamed state):
every worker's pid, a task count that grows, a killed worker's row showing its replacement,
the page saying the pilot closed, a search's progress, an ensemble journal's counts,
failures and stderr tails, and a clear error for a bad journal path.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time

import pytest
from chromium import browser, page, screenshot  # noqa: F401  (fixtures)
from dash_tasks import in_background, is_solution, nap, slow_queens_children

import shoal
from shoal.dashboard import Dashboard
from shoal.dashboard.workers import WorkerState
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.patterns import backtracking
from shoal.workloads import fib

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

TASKS_JS = """() => [...document.querySelectorAll('tr.worker td.tasks')]
                   .reduce((a, td) => a + Number(td.textContent.replace(/,/g, '')), 0)"""


def _pids(page) -> set[int]:
    return {int(t) for t in page.locator("tr.worker td.pid").all_inner_texts()}


def test_workers_page_shows_every_pid_and_a_growing_task_count(page):
    with shoal.Pilot(2, dashboard=0) as pilot:
        futs = [pilot.submit(nap, 0.02, i) for i in range(600)]
        pids = {w["pid"] for w in pilot.stats()["workers"]}
        page.goto(pilot.dashboard_url)  # / redirects to /workers
        page.wait_for_function("n => document.querySelectorAll('tr.worker').length === n", arg=2)
        page.wait_for_function(f"() => ({TASKS_JS})() > 0")
        assert _pids(page) == pids
        first = page.evaluate(TASKS_JS)
        assert first > 0
        page.wait_for_function(f"n => ({TASKS_JS})() > n", arg=first)
        assert page.locator("#status").inner_text().startswith("live")
        states = set(page.locator("tr.worker td.state").all_inner_texts())
        assert states <= {s.value for s in WorkerState}
        assert page.locator("tr.worker svg.timeline").count() == 2
        for f in futs:
            f.cancel()
        if os.environ.get("SHOAL_SCREENSHOTS"):  # the docs' picture: a minute with steals in it
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                fib.fib_parallel(pilot, 28, cutoff=16)
            page.wait_for_timeout(1500)
            screenshot(page, "dashboard-workers.png")


def test_page_survives_a_worker_kill_and_says_when_the_pilot_closed(page):
    pilot = shoal.Pilot(2, dashboard=0)
    try:
        futs = [pilot.submit(nap, 0.05, i) for i in range(200)]
        victim = pilot.stats()["workers"][0]
        page.goto(pilot.dashboard_url + "workers")
        page.wait_for_function("pid => [...document.querySelectorAll('tr.worker td.pid')]"
                               ".some(td => td.textContent === String(pid))", arg=victim["pid"])
        os.kill(victim["pid"], signal.SIGKILL)
        row = f"tr.worker[data-worker='{victim['worker']}']"
        page.wait_for_function(
            "([sel, pid]) => { const r = document.querySelector(sel); return r && "
            "r.dataset.pid !== String(pid) && r.querySelector('.replaced-info').textContent"
            ".includes('replaced') }", arg=[row, victim["pid"]])
        assert str(victim["pid"]) in page.locator(f"{row} .replaced-info").inner_text()
        assert int(page.locator(f"{row} td.pid").inner_text()) != victim["pid"]
        screenshot(page, "dashboard-replaced.png")
        for f in futs:
            f.cancel()
    finally:
        pilot.close(cancel_pending=True)
    page.wait_for_function("() => document.getElementById('status').textContent.includes('pilot closed')")
    assert page.locator("tr.worker").count() == 2  # the final numbers stay on the page


def test_progress_page_shows_a_running_search_and_published_records(page):
    with shoal.Pilot(2, dashboard=0) as pilot:
        for epoch in range(5):  # what a training loop publishes (the generic hook)
            shoal.publish("train", epoch=epoch, loss=round(1.0 / (epoch + 1), 3), accuracy=0.5 + epoch / 10)
        result = {}
        search = threading.Thread(target=lambda: result.update(n=backtracking.count(
            pilot, (), functools.partial(slow_queens_children, 11), accept=functools.partial(is_solution, 11))))
        search.start()
        try:
            page.goto(pilot.dashboard_url + "progress")
            cell = "section.topic[data-topic='search'] td[data-field='nodes']"
            page.wait_for_selector(cell)
            first = int(page.locator(cell).inner_text().replace(",", ""))
            page.wait_for_function(
                "([sel, n]) => Number(document.querySelector(sel).textContent.replace(/,/g, '')) > n",
                arg=[cell, first])
            assert page.locator("section.topic[data-topic='train'] figure[data-field='loss'] path").count() == 1
            screenshot(page, "dashboard-progress.png")
        finally:
            search.join(120)
        assert result["n"] == 2680  # OEIS A000170
        page.wait_for_function("() => document.querySelector(\"section.topic[data-topic='search'] h2\")"
                               ".textContent.includes('done')")


HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'  # a stderr tail is text, not HTML


def _workflow(n_ok: int, seconds: float):
    ok = [Stage([Task(function=nap, args=(seconds, i), name=f"t{i}") for i in range(n_ok)], name="simulate"),
          Stage([Task(function=nap, args=(seconds, 0), name="summary")], name="analyse")]
    bad = Stage([Task(executable="/bin/sh", name="bad",
                      arguments=["-c", "echo 'step 3: disk quota exceeded' >&2; echo \"$0\" >&2; exit 7",
                                 HOSTILE])], name="ingest")
    return [Pipeline(ok, name="members"), Pipeline([bad], name="broken")]


def test_journal_page_while_a_run_writes_it_and_after(page, tmp_path):
    db = str(tmp_path / "run.db")
    with Dashboard(journal=db, address=0) as dash, \
            in_background(run, _workflow(24, 0.25), journal=db, workers=2) as done:
        page.goto(dash.url + "journal")
        page.wait_for_selector("#journal-summary .count-done")
        done_js = "() => Number(document.querySelector('#journal-summary .count-done').textContent)"
        page.wait_for_function(f"() => ({done_js})() >= 1")
        first = page.evaluate(done_js)
        page.wait_for_function(f"n => ({done_js})() > n", arg=first)
        screenshot(page, "dashboard-journal-running.png")
        assert done.wait(120)
        page.wait_for_function("() => document.getElementById('eta').textContent === 'done'")
        assert page.evaluate(done_js) == 25
        assert page.locator("#pipelines tr[data-name='members'] td.done").inner_text() == "25"
        assert page.locator("#stages tr[data-name='members.simulate'] td.done").inner_text() == "24"
        failure = page.locator("#failures details.failure")
        assert failure.count() == 1 and "broken." in failure.get_attribute("data-uid")
        tail = page.locator("#failures pre.stderr").inner_text()
        assert "disk quota exceeded" in tail and HOSTILE in tail
        assert page.evaluate("() => document.body.dataset.pwned") is None
        hosts = set(page.locator("#recent td.host").all_inner_texts())  # what the attempts used
        assert hosts == {socket.gethostname()} and page.locator("#recent td.rss").count() >= 1
        screenshot(page, "dashboard-journal.png")


def test_journal_page_over_a_bad_path_says_what_is_wrong(page, tmp_path):
    missing = str(tmp_path / "nope.db")
    with Dashboard(journal=missing, address=0) as dash:
        page.goto(dash.url + "journal")
        page.wait_for_selector("#journal-error")
        assert f"no journal at {missing}" in page.locator("#journal-error").inner_text()
        assert "error" in page.locator("#status").get_attribute("class")


def test_a_malformed_journal_row_is_shown_on_the_page_over_a_gzip_stream(page, tmp_path):
    # Before: /events sent "Infinity" for finished=+Inf: JSON.parse threw, the page stayed
    # empty. Now the page shows the counts and a box naming the malformed cells; the stream
    # it reads is the shared gzip one (Chromium asks for gzip).
    import sqlite3

    db = str(tmp_path / "run.db")
    run([Pipeline([Stage([Task(function=nap, args=(0, i), name=f"t{i}") for i in range(3)])],
                  name="p")], journal=db, workers=1)
    con = sqlite3.connect(db)
    con.execute("UPDATE tasks SET started='abc' WHERE rowid=1")
    con.execute("UPDATE tasks SET finished=9e999 WHERE rowid=2")
    con.commit()
    con.close()
    with Dashboard(journal=db, address=0) as dash:
        page.goto(dash.url + "journal")
        page.wait_for_selector("#journal-malformed")
        text = page.locator("#journal-malformed").inner_text()
        assert "started='abc' is not a time" in text and "finished=inf is not a time" in text
        assert page.locator("#journal-summary .count-done").inner_text() == "3"
        assert [s.gzip for s in dash.app.state.broadcaster.streams] == [True]


def test_a_page_past_the_stream_cap_says_so_and_polls(browser, tmp_path):
    db = str(tmp_path / "run.db")
    run([Pipeline([Stage([Task(function=nap, args=(0, 1), name="t")])], name="p")], journal=db,
        workers=1)
    with Dashboard(journal=db, address=0, max_streams=1) as dash:
        first, second = browser.new_page(), browser.new_page()
        first.goto(dash.url + "journal")
        first.wait_for_function("() => document.querySelector('#status').textContent.startsWith('live')")
        second.goto(dash.url + "journal")
        second.wait_for_function(
            "() => document.querySelector('#status').textContent.includes('too many live pages')")
        assert second.locator("#journal-summary .count-done").inner_text() == "1"  # from /api/state
        first.close(), second.close()


def test_graph_page_shows_graphvizs_picture_of_the_journal(page, tmp_path):
    from shoal.patterns.ensemble.graph import graphviz_available

    if not graphviz_available():
        pytest.skip("Graphviz's dot is not installed: apt-get install graphviz (scripts/install-graphviz)")
    db = str(tmp_path / "run.db")
    run(_workflow(3, 0), journal=db, workers=1)
    with Dashboard(journal=db, address=0) as dash:
        page.goto(dash.url + "graph")
        page.wait_for_function("() => { const i = document.getElementById('graph'); "
                               "return i && i.complete && i.naturalWidth > 0; }")
        assert page.locator("nav a.on").inner_text() == "graph"
        assert page.locator(".legend .swatch").count() == 6
        screenshot(page, "dashboard-graph.png")
