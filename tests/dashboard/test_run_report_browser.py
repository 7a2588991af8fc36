"""``shoal report``'s HTML page in a real headless Chromium (-m browser): it renders from the
file alone (no request leaves the page), the timeline's bars and the failure's stderr are
there as the browser laid them out, and a hostile stderr line stays text."""

from __future__ import annotations

import pytest
from chromium import browser, page  # noqa: F401  (fixtures)

from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.patterns.ensemble import run_report

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

HOSTILE = "<img src=x onerror=window.hacked=1>"


def test_the_run_report_renders_offline_with_its_timeline_and_failures(page, tmp_path):
    db = str(tmp_path / "run.db")
    wf = Pipeline([Stage([Task(executable="/bin/sh", arguments=["-c", "sleep 0.2"], name=f"t{i}") for i in range(3)]
                         + [Task(executable="/bin/sh", arguments=["-c", f"echo '{HOSTILE}' >&2; exit 2"],
                                 name="bad")], name="sim")], name="p")
    assert run(wf, journal=db, cores=2).failed == 1
    out = str(tmp_path / "report.html")
    run_report.write(db, out)
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto("file://" + out)
    assert requests == ["file://" + out]  # nothing else fetched
    assert page.locator("#timeline rect.bar").count() == 4
    box = page.locator("#timeline").bounding_box()
    assert box["width"] > 500 and box["height"] > 0  # laid out, not collapsed
    stderr = page.locator("#failures pre").inner_text()
    assert HOSTILE in stderr  # shown as text
    assert page.evaluate("() => window.hacked") is None  # never run as markup
    assert page.locator("#per-host tr").count() == 2  # a header and this host
    assert "p.sim.bad" in page.locator("#failures").inner_text()
