"""A workflow as a picture: pipelines, stages and tasks, coloured by state, laid out by Graphviz.

Data flow (``shoal graph``, the dashboard's graph page)::

    a workflow file's pipelines ─┐
                                 ├─> WorkflowGraph ──> to_dot() ──> render_svg() ──> SVG
    a journal (RunStatus + rows) ┘    (plain data)      (text)      (Graphviz's dot)

``from_workflow`` and ``from_journal`` build a ``WorkflowGraph``: frozen data, no I/O in
the policy (what to collapse, which edges exist), so tests check it without Graphviz.
``to_dot`` turns it into Graphviz's DOT language (data handed to a program, never code
run here); ``render_svg`` is the one function that runs something: ``dot -Tsvg``, bounded
by a timeout, its failure one line.

What is drawn:

* a pipeline is a box (a Graphviz cluster) holding its stages left to right; a stage is a
  box holding its tasks; a stage of more than ``max_tasks`` tasks is *collapsed* into one
  node with its counts by state, so a 100,000-task stage is one node and the layout stays
  fast;
* edges: the stage barrier (each stage waits for the one before it: one edge between the
  two boxes), ``after=`` of tasks, stages and pipelines (solid), and data references
  (``$p.s.t/file`` inputs, dashed);
* colour: the state of each task (pending, running, done, failed, skipped, canceled);
  a collapsed stage is coloured by its stage's state and lists its counts.

``from_workflow`` draws what a workflow file says (all edges; states from a journal when
given).  ``from_journal`` draws what a journal knows: the plan of pipelines, stages and
task counts that ``shoal run`` records, and the tasks' states; it does not know
``after=`` (the journal keeps what each task runs, not what it waits for), so it draws
the stage barriers only.  A lazy stage (a generator of tasks) is drawn as one node: its
tasks do not exist until the run pulls them, and drawing them would consume them.

Rejected: a hand-written layout (layered layout with crossing minimisation is decades of
Graphviz's work; ours would be a toy that tangles on the first wide stage); a JavaScript
layout library vendored into the dashboard (a few hundred KB of another project's code in
our wheel to keep current, and ``shoal graph`` on a login node would need a browser to
make a file); the ``graphviz`` Python package (a thin wrapper over the same ``dot``
program, one more dependency that adds nothing used here).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import shutil
import sqlite3
import subprocess
from collections.abc import Mapping

from ..._errors import ShoalError
from .identity import listed_keys
from .model import EMBEDDED_REF_RE, EnsembleError, Pipeline, Task, TaskState, as_pipelines

MAX_TASKS = 12  # a stage with more tasks is drawn as one node with its counts
MAX_PIPELINES = 200  # a workflow of more pipelines is refused: the picture would be unreadable
DOT_TIMEOUT_S = 60.0
INSTALL_HINT = ("install Graphviz (Debian/Ubuntu: apt-get install graphviz, or scripts/install-graphviz "
                "in a checkout; conda: conda install graphviz; macOS: brew install graphviz)")

FILL = {  # state -> (fill, border): readable in colour and, by the border, in grey
    TaskState.PENDING: ("#f2f2f2", "#999999"),
    TaskState.RUNNING: ("#cfe3ff", "#2463c0"),
    TaskState.DONE: ("#d4f0d4", "#2e7d32"),
    TaskState.FAILED: ("#ffd2d2", "#c62828"),
    TaskState.SKIPPED: ("#fafafa", "#bbbbbb"),
    TaskState.CANCELED: ("#ffe6c4", "#c77700"),
}


class GraphError(ShoalError, ValueError):
    """The graph cannot be drawn (no Graphviz, a workflow too big to draw, ``dot`` failed)."""


class GraphvizMissing(GraphError):
    """Graphviz's ``dot`` is not on PATH (the dashboard answers 503 for it)."""


class EdgeKind(enum.Enum):
    BARRIER = "barrier"  # a stage waits for the stage before it
    AFTER = "after"  # an after= dependency
    DATA = "data"  # an input staged from another task's sandbox ($p.s.t/file)


@dataclasses.dataclass(frozen=True)
class TaskBox:
    uid: str
    label: str
    state: TaskState


@dataclasses.dataclass(frozen=True)
class StageBox:
    uid: str
    label: str
    state: TaskState
    tasks: tuple[TaskBox, ...]  # empty when collapsed or lazy
    counts: tuple[tuple[TaskState, int], ...]  # by state, for a collapsed stage
    total: int | None  # tasks in the stage; None when lazy
    collapsed: bool


