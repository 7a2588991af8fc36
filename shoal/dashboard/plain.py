"""The numbers of a page as plain text, served inside the page's HTML.

A page is drawn by its script from ``/events``; fetched without a browser (``curl``, a
text browser, a page with scripts off) it would say only that it waits.  The server
puts this text in the page instead: the same sample ``/api/state`` returns, for the page
asked, with where the live data is.  The script replaces it with the drawn page.
"""

from __future__ import annotations

PENDING_FIRST = "no sample yet"


def page_text(name: str, state: dict) -> str:
    """What page ``name`` shows of ``state`` (the ``/api/state`` object), in lines."""
    render = {"workers": _workers, "progress": _progress, "journal": _journal, "graph": _graph}[name]
    return "\n".join(render(state))


def _workers(state: dict) -> list[str]:
    p = state.get("pilot")
    if not p:
        return ["no pilot here"]
    if not p.get("workers"):
        return [p.get("error") or PENDING_FIRST]
    tot = p.get("totals") or {}
    lines = [f"backend {p.get('backend')}, {len(p['workers'])} workers, {tot.get('tasks', 0)} tasks run, "
             f"busy {_num(tot.get('busy'))} %, steals {tot.get('stolen_local', 0)} local / "
             f"{tot.get('stolen_remote', 0)} remote"]
    lines.append(f"{'worker':>6}  {'pid':>7}  {'state':<8}  {'tasks':>7}  {'busy %':>6}")
    for r in p["workers"]:
        lines.append(f"{_num(r.get('worker')):>6}  {_num(r.get('pid')):>7}  {r.get('state', '?'):<8}  "
                     f"{_num(r.get('tasks_total')):>7}  {_num(r.get('busy')):>6}")
    return lines + ([p["error"]] if p.get("error") else [])


def _progress(state: dict) -> list[str]:
    board = (state.get("pilot") or {}).get("progress") or (state.get("journal") or {}).get("progress") or {}
    if not board:
        return ["nothing published yet (skeletons publish while they run; so does shoal.publish(topic, ...))"]
    lines = []
    for topic, recs in board.items():
        last = recs[-1] if recs else {}
        fields = ", ".join(f"{k} {_num(v)}" for k, v in last.items() if k not in ("t", "seq", "run"))
        lines.append(f"{topic}: {fields}")
    return lines


def _journal(state: dict) -> list[str]:
    j = state.get("journal")
    if not j:
        return ["no journal here"]
    if j.get("error"):
        return [j["error"]]
    c = j["counts"]
    lines = [f"journal {j['path']}: {'finished' if j['finished'] else 'in progress'} (driver {j['driver']}), "
             + ", ".join(f"{n} {s}" for s, n in c.items())
             + (f"; {j['rate']:.1f} tasks/s" if j.get("rate") else "; rate ?")]
    columns = list(c)
    labels = j.get("labels") or {}
    width = max([len("stage")] + [len(u) for u in j["stages"]])
    lwidth = max([len("state")] + [len(v) for v in labels.values()])
    lines.append(f"{'stage':<{width}}  {'state':<{lwidth}}  " + "  ".join(f"{s:>8}" for s in columns))
    for uid, row in j["stages"].items():
        lines.append(f"{uid:<{width}}  {labels.get(uid, ''):<{lwidth}}  "
                     + "  ".join(f"{row.get(s, 0):>8}" for s in columns))
    return lines + [f["line"] for f in j["failures"][::-1]]


def _graph(state: dict) -> list[str]:
    j = state.get("journal") or {}
    return [f"the workflow of journal {j.get('path', '?')} drawn by Graphviz: /api/graph.svg",
            "(shoal graph run.db --svg out.svg writes the same picture to a file)"]


def _num(v) -> str:
    if v is None:
        return "?"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
