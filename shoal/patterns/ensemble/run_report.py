"""``shoal report run.db --html report.html``: one self-contained HTML page of what a run did.

Like Nextflow's ``-with-report``: a timeline of the attempts per host, the slowest tasks, the
failures with their stderr tails, and the resource use per stage and per host (CPU time, peak
RSS, bytes read and written: usage.py), all read from the journal (attempts.py, status.py)
while or after the run writes it.

One file, nothing fetched: inline CSS and an inline SVG drawn here (rectangles on a time
axis; no script, no layout library: bars on lanes need none).  Every string from the journal
(uids, hosts, reasons, stderr) is a task's or a journal author's text: it goes through
``printable`` (control characters shown, not obeyed) and ``html.escape`` before it is
placed.  The timeline is bounded: at most ``MAX_BARS`` attempts are drawn (the longest; the
page says how many were left out) on at most ``MAX_LANES`` lanes per host, so a
million-task journal gives a page of the same size as a thousand-task one.  The file is
written atomically; a folder, FIFO or symbolic link at the output path is refused
(``_durable.check_target``).

Rejected alternatives: a JavaScript charting library (a download, or a copy to vendor, for
bars on a time axis); the dashboard's live page saved to a file (it needs its server).
"""

from __future__ import annotations

import collections
import dataclasses
import html
import os
import time

from ..._durable import check_target, write_atomic
from .attempts import Attempt, attempts, fmt_bytes, fmt_seconds
from .journal import open_readonly
from .model import TaskState
from .report import printable
from .status import RunStatus

MAX_BARS = 4000  # attempts drawn in the timeline (the longest)
MAX_LANES = 48  # rows per host in the timeline; more overlapping attempts share the last one
SLOWEST = 20
FAILURES = 50
LANE_H = 12
LABEL_W = 170
PLOT_W = 860
COLOURS = {TaskState.DONE: "#2e8b57", TaskState.FAILED: "#c0392b", TaskState.RUNNING: "#2f6fdf",
           TaskState.CANCELED: "#8c8c8c"}


def _e(text) -> str:
    """A journal string made safe for the page: control characters shown, then HTML-escaped."""
    return html.escape(printable(str(text)))


def _clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _lanes(items: list[Attempt]) -> list[int]:
    """A lane per attempt (same order) so that attempts on one lane never overlap; the lane
    count is capped at MAX_LANES (the last lane then holds the overflow)."""
    ends: list[float] = []
    out = []
    for a in items:
        for i, end in enumerate(ends):
            if end <= a.started:
                ends[i] = a.finished
                out.append(i)
                break
        else:
            if len(ends) < MAX_LANES:
                ends.append(a.finished)
                out.append(len(ends) - 1)
            else:
                ends[-1] = max(ends[-1], a.finished)
                out.append(len(ends) - 1)
    return out