@dataclasses.dataclass(frozen=True)
class PipelineBox:
    uid: str
    label: str
    stages: tuple[StageBox, ...]


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str  # the uid of a task, stage or pipeline
    target: str
    kind: EdgeKind


@dataclasses.dataclass(frozen=True)
class WorkflowGraph:
    pipelines: tuple[PipelineBox, ...]
    edges: tuple[Edge, ...]

    def stage(self, uid: str) -> StageBox:
        for p in self.pipelines:
            for s in p.stages:
                if s.uid == uid:
                    return s
        raise KeyError(uid)


# -- building --------------------------------------------------------------------------------
def _stage_box(uid: str, tasks: list[tuple[str, TaskState]] | None, max_tasks: int,
               state: TaskState | None = None, counts: Mapping[TaskState, int] | None = None,
               total: int | None = None) -> StageBox:
    """One stage: its tasks when there are at most ``max_tasks`` of them and they are known."""
    if counts is None:
        counts = {}
        for _, st in tasks or ():
            counts[st] = counts.get(st, 0) + 1
    if total is None and tasks is not None:
        total = len(tasks)
    if state is None:
        state = _stage_state(counts, total)
    ordered = tuple((s, counts[s]) for s in TaskState if counts.get(s))
    label = uid.rsplit(".", 1)[-1]
    if tasks is not None and len(tasks) <= max_tasks:
        boxes = tuple(TaskBox(u, u.rsplit(".", 1)[-1], st) for u, st in tasks)
        return StageBox(uid, label, state, boxes, ordered, total, collapsed=False)
    return StageBox(uid, label, state, (), ordered, total, collapsed=True)


def _stage_state(counts: Mapping[TaskState, int], total: int | None) -> TaskState:
    """A stage's colour from its tasks' states: failed beats running beats pending beats done."""
    seen = sum(counts.values())
    for state in (TaskState.FAILED, TaskState.RUNNING):
        if counts.get(state):
            return state
    if total is None or seen < total or counts.get(TaskState.PENDING):
        return TaskState.RUNNING if counts.get(TaskState.DONE) else TaskState.PENDING
    if counts.get(TaskState.CANCELED):
        return TaskState.CANCELED
    if counts.get(TaskState.DONE):
        return TaskState.DONE
    return TaskState.SKIPPED if seen else TaskState.PENDING


def from_workflow(workflow, states: Mapping[str, TaskState] | None = None, *,
                  max_tasks: int = MAX_TASKS) -> WorkflowGraph:
    """The graph of a workflow (a Pipeline, a list of them, or a function returning one), with
    each task's state from ``states`` (uid -> TaskState; default pending).

    Uids are the ones ``run`` gives (``identity.listed_keys``); the pipelines, stages and
    tasks are bound to them here, so load the workflow for drawing only (``shoal graph``
    does).  A lazy workflow (an iterator of pipelines) is drawn up to ``MAX_PIPELINES``."""
    _check_max_tasks(max_tasks)
    states = states or {}
    pipelines = []
    for i, p in enumerate(as_pipelines(workflow)):
        if i == MAX_PIPELINES:
            raise GraphError(f"the workflow has more than {MAX_PIPELINES} pipelines; a picture of them "
                             "would be unreadable: draw a smaller workflow, or read `shoal status`")
        if not isinstance(p, Pipeline):
            raise EnsembleError(f"workflow item {i} is {p!r}, not a Pipeline")
        pipelines.append(p)
    boxes, edges = [], []
    for p, (puid, stages) in zip(pipelines, listed_keys(pipelines), strict=True):
        p.bind_path(puid)
        stage_boxes = []
        for stage, (suid, listed) in zip(p.stages, stages, strict=True):
            stage.bind_path(suid)
            tasks = None
            if listed is not None:
                tasks = []
                for uid, task in listed:
                    if not isinstance(task, Task):
                        raise EnsembleError(f"stage {suid}: {task!r} is not a Task")
                    task.bind_path(uid)
                    tasks.append((uid, states.get(uid, TaskState.PENDING)))
            stage_boxes.append(_stage_box(suid, tasks, max_tasks))
        boxes.append(PipelineBox(puid, puid, tuple(stage_boxes)))
    for p in pipelines:
        edges += _edges_of(p)
    return WorkflowGraph(tuple(boxes), tuple(edges))


