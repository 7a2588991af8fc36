"""The journal page's state from real ensemble journals (a finished run, a run in progress,
failures with stderr tails), clear errors for bad journal paths, and the static trace report
from a real pilot's trace."""

from __future__ import annotations

import html
import html.parser
import os
import sqlite3

import pytest
from dash_tasks import get_state, in_background, nap, wait_for

import shoal
from shoal.cli import main
from shoal.dashboard import Dashboard
from shoal.dashboard.journal import journal_state
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.workloads import fib


def _workflow(n_ok: int, seconds: float = 0.0):
    ok = Stage([Task(function=nap, args=(seconds, i), name=f"ok{i}") for i in range(n_ok)])
    bad = Stage([Task(executable="/bin/sh", arguments=["-c", "echo 'disk quota exceeded' >&2; exit 7"],
                      name="bad")])
    return [Pipeline([ok], name="good"), Pipeline([bad], name="broken")]


def test_finished_journal_counts_pipelines_stages_and_failures(tmp_path):
    db = str(tmp_path / "run.db")
    report = run(_workflow(6), journal=db, workers=2)
    assert report.done == 6 and report.failed == 1
    st = journal_state(db)
    assert st["error"] is None and st["finished"] and st["eta_s"] == 0.0
    assert st["counts"]["done"] == 6 and st["counts"]["failed"] == 1 and st["settled"] == 7
    assert st["pipelines"]["good"]["done"] == 6 and st["pipelines"]["broken"]["failed"] == 1
    assert sum(c["done"] for c in st["stages"].values()) == 6
    (fail,) = st["failures"]
    assert fail["uid"].startswith("broken.") and fail["exit_code"] == 7
    assert "disk quota exceeded" in fail["stderr_tail"]


def test_journal_page_state_while_a_run_writes_it(tmp_path):
    db = str(tmp_path / "run.db")
    with Dashboard(journal=db, address=0) as dash, \
            in_background(run, _workflow(12, 0.3), journal=db, workers=2) as done:
        first = wait_for(lambda: (s := get_state(dash.url)["journal"]) and not s["error"]
                         and s["counts"]["done"] >= 1 and s)
        assert not first["finished"]
        wait_for(lambda: get_state(dash.url)["journal"]["counts"]["done"] > first["counts"]["done"])
        done.wait(60)
        last = wait_for(lambda: (s := get_state(dash.url)["journal"])["finished"] and s)
        assert last["counts"]["done"] == 12 and last["counts"]["failed"] == 1


@pytest.mark.parametrize("kind", ["missing", "directory", "not-sqlite", "other-sqlite"])
def test_bad_journal_paths_are_clear_errors(tmp_path, kind, capsys):
    path = tmp_path / "run.db"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-sqlite":
        path.write_text("hello")
    elif kind == "other-sqlite":
        sqlite3.connect(path).execute("CREATE TABLE x (y)").connection.close()
    st = journal_state(str(path))
    assert str(path) in st["error"]
    assert main(["dashboard", str(path), "--port", "0"]) == 2  # refused before serving
    err = capsys.readouterr().err
    assert err.startswith("shoal: error: ") and str(path) in err
    with Dashboard(journal=str(path), address=0) as dash:  # a page over it says so too
        assert str(path) in get_state(dash.url)["journal"]["error"]


class _Tables(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.scripts, self.links = [], 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "script":
            self.scripts += 1
        if tag in ("link", "img") or (tag == "script" and "src" in a):
            self.links.append(tag)


def test_trace_report_is_self_contained(tmp_path, capsys):
    trace = str(tmp_path / "run.json")
    with shoal.Pilot(2, trace=trace) as pilot:
        assert fib.fib_parallel(pilot, 20, cutoff=10) == 6765
    out = str(tmp_path / "report.html")
    assert main(["trace", trace, "--html", out]) == 0
    text = open(out).read()
    p = _Tables()
    p.feed(text)
    assert {"utilisation", "tasks"} <= set(p.ids)
    assert p.scripts == 0 and p.links == []  # nothing to fetch: opens anywhere
    assert "_fib_task" in text and "worker 1" in text and "worker 2" in text
    assert main(["trace", trace]) == 0
    summary = capsys.readouterr().out
    utils = [float(line.split()[4]) for line in summary.splitlines() if line.startswith("worker ") and "util" not in line]
    assert len(utils) == 2 and all(0 <= u <= 100.0 for u in utils)  # nested spans count once


def test_trace_errors_name_the_file(tmp_path, capsys):
    assert main(["trace", str(tmp_path / "nope.json")]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["trace", str(bad), "--html", str(tmp_path / "o.html")]) == 2
    err = capsys.readouterr().err
    assert "nope.json" in err and "bad.json" in err


WORKFLOW = """
import time
from shoal.ensemble import Pipeline, Stage, Task

def nap(i):
    time.sleep(0.2)
    return i

workflow = Pipeline([Stage([Task(function=nap, args=(i,)) for i in range(20)])], name="p")
"""


def test_shoal_run_dashboard_serves_the_runs_journal_and_progress(tmp_path):
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    wf = tmp_path / "wf.py"
    wf.write_text(WORKFLOW)
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "run", str(wf), "--journal",
                             str(tmp_path / "run.db"), "--workers", "2", "--dashboard"],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+/)journal", line).group(1)
        st = wait_for(lambda: (s := get_state(url)) and s["journal"].get("counts", {}).get("done", 0) >= 1
                      and s["journal"]["progress"].get("ensemble") and s)
        assert st["pages"] == ["journal", "graph", "progress"]
        assert st["journal"]["total"] == 20  # from the run's own progress: an ETA is possible
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "20 done" in out


