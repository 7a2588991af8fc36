"""``shoal report run.db --html OUT``: one self-contained page (nothing fetched, no script) with
the timeline per host, the slowest tasks, the failures with their stderr and the resource use;
every journal string escaped; the output written atomically and never through a link."""

from __future__ import annotations

import html.parser
import os
import socket
import sys

import pytest

from shoal.cli import main
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.patterns.ensemble import run_report

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>"


class _Page(html.parser.HTMLParser):
    """Tags and attributes of a page, and the text of each element with an id."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def _workflow():
    sleep = Task(executable=sys.executable, arguments=["-c", "import time; time.sleep(0.3)"], name="slow")
    quick = [Task(executable="/bin/true", name=f"q{i}") for i in range(3)]
    bad = Task(executable="/bin/sh", arguments=["-c", f"echo '{HOSTILE}' >&2; exit 4"], name="bad", retries=1)
    return Pipeline([Stage([sleep, *quick, bad], name="sim")], name="p")


@pytest.fixture(scope="module")
def journal(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("report") / "run.db")
    report = run(_workflow(), journal=db, cores=2)
    assert report.failed == 1 and report.done == 4
    return db


def test_the_page_holds_every_part_and_fetches_nothing(journal, tmp_path):
    out = str(tmp_path / "report.html")
    assert main(["report", journal, "--html", out]) == 0
    text = open(out, encoding="utf-8").read()
    page = _parse(text)
    tags = {t for t, _ in page.tags}
    assert "script" not in tags and "link" not in tags and "img" not in tags and "iframe" not in tags
    for _, attrs in page.tags:  # nothing loaded from anywhere: no src, no href, no url()
        assert "src" not in attrs and "href" not in attrs, attrs
    assert "url(" not in text and "@import" not in text
    ids = {a.get("id") for _, a in page.tags}
    assert {"timeline", "slowest", "failures", "per-stage", "per-host"} <= ids
    bars = [a for t, a in page.tags if t == "rect" and a.get("class") == "bar"]
    assert len(bars) == 6  # 4 done attempts and 2 failed ones of p.sim.bad
    groups = [a for t, a in page.tags if t == "g" and a.get("class") == "host"]
    assert len(groups) == 1 and socket.gethostname() in page.text
    body = "".join(page.text)
    assert HOSTILE in body  # the stderr tail, shown as text ...
    assert "<script>alert" not in text  # ... and never as markup
    slowest = text[text.index('id="slowest"'):text.index('id="failures"')]
    assert slowest.index("p.sim.slow") < slowest.index("p.sim.q0")  # the longest first


def test_a_run_still_going_and_an_empty_journal(tmp_path):
    db = str(tmp_path / "run.db")
    from shoal.patterns.ensemble.journal import Journal

    j = Journal(db)
    j.running("p.s.t", "p", "p.s", "executable", 1, None, 100.0)
    j.running("p.s.drained", "p", "p.s", "executable", 1, None, 100.0)
    j.unstart("p.s.drained")  # stopped by a walltime: PENDING again, nothing runs it
    j.commit()
    text = run_report.render(db, now=160.0)  # the driver holds the journal: read while it writes
    j.close()
    bars = [a for t, a in _parse(text).tags if t == "rect" and a.get("class") == "bar"]
    assert len(bars) == 1  # the running attempt, drawn up to now; not the drained one
    empty = str(tmp_path / "empty.db")
    Journal(empty).close()
    assert "No attempt has started yet" in run_report.render(empty)


def test_the_timeline_is_bounded(tmp_path, monkeypatch):
    db = str(tmp_path / "run.db")
    from shoal.patterns.ensemble.journal import Journal

    j = Journal(db)
    rows = [(f"p.s.t{i}", "p", "p.s", "executable", 1, None, 1000.0 + i * 0.01, None) for i in range(300)]
    j.running_many(rows)
    for i in range(300):
        j.done(f"p.s.t{i}", 1000.0 + i * 0.01 + (i % 7) * 0.1, exit_code=0)
    j.close()
    monkeypatch.setattr(run_report, "MAX_BARS", 50)
    monkeypatch.setattr(run_report, "MAX_LANES", 4)
    page = _parse(run_report.render(db))
    assert len([a for t, a in page.tags if t == "rect" and a.get("class") == "bar"]) == 50
    assert "250 shorter attempts are not drawn" in "".join(page.text)
    ys = {a["y"] for t, a in page.tags if t == "rect" and a.get("class") == "bar"}
    assert len(ys) <= 4  # lanes capped


def test_output_path_safety(journal, tmp_path, capsys):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    link = tmp_path / "link.html"
    os.symlink(target, link)
    assert main(["report", journal, "--html", str(link)]) == 2
    assert "symbolic link" in capsys.readouterr().err and target.read_text() == "keep me"
    assert main(["report", journal, "--html", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["report", journal, "--html", str(fifo)]) == 2  # refused, not blocked on
    assert "not a regular file" in capsys.readouterr().err
    out = tmp_path / "r.html"
    out.write_text("old")
    assert main(["report", journal, "--html", str(out)]) == 0
    assert out.read_text().startswith("<!doctype html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.txt", "fifo", "link.html", "r.html"]
    assert main(["report", str(tmp_path / "none.db"), "--html", str(out)]) == 2
    assert "no journal at" in capsys.readouterr().err


def test_a_damaged_state_is_one_line_naming_the_journal(journal, tmp_path, capsys):
    import contextlib
    import shutil
    import sqlite3

    db = str(tmp_path / "bad.db")
    shutil.copy(journal, db)
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.execute("UPDATE tasks SET state='bogus' WHERE uid='p.sim.slow'")
        c.commit()
    for argv in (["status", db, "--tasks"], ["report", db, "--html", str(tmp_path / "r.html")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "bogus" in err and len(err.strip().splitlines()) == 1, err
    from shoal.dashboard.journal import journal_state

    assert journal_state(db)["error"]  # the dashboard says so instead of raising