def _edges_of(p: Pipeline) -> list[Edge]:
    edges = [Edge(dep, p.uid, EdgeKind.AFTER) for dep in p.dependency_uids()]
    for before, stage in itertools.pairwise(p.stages):
        edges.append(Edge(before.uid, stage.uid, EdgeKind.BARRIER))
    for stage in p.stages:
        edges += [Edge(dep, stage.uid, EdgeKind.AFTER) for dep in stage.dependency_uids()]
        if not isinstance(stage.tasks, list | tuple):
            continue
        for task in stage.tasks:
            edges += [Edge(dep, task.uid, EdgeKind.AFTER) for dep in task.dependency_uids()]
            edges += [Edge(source, task.uid, EdgeKind.DATA) for source in data_sources(task)]
    return edges


def data_sources(task: Task) -> list[str]:
    """The uids of the tasks whose files or results ``task`` uses: references in its inputs,
    arguments, stdin and a function's args/kwargs (where docs/ensemble.md says they work)."""
    texts = [i.source for i in task.staged_inputs()]
    texts += [a for a in (*task.arguments, task.stdin) if isinstance(a, str)]
    texts += [a for a in (*task.args, *dict(task.kwargs).values()) if isinstance(a, str)]
    seen: dict[str, None] = {}
    for text in texts:
        if "$" in text:
            for m in EMBEDDED_REF_RE.finditer(text):
                seen[f"{m[1]}.{m[2]}.{m[3]}"] = None
    return list(seen)


def from_journal(path: str, *, max_tasks: int = MAX_TASKS) -> WorkflowGraph:
    """The graph a journal knows (its plan and the tasks' states; stage barriers only)."""
    from .journal import open_readonly
    from .status import RunStatus

    _check_max_tasks(max_tasks)
    status = RunStatus.load(path, failures=0)
    db = open_readonly(path)
    try:
        boxes = []
        for p in status.pipelines:
            stages = []
            for s in p.stages:
                total = s.total
                tasks = None
                if total is not None and total <= max_tasks:
                    rows = db.execute("SELECT uid, state FROM tasks WHERE stage=? ORDER BY rowid",
                                      (s.uid,)).fetchall()
                    seen = {uid: TaskState(state) for uid, state in rows}
                    tasks = list(seen.items())
                    if s.pending and len(tasks) < total:  # planned, never journaled: pending
                        tasks += [(f"{s.uid}.t?{k}", TaskState.PENDING) for k in range(total - len(tasks))]
                counts = dict(s.counts)
                if s.pending:
                    counts[TaskState.PENDING] = s.pending
                stages.append(_stage_box(s.uid, tasks, max_tasks, state=_stage_state(counts, total),
                                         counts=counts, total=total))
            boxes.append(PipelineBox(p.uid, p.uid, tuple(stages)))
    except (ValueError, sqlite3.DatabaseError) as exc:
        raise GraphError(f"journal {path} is damaged or was not written by shoal ({exc})") from None
    finally:
        db.close()
    edges = [Edge(a.uid, b.uid, EdgeKind.BARRIER)
             for p in boxes for a, b in itertools.pairwise(p.stages)]
    return WorkflowGraph(tuple(boxes), tuple(edges))


def journal_states(path: str) -> dict[str, TaskState]:
    """uid -> state of every task a journal holds (for ``from_workflow``)."""
    from .journal import open_readonly

    db = open_readonly(path)
    try:
        return {uid: TaskState(state) for uid, state in db.execute("SELECT uid, state FROM tasks")}
    except (ValueError, sqlite3.DatabaseError) as exc:
        raise GraphError(f"journal {path} is damaged or was not written by shoal ({exc})") from None
    finally:
        db.close()


def _check_max_tasks(max_tasks) -> None:
    if not isinstance(max_tasks, int) or isinstance(max_tasks, bool) or max_tasks < 0:
        raise GraphError(f"max_tasks must be a whole number >= 0, got {max_tasks!r}")


# -- DOT -------------------------------------------------------------------------------------
def quote(text: str) -> str:
    """``text`` as a DOT string (double quotes; backslash, quote and newlines escaped)."""
    text = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + text.replace("\r", "").replace("\n", "\\n") + '"'


def _counts_text(stage: StageBox) -> str:
    total = "lazy stage (its tasks are made as it runs)" if stage.total is None else f"{stage.total:,} tasks"
    parts = [f"{n:,} {s.value}" for s, n in stage.counts]
    return total + ("\n" + ", ".join(parts) if parts else "")