def timeline(items: list[Attempt], now: float) -> str:
    """The SVG: per host, its attempts as bars from start to end on non-overlapping lanes."""
    timed = [a for a in items if a.started is not None  # not a task left PENDING by a drain
             and (a.state is TaskState.RUNNING or (a.finished is not None and a.state is not TaskState.PENDING))]
    if not timed:
        return "<p>No attempt has started yet.</p>"
    ends = {id(a): (a.finished if a.finished is not None and a.state is not TaskState.RUNNING else now)
            for a in timed}
    shown = sorted(timed, key=lambda a: ends[id(a)] - a.started, reverse=True)[:MAX_BARS]
    t0 = min(a.started for a in shown)
    t1 = max(max(ends[id(a)] for a in shown), t0 + 1e-3)
    scale = PLOT_W / (t1 - t0)
    by_host: dict[str, list[Attempt]] = collections.defaultdict(list)
    for a in shown:
        by_host[a.host or "(host not recorded)"].append(a)
    parts, y = [], 0
    for host in sorted(by_host):
        group = sorted(by_host[host], key=lambda a: a.started)
        bars = [dataclasses.replace(a, finished=ends[id(a)]) for a in group]
        lanes = _lanes(bars)
        height = (max(lanes) + 1) * LANE_H
        parts.append(f'<g class="host"><text x="0" y="{y + 11}" font-size="11">{_e(host)}</text>'
                     f'<rect x="{LABEL_W}" y="{y}" width="{PLOT_W}" height="{height}" fill="#f1f3f7"/>')
        for a, lane in zip(bars, lanes, strict=True):
            x = LABEL_W + (a.started - t0) * scale
            w = max(1.0, (a.finished - a.started) * scale)
            tip = (f"{a.uid} (attempt {a.attempt}, {a.state.value}) on {a.node or '?'}: "
                   f"{fmt_seconds(a.finished - a.started)} s, cpu {fmt_seconds(a.cpu)} s, "
                   f"peak rss {fmt_bytes(a.max_rss)}")
            parts.append(f'<rect class="bar" x="{x:.1f}" y="{y + lane * LANE_H + 1}" width="{w:.1f}" '
                         f'height="{LANE_H - 2}" fill="{COLOURS.get(a.state, "#999")}">'
                         f"<title>{_e(tip)}</title></rect>")
        parts.append("</g>")
        y += height + 6
    span = t1 - t0
    ticks = "".join(f'<text x="{LABEL_W + k * PLOT_W / 5:.0f}" y="{y + 12}" font-size="10" '
                    f'text-anchor="middle">{span * k / 5:.3g} s</text>' for k in range(6))
    left = len(timed) - len(shown)
    note = (f"<p>{left:,} shorter attempts are not drawn (the {MAX_BARS:,} longest are).</p>"
            if left > 0 else "")
    return (f'<svg id="timeline" width="{LABEL_W + PLOT_W + 20}" height="{y + 18}" role="img" '
            f'aria-label="attempts per host over time">{"".join(parts)}{ticks}</svg>{note}')


def _attempt_rows(items: list[Attempt]) -> str:
    return "".join(
        f'<tr><td class="text">{_e(a.uid)}</td><td>{a.attempt}</td><td class="text">{_e(a.state.value)}</td>'
        f'<td class="text">{_e(a.host or "-")}</td><td class="text">{_e(a.node or "-")}</td>'
        f"<td>{fmt_seconds(a.seconds)}</td><td>{fmt_seconds(a.cpu)}</td><td>{fmt_bytes(a.max_rss)}</td>"
        f"<td>{fmt_bytes(a.read_chars)}</td><td>{fmt_bytes(a.write_chars)}</td></tr>" for a in items)


_ATTEMPT_HEAD = ('<tr><th class="text">task</th><th>try</th><th class="text">state</th>'
                 '<th class="text">host</th><th class="text">node</th><th>secs</th><th>cpu s</th>'
                 "<th>peak rss</th><th>read</th><th>written</th></tr>")


def _usage_table(items: list[Attempt], key, title: str, table_id: str) -> str:
    """Attempts, wall and CPU seconds, the largest peak RSS and the bytes, per ``key``."""
    groups: dict[str, list[Attempt]] = collections.defaultdict(list)
    for a in items:
        if a.started is not None:
            groups[key(a) or "-"].append(a)
    rows = []
    for name in sorted(groups):
        g = groups[name]
        secs = sum(a.seconds or 0.0 for a in g)
        cpus = [a.cpu for a in g if a.cpu is not None]
        rss = [a.max_rss for a in g if a.max_rss is not None]
        read = [a.read_chars for a in g if a.read_chars is not None]
        wrote = [a.write_chars for a in g if a.write_chars is not None]
        rows.append(f'<tr><td class="text">{_e(name)}</td><td>{len(g):,}</td><td>{secs:.2f}</td>'
                    f"<td>{sum(cpus):.2f}</td><td>{fmt_bytes(max(rss) if rss else None)}</td>"
                    f"<td>{fmt_bytes(sum(read) if read else None)}</td>"
                    f"<td>{fmt_bytes(sum(wrote) if wrote else None)}</td></tr>")
    return (f'<table id="{table_id}"><tr><th class="text">{title}</th><th>attempts</th><th>wall s</th>'
            "<th>cpu s</th><th>largest peak rss</th><th>read</th><th>written</th></tr>"
            f"{''.join(rows)}</table>")


