"""``shoal trace run.json --html out.html``: a self-contained static report of a Chrome trace.

For people on a cluster without a browser tunnel: one HTML file (inline CSS and
SVG, no script, nothing fetched) with the timeline (per worker: busy share per
pixel column, steals as marks), per-worker utilisation, steals given and taken,
and the task names that took the most time.

Input: the trace ``Pilot(trace=...)`` writes (``shoal.runtime.trace``): complete
events (``ph: X``) of category ``task`` and ``idle`` per worker track (``tid``),
instants (``ph: i``) of category ``steal``.  Any Chrome trace with complete
events works; unknown categories count as busy.  Drawing is by buckets, so a
trace of millions of spans gives a file of the same size as one of hundreds.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections import defaultdict

COLUMNS = 600  # timeline buckets per worker
ROW_H = 16


class TraceError(ValueError):
    """The file is not a readable Chrome trace; the message names it."""


def load(path: str) -> list[dict]:
    if not os.path.exists(path):
        raise TraceError(f"no trace at {path}; write one with shoal.Pilot(trace={path!r})")
    if not os.path.isfile(path):  # a FIFO would block open() forever, a directory fail later
        raise TraceError(f"{path} is not a regular file, not a JSON trace file")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path} is not a JSON trace file: {exc}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list (not a Chrome trace-event file)")
    return [e for e in events if isinstance(e, dict)]


def _union(intervals: list) -> list:
    """Disjoint intervals covering the same time as ``intervals`` (nested spans count once)."""
    out: list = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1][1] = b
        else:
            out.append([a, b])
    return out


def summarise(events: list[dict]) -> dict:
    """Per-worker busy/idle time, steals, a bucketed timeline and the top task names."""
    names = {e.get("tid"): e.get("args", {}).get("name") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
             and isinstance(e.get("dur"), (int, float))]
    marks = [e for e in events if e.get("ph") in ("i", "I") and isinstance(e.get("ts"), (int, float))]
    if not spans:
        return {"workers": [], "t0": 0.0, "t1": 0.0, "tasks": [], "spans": 0}
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    width = max(t1 - t0, 1e-9)
    per: dict = defaultdict(lambda: {"busy": 0.0, "idle": 0.0, "tasks": 0, "stole": 0, "gave": 0,
                                     "cols": [0.0] * COLUMNS, "marks": []})
    by_name: dict = defaultdict(lambda: [0, 0.0])
    busy_spans: dict = defaultdict(list)
    for e in spans:
        w = per[e.get("tid")]
        if e.get("cat") == "idle":
            w["idle"] += e["dur"]
            continue
        w["tasks"] += 1
        by_name[e.get("name", "?")][0] += 1
        by_name[e.get("name", "?")][1] += e["dur"]
        busy_spans[e.get("tid")].append((e["ts"], e["ts"] + e["dur"]))
    for tid, intervals in busy_spans.items():
        w = per[tid]
        for start, end in _union(intervals):  # a join runs children inside its parent's span
            w["busy"] += end - start
            a, b = (start - t0) / width * COLUMNS, (end - t0) / width * COLUMNS
            i = int(a)
            while i < COLUMNS and i < b:  # spread the interval over the columns it covers
                w["cols"][i] += min(b, i + 1) - max(a, i)
                i += 1
    for e in marks:
        if e.get("cat") != "steal":
            continue
        w = per[e.get("tid")]
        text = str(e.get("name", ""))
        w["stole" if text.startswith("stole") else "gave"] += 1
        w["marks"].append(((e["ts"] - t0) / width, text))
    for tid in names:  # a worker that ran nothing is a row too (0%)
        per[tid]
    workers = []
    for tid in sorted(per, key=lambda t: (str(type(t)), t)):
        w = per[tid]
        workers.append({"tid": tid, "name": names.get(tid) or f"track {tid}", "busy_s": w["busy"] / 1e6,
                        "idle_s": w["idle"] / 1e6, "tasks": w["tasks"], "stole": w["stole"],
                        "gave": w["gave"], "utilisation": w["busy"] / width,
                        "cols": [min(1.0, c) for c in w["cols"]], "marks": w["marks"]})
    tasks = sorted(((n, c, d / 1e6) for n, (c, d) in by_name.items()), key=lambda x: -x[2])[:15]
    return {"workers": workers, "t0": t0, "t1": t1, "tasks": tasks, "spans": len(spans)}


def _timeline(s: dict, width: int = 900) -> str:
    rows = s["workers"]
    label = 90
    h = ROW_H * len(rows) + 22
    out = [f'<svg width="{width + label + 30}" height="{h}" role="img" aria-label="timeline">']
    col_w = width / COLUMNS
    for r, w in enumerate(rows):
        y = r * ROW_H
        out.append(f'<text x="0" y="{y + 12}" font-size="11">{html.escape(w["name"])}</text>'
                   f'<rect x="{label}" y="{y + 1}" width="{width}" height="{ROW_H - 2}" fill="#eef"/>')
        for i, v in enumerate(w["cols"]):
            if v > 0.02:
                out.append(f'<rect x="{label + i * col_w:.1f}" y="{y + 1}" width="{col_w + 0.3:.1f}" '
                           f'height="{ROW_H - 2}" fill="#1a8754" fill-opacity="{v:.2f}"/>')
        for frac, text in w["marks"][:2000]:
            x = label + frac * width
            colour = "#c22" if text.startswith("stole") else "#d80"
            out.append(f'<path d="M{x:.1f},{y + 1} l3,5 l-6,0z" fill="{colour}"><title>'
                       f'{html.escape(text)}</title></path>')
    span_s = (s["t1"] - s["t0"]) / 1e6
    for k in range(6):
        x = label + k * width / 5
        out.append(f'<text x="{x:.0f}" y="{h - 4}" font-size="10" text-anchor="middle">'
                   f'{span_s * k / 5:.3g} s</text>')
    out.append("</svg>")
    return "".join(out)


def render(path: str) -> str:
    """The report of the trace at ``path`` as one HTML string."""
    s = summarise(load(path))
    title = f"shoal trace report: {html.escape(os.path.basename(path))}"
    span = (s["t1"] - s["t0"]) / 1e6
    rows = "".join(
        f'<tr class="worker"><td class="text">{html.escape(w["name"])}</td><td>{w["tasks"]:,}</td>'
        f'<td>{w["busy_s"]:.3f}</td><td>{w["idle_s"]:.3f}</td><td>{100 * w["utilisation"]:.1f}</td>'
        f'<td>{w["stole"]}</td><td>{w["gave"]}</td></tr>' for w in s["workers"])
    tasks = "".join(f'<tr><td class="text">{html.escape(str(n))}</td><td>{c:,}</td><td>{d:.3f}</td></tr>'
                    for n, c, d in s["tasks"])
    body = (f"<p>{s['spans']:,} spans over {span:.3f} s, {len(s['workers'])} workers; made "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} from <code>{html.escape(os.path.abspath(path))}</code>. "
            "Green: share of each column the worker ran tasks; red mark: it stole, orange: it gave.</p>"
            if s["spans"] else "<p>The trace holds no spans.</p>")
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font:14px/1.4 system-ui,"DejaVu Sans",sans-serif;margin:1.5em;color:#1d2330}}
table{{border-collapse:collapse}}th,td{{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}}
th{{background:#eceef2}}.text{{text-align:left}}h2{{font-size:110%;margin-top:1.5em}}</style></head>
<body><h1>{title}</h1>{body}
<h2>Timeline</h2>{_timeline(s) if s["spans"] else ""}
<h2>Per worker</h2><table id="utilisation"><tr><th class="text">worker</th><th>tasks</th><th>busy s</th>
<th>idle s</th><th>utilisation %</th><th>steals taken</th><th>steals given</th></tr>{rows}</table>
<h2>Task names by total time</h2><table id="tasks"><tr><th class="text">task</th><th>count</th>
<th>total s</th></tr>{tasks}</table></body></html>
"""


def write(path: str, out: str) -> str:
    from .._durable import write_atomic

    text = render(path)
    # a temporary beside ``out`` renamed into place: a link planted at ``out`` is replaced,
    # never written through, and a reader never sees half a report
    write_atomic(out, [text.encode("utf-8")], "trace report")
    return out