def test_journal_of_a_killed_driver_says_dead_not_running(tmp_path):
    import signal
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    wf = tmp_path / "wf.py"
    wf.write_text(WORKFLOW.replace("time.sleep(0.2)", "time.sleep(1.0)"))
    db = str(tmp_path / "run.db")
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "run", str(wf), "--journal", db,
                             "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=root), start_new_session=True)
    try:
        wait_for(lambda: os.path.exists(db) and not journal_state(db)["error"]
                 and journal_state(db)["counts"]["done"] >= 2, timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    st = journal_state(db)
    assert st["driver"] == "dead" and not st["finished"]
    assert st["interrupted"] >= 1 and st["total"] == 20
    assert st["counts"]["done"] >= 2 and st["eta_s"] is None  # no ETA for a run nobody drives
    # nothing runs the rows the dead driver left RUNNING: their own column, as in shoal status
    # (they were counted as "running" here while shoal status said running 0, interrupted N)
    assert st["counts"]["running"] == 0 and st["counts"]["interrupted"] == st["interrupted"]
    assert st["stages"]["p.s0"]["running"] == 0 and st["stages"]["p.s0"]["interrupted"] == st["interrupted"]
    assert st["labels"] == {"p.s0": "interrupted"}


def test_trace_report_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    """``shoal trace --html out`` opened ``out`` with a plain ``open(..., "w")``: a link
    planted there (a shared output folder) overwrote the file it points to."""
    trace = str(tmp_path / "run.json")
    with shoal.Pilot(1, trace=trace) as pilot:
        assert pilot.submit(abs, -3).result(30) == 3
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "report.html"
    os.symlink(victim, out)
    assert main(["trace", trace, "--html", str(out)]) == 0
    assert victim.read_text() == "keep me"
    assert not out.is_symlink() and "<h1>" in out.read_text()


def test_a_page_fetched_without_a_browser_shows_the_numbers(tmp_path):
    """A page is drawn by its script; fetched with plain HTTP (curl, a text browser) it said
    only "waiting for the first sample…".  Now the server writes the sample /api/state has
    into the page: the stage table with its states, the failure lines, and where the JSON is."""
    import urllib.request

    from shoal.ensemble import RunStatus

    db = str(tmp_path / "run.db")
    hostile = Stage([Task(executable="/bin/sh", arguments=["-c", "exit 7"], name="bad")], name="first")
    after = Stage([Task(executable="/bin/true", name="never")], name="second")
    report = run([Pipeline([hostile, after], name="broken"), *_workflow(2)[:1]], journal=db, workers=2)
    assert report.failed == 1
    with Dashboard(journal=db, address=0) as dash:
        with urllib.request.urlopen(dash.url + "journal", timeout=10) as r:
            page = r.read().decode()
    assert "waiting for the first sample" not in page
    plain = html.unescape(page.split('<pre id="plain">', 1)[1].split("</pre>", 1)[0])
    lines = plain.splitlines()
    assert lines[0].startswith(f"journal {db}: finished (driver ended), ") and "1 failed" in lines[0]
    rows = {ln.split()[0]: ln for ln in lines[2:] if not ln.startswith("FAILED")}
    assert "not started (pipeline failed at broken.first)" in rows["broken.second"]
    assert rows["good.s0"].split()[1] == "done"
    status = RunStatus.load(db)
    assert [ln for ln in lines if ln.startswith("FAILED")] == [
        ln for ln in status.failure_lines() if ln.startswith("FAILED")] == ["FAILED broken.first.bad: exit code 7"]
    assert '<a href="/api/state">/api/state</a>' in page


def test_the_workers_page_fetched_without_a_browser_lists_the_workers():
    import urllib.request

    with shoal.Pilot(2, dashboard=0) as pilot:
        assert pilot.submit(abs, -3).result(30) == 3
        pids = {w["pid"] for w in pilot.stats()["workers"]}
        with urllib.request.urlopen(pilot.dashboard_url + "workers", timeout=10) as r:
            page = r.read().decode()
    plain = html.unescape(page.split('<pre id="plain">', 1)[1].split("</pre>", 1)[0])
    assert plain.splitlines()[0].startswith("backend local, 2 workers")
    assert {int(ln.split()[1]) for ln in plain.splitlines()[2:]} == pids


def test_text_in_a_served_page_is_escaped(tmp_path):
    """A failure reason is the task's own text (a trust boundary): served as text, not markup."""
    import urllib.request

    db = str(tmp_path / "run.db")
    evil = '<img src=x onerror="alert(1)">{{nav}}'
    run(Pipeline([Stage([Task(function=_raise, args=(evil,), name="t")], name="s")], name="p"),
        journal=db, workers=1)
    with Dashboard(journal=db, address=0) as dash:
        with urllib.request.urlopen(dash.url + "journal", timeout=10) as r:
            page = r.read().decode()
    assert "<img" not in page and html.escape(evil) in page


def _raise(text):
    raise ValueError(text)