def to_dot(graph: WorkflowGraph, title: str | None = None) -> str:
    """The graph in Graphviz's DOT language: one cluster per pipeline and per stage."""
    ids: dict[str, str] = {}  # uid -> the node an edge to/from it attaches to
    clusters: dict[str, str] = {}  # uid of a stage/pipeline -> its cluster's name
    lines = ["digraph workflow {",
             "  graph [rankdir=LR, compound=true, fontname=\"Helvetica\", fontsize=11, "
             "nodesep=0.15, ranksep=0.45" + (f", label={quote(title)}, labelloc=t" if title else "") + "];",
             "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];",
             "  edge [color=\"#555555\", arrowsize=0.7];"]
    n = 0

    def node(uid: str, label: str, state: TaskState, tooltip: str) -> str:
        nonlocal n
        name = f"n{n}"
        n += 1
        fill, border = FILL[state]
        lines.append(f"      {name} [label={quote(label)}, fillcolor={quote(fill)}, color={quote(border)}, "
                     f"tooltip={quote(tooltip)}, class={quote('state-' + state.value)}];")
        ids[uid] = name
        return name

    for i, p in enumerate(graph.pipelines):
        pname = f"cluster_p{i}"
        lines += [f"  subgraph {pname} {{", f"    label={quote('pipeline ' + p.label)}; "
                  "style=\"rounded\"; color=\"#888888\";"]
        first = None
        for j, s in enumerate(p.stages):
            sname = f"cluster_p{i}_s{j}"
            fill, border = FILL[s.state]
            lines += [f"    subgraph {sname} {{", f"      label={quote('stage ' + s.label)}; "
                      f"style=\"rounded,filled\"; fillcolor=\"#ffffff\"; color={quote(border)};"]
            if s.collapsed:
                rep = node(s.uid, _counts_text(s), s.state, f"{s.uid}: {_counts_text(s)}")
            elif s.tasks:
                rep = None
                for t in s.tasks:
                    name = node(t.uid, t.label, t.state, f"{t.uid}: {t.state.value}")
                    rep = rep or name
            else:
                rep = node(s.uid, "no tasks", s.state, f"{s.uid}: no tasks")
            lines.append("    }")
            ids.setdefault(s.uid, rep)
            clusters[s.uid] = sname
            first = first or rep
        lines.append("  }")
        if first is None:  # a pipeline without stages: one node stands for it
            first = node(p.uid, "no stages", TaskState.PENDING, f"{p.uid}: no stages")
        ids.setdefault(p.uid, first)
        clusters[p.uid] = pname
    tasks = _task_uids(graph)
    for e in graph.edges:
        a, b = ids.get(e.source), ids.get(e.target)
        if a is None or b is None:
            continue  # a dependency on something this picture does not hold (another run's)
        attrs = []
        if e.source in clusters and e.source not in tasks:
            attrs.append(f"ltail={clusters[e.source]}")
        if e.target in clusters and e.target not in tasks:
            attrs.append(f"lhead={clusters[e.target]}")
        if e.kind is EdgeKind.DATA:
            attrs.append("style=dashed")
        elif e.kind is EdgeKind.AFTER:
            attrs.append("color=\"#1f4e99\"")
        lines.append(f"  {a} -> {b}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _task_uids(graph: WorkflowGraph) -> frozenset[str]:
    return frozenset(t.uid for p in graph.pipelines for s in p.stages for t in s.tasks)


# -- rendering -------------------------------------------------------------------------------
def graphviz_available() -> bool:
    return shutil.which("dot") is not None


def render_svg(dot_text: str, timeout: float = DOT_TIMEOUT_S) -> bytes:
    """SVG bytes of ``dot_text``, laid out by Graphviz's ``dot``; GraphError if it cannot."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing(f"drawing the graph needs Graphviz's `dot` program, which is not on PATH: "
                         f"{INSTALL_HINT}; or write the DOT text with --dot and lay it out elsewhere")
    try:
        done = subprocess.run([exe, "-Tsvg"], input=dot_text.encode(), capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise GraphError(f"Graphviz's dot took more than {timeout:g} s to lay out the graph; draw "
                         "fewer tasks (a lower --max-tasks collapses more stages)") from None
    except OSError as exc:
        raise GraphError(f"could not run Graphviz's dot ({exe}): {exc}") from None
    if done.returncode != 0 or not done.stdout.lstrip().startswith((b"<?xml", b"<svg")):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise GraphError(f"Graphviz's dot failed (exit status {done.returncode}): {tail[0]}")
    return done.stdout