def render(path: str, *, now: float | None = None) -> str:
    """The report of the run journaled at ``path``, as one HTML string (JournalError if it is
    not a journal)."""
    now = time.time() if now is None else now
    status = RunStatus.load(path, failures=FAILURES, now=now)
    db = open_readonly(path)
    try:
        items = list(attempts(db))
    finally:
        db.close()
    c = status.counts
    title = f"shoal run report: {_e(os.path.basename(path))}"
    summary = (f"<p>{_e(status.table().splitlines()[0])}</p><p>{c[TaskState.DONE]:,} done, "
               f"{c[TaskState.FAILED]:,} failed, {c[TaskState.SKIPPED]:,} skipped, "
               f"{c[TaskState.CANCELED]:,} canceled, {c[TaskState.PENDING]:,} pending, "
               f"{c[TaskState.RUNNING]:,} running; {len(items):,} attempts; first start "
               f"{_clock(status.started)}, last end {_clock(status.updated)}. Made {_clock(now)} from "
               f"<code>{_e(os.path.abspath(path))}</code>.</p>")
    slow = sorted((a for a in items if a.seconds is not None), key=lambda a: -a.seconds)[:SLOWEST]
    failures = "".join(
        f'<div class="failure"><p><b>{_e(f.uid)}</b>: {_e(f.reason or f.kind or "failed")}'
        f'{"" if f.exit_code is None else f" (exit code {f.exit_code})"}'
        f'{f", {f.attempts} attempts" if f.attempts > 1 else ""}</p>'
        + (f"<pre>{_e(f.stderr_tail)}</pre>" if f.stderr_tail.strip() else "<p>(no stderr)</p>")
        + "</div>" for f in status.failures)
    more = c[TaskState.FAILED] - len(status.failures)
    if more > 0:
        failures += f"<p>... and {more:,} more failures (shoal status {_e(path)} --tasks --state failed)</p>"
    legend = " ".join(f'<span class="key" style="background:{colour}"></span>{_e(state.value)}'
                      for state, colour in COLOURS.items())
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font:14px/1.4 system-ui,"DejaVu Sans",sans-serif;margin:1.5em;color:#1d2330}}
table{{border-collapse:collapse}}th,td{{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}}
th{{background:#eceef2}}.text{{text-align:left}}h2{{font-size:110%;margin-top:1.5em}}
pre{{background:#f6f6f6;padding:.5em;overflow-x:auto;max-height:20em}}
.key{{display:inline-block;width:.9em;height:.9em;margin:0 .3em 0 .8em;vertical-align:middle}}</style>
</head><body><h1>{title}</h1>{summary}
<h2>Timeline per host</h2><p>Each bar is one attempt, from its start to its end as the driver saw
them. {legend}</p>{timeline(items, now)}
<h2>Slowest tasks</h2><table id="slowest">{_ATTEMPT_HEAD}{_attempt_rows(slow)}</table>
<h2>Failures</h2><div id="failures">{failures or "<p>None.</p>"}</div>
<h2>Resource use per stage</h2>{_usage_table(items, lambda a: a.stage, "stage", "per-stage")}
<h2>Resource use per host</h2>{_usage_table(items, lambda a: a.host, "host", "per-host")}
<p>CPU time is user plus system; peak RSS is the largest resident memory of the attempt's process
(of the worker process during the call for function tasks; "-" for an executable that stayed smaller
than the process that started it, whose peak Linux does not tell apart); read and written count every byte
through read and write calls. What is measured for which kind of task: docs/ensemble.md, "What a
run used".</p></body></html>
"""


def write(path: str, out: str) -> str:
    """Render the report of ``path`` and write it to ``out`` atomically; returns ``out``."""
    check_target(out, "report")  # a folder, a FIFO, a device or a link: refused, naming it
    write_atomic(out, [render(path).encode("utf-8")], "report")
    return out
