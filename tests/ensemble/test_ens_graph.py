"""``shoal graph`` and graph.py: the workflow drawn as pipelines, stages and tasks by state.

Against the run itself: the uids the graph names are the journal's, the states are the
journal's after a real run, and the picture is Graphviz's own SVG (parsed as XML).  Hostile
names and output paths, a missing Graphviz and a lazy stage (never consumed) are covered.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest
from ens_tasks import boom, square

from shoal.cli import main
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.patterns.ensemble.graph import (
    EdgeKind,
    GraphError,
    from_journal,
    from_workflow,
    graphviz_available,
    journal_states,
    quote,
    render_svg,
    to_dot,
)
from shoal.patterns.ensemble.model import TaskState

needs_dot = pytest.mark.skipif(not graphviz_available(), reason=(
    "Graphviz's dot is not installed: apt-get install graphviz (scripts/install-graphviz as root; "
    ".ci/run does it)"))
SVG = "{http://www.w3.org/2000/svg}"


def _workflow():
    a = Pipeline([Stage([Task(function=square, args=(i,)) for i in range(3)], name="sim"),
                  Stage([Task(executable="/bin/cat", arguments=["$a.sim.t0/out.txt"], name="cat")],
                        name="sum")], name="a")
    b = Pipeline([Stage([Task(function=square, args=(9,), after=["a.sum.cat"])], name="post")],
                 name="b", after=["a"])
    return [a, b]


def test_the_graph_names_the_runs_uids_and_every_kind_of_edge():
    g = from_workflow(_workflow())
    assert [p.uid for p in g.pipelines] == ["a", "b"]
    assert [t.uid for t in g.stage("a.sim").tasks] == ["a.sim.t0", "a.sim.t1", "a.sim.t2"]
    edges = {(e.source, e.target, e.kind) for e in g.edges}
    assert ("a.sim", "a.sum", EdgeKind.BARRIER) in edges
    assert ("a.sim.t0", "a.sum.cat", EdgeKind.DATA) in edges
    assert ("a.sum.cat", "b.post.t0", EdgeKind.AFTER) in edges
    assert ("a", "b", EdgeKind.AFTER) in edges
    assert all(t.state is TaskState.PENDING for t in g.stage("a.sim").tasks)


def test_a_big_stage_is_one_node_with_its_counts_and_a_lazy_stage_is_not_consumed():
    pulled = []

    def lazy():
        for i in range(5):
            pulled.append(i)
            yield Task(function=square, args=(i,))

    wf = Pipeline([Stage([Task(function=square, args=(i,)) for i in range(500)], name="big"),
                   Stage(lazy(), name="lazy")], name="p")
    g = from_workflow(wf, max_tasks=12)
    big = g.stage("p.big")
    assert big.collapsed and big.total == 500 and dict(big.counts) == {TaskState.PENDING: 500}
    assert g.stage("p.lazy").total is None and pulled == []
    dot = to_dot(g)
    assert "500 tasks" in dot and "lazy stage" in dot and dot.count("->") == 1


def test_states_after_a_real_run_are_the_journals(tmp_path):
    db = str(tmp_path / "run.db")
    wf = [Pipeline([Stage([Task(function=square, args=(2,)), Task(function=boom)], name="s"),
                    Stage([Task(function=square, args=(3,))], name="next")], name="p")]
    report = run(wf, journal=db, workers=1)
    assert not report.ok
    states = journal_states(db)
    assert states["p.s.t0"] is TaskState.DONE and states["p.s.t1"] is TaskState.FAILED
    g = from_workflow([Pipeline([Stage([Task(function=square, args=(2,)), Task(function=boom)], name="s"),
                                 Stage([Task(function=square, args=(3,))], name="next")], name="p")],
                      states)
    assert [t.state for t in g.stage("p.s").tasks] == [TaskState.DONE, TaskState.FAILED]
    assert g.stage("p.s").state is TaskState.FAILED
    j = from_journal(db)
    assert [t.uid for t in j.stage("p.s").tasks] == ["p.s.t0", "p.s.t1"]
    assert j.stage("p.s").state is TaskState.FAILED
    assert j.stage("p.next").state is not TaskState.DONE  # never ran: its pipeline failed first
    assert [(e.source, e.target) for e in j.edges] == [("p.s", "p.next")]


def test_dot_quoting_keeps_hostile_names_text():
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    assert quote("x") == '"x"'


@needs_dot
def test_the_svg_is_graphvizs_and_holds_every_task(tmp_path):
    svg = render_svg(to_dot(from_workflow(_workflow()), title="demo <&> \"title\""))
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    for name in ("t0", "t1", "t2", "cat", "stage sim", "pipeline b"):
        assert name in texts
    assert 'demo <&> "title"' in texts  # escaped by Graphviz, read back as text


@needs_dot
def test_shoal_graph_writes_the_svg_of_a_workflow_file_and_of_a_journal(tmp_path, capsys):
    wf = tmp_path / "wf.yaml"
    wf.write_text("pipelines:\n  - name: p\n    stages:\n      - name: s\n        tasks:\n"
                  "          - {executable: /bin/true}\n          - {executable: /bin/false}\n")
    db = str(tmp_path / "run.db")
    assert main(["run", str(wf), "--journal", db]) == 1
    out = tmp_path / "wf.svg"
    assert main(["graph", str(wf), "--journal", db, "--svg", str(out)]) == 0
    assert ET.fromstring(out.read_bytes()).tag == f"{SVG}svg"
    assert main(["graph", db, "--svg", str(tmp_path / "db.svg")]) == 0
    capsys.readouterr()
    assert main(["graph", db, "--dot", "-"]) == 0
    assert "#c62828" in capsys.readouterr().out  # the failed task's border


def test_shoal_graph_refuses_bad_outputs_in_one_line(tmp_path, capsys):
    wf = tmp_path / "wf.yaml"
    wf.write_text("pipelines:\n  - stages:\n      - tasks:\n          - {executable: /bin/true}\n")
    assert main(["graph", str(wf)]) == 2
    assert "--svg OUT.svg" in capsys.readouterr().err
    assert main(["graph", str(wf), "--dot", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["graph", str(tmp_path / "none.db"), "--dot", "-"]) == 2
    assert "no journal at" in capsys.readouterr().err
    assert main(["graph", str(wf), "--max-tasks", "-1", "--dot", "-"]) == 2
    notes = tmp_path / "notes.txt"
    notes.write_text("pipelines: []\n")
    capsys.readouterr()
    assert main(["graph", str(notes), "--dot", "-"]) == 2  # read as a journal: it is not one
    assert "is not a shoal journal" in capsys.readouterr().err
    secret = tmp_path / "secret"
    secret.write_text("keep")
    link = tmp_path / "out.dot"
    os.symlink(secret, link)
    assert main(["graph", str(wf), "--dot", str(link)]) == 2  # a planted link: refused, not followed
    assert "symbolic link" in capsys.readouterr().err and secret.read_text() == "keep"


def test_without_graphviz_svg_says_how_to_install_it_and_dot_still_works(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    with pytest.raises(GraphError, match="apt-get install graphviz"):
        render_svg("digraph { a }")
    wf = tmp_path / "wf.yaml"
    wf.write_text("pipelines:\n  - stages:\n      - tasks:\n          - {executable: /bin/true}\n")
    assert main(["graph", str(wf), "--svg", str(tmp_path / "x.svg")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Graphviz" in err and "--dot" in err
    assert main(["graph", str(wf), "--dot", str(tmp_path / "x.dot")]) == 0
    assert (tmp_path / "x.dot").read_text().startswith("digraph workflow {")
