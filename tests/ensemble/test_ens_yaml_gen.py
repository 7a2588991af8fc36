"""YAML generators (issue 14): ``replicas: N`` with ``{i}`` and ``sweep:`` over lists, with file:line errors."""

from __future__ import annotations

import textwrap

import pytest
from ens_tasks import ROOT  # noqa: F401 - puts tests/ensemble helpers on the path for function tasks

from shoal.ensemble import EnsembleError, run
from shoal.patterns.ensemble.yamlfile import load_yaml

GEN = """\
pipelines:
  - name: ens
    stages:
      - name: sim
        tasks:
          - executable: /bin/sh
            name: "r{i}"
            arguments: ["-c", "echo {i} > out.txt"]
            replicas: 4
          - function: "ens_tasks:add"
            args: ["{a}", "{b}"]
            sweep:
              a: [1, 2]
              b: [10, 20, 30]
      - name: collect
        tasks:
          - executable: /bin/sh
            arguments: ["-c", "cat in*.txt"]
            inputs:
              - source: "$ens.sim.r{i}/out.txt"
                target: "in{i}.txt"
            after: ["ens.sim.r{i}"]
            replicas: 2
"""


def test_replicas_and_sweeps_expand_and_run(tmp_path):
    wf = tmp_path / "wf.yaml"
    wf.write_text(GEN)
    pipelines = load_yaml(str(wf))
    sim, collect = pipelines[0].stages
    assert [t.name for t in sim.tasks[:4]] == ["r0", "r1", "r2", "r3"]
    assert [t.arguments[1] for t in sim.tasks[:4]] == [f"echo {i} > out.txt" for i in range(4)]
    assert [t.args for t in sim.tasks[4:]] == [(a, b) for a in (1, 2) for b in (10, 20, 30)]  # typed values
    report = run(pipelines, journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 12
    assert sorted(report.result(f"ens.sim.t{k}") for k in range(4, 10)) == sorted(
        a + b for a in (1, 2) for b in (10, 20, 30))
    assert (tmp_path / "run.sandbox/ens/collect/t1/stdout").read_text() == "1\n"


TASK = "pipelines:\n  - stages:\n      - tasks:\n          - executable: /bin/echo\n"


@pytest.mark.parametrize("text, line, words", [
    (TASK + "            arguments: ['{j}']\n            replicas: 3\n", 4, ["placeholder 'j' is not defined", "i"]),
    (TASK + "            name: same\n            replicas: 3\n", 5, ["'same' would be the same for every copy"]),
    (TASK + "            replicas: 0\n", 5, ["replicas", ">= 1"]),
    (TASK + "            replicas: many\n", 5, ["replicas", "expected an integer"]),
    (TASK + "            sweep: {t: []}\n", 5, ["sweep.t", "non-empty list"]),
    (TASK + "            sweep: [1, 2]\n", 5, ["sweep", "expected a mapping"]),
    (TASK + "            sweep: {t: [1]}\n            replica: 2\n", 6, ["unknown key 'replica'",
                                                                        "did you mean 'replicas'"]),
    (TASK + "            after: ['p0.s0.x{i}']\n            replicas: 2\n", 5, ["'p0.s0.x0' names no"]),
])
def test_generator_errors_name_file_and_line(tmp_path, text, line, words):
    wf = tmp_path / "wf.yaml"
    wf.write_text(textwrap.dedent(text))
    with pytest.raises(EnsembleError) as info:
        load_yaml(str(wf))
    msg = str(info.value)
    assert msg.startswith(f"{wf}:{line}:"), msg
    for w in words:
        assert w in msg, msg


CHAINED = """\
pipelines:
  - name: ens
    stages:
      - name: sim
        tasks:
          - executable: /bin/sh
            name: "r{i}"
            arguments: ["-c", "echo {i} > out.txt"]
            replicas: 3
      - name: ana
        tasks:
          - executable: /bin/sh
            name: "a{i}"
            arguments: ["-c", "cat $ens.sim.r{i}/out.txt"]
            replicas: 3
          - executable: /bin/cat
            name: "s{i}"
            stdin: "$ens.sim.r{i}/out.txt"
            replicas: 2
          - function: "ens_tasks:read_text"
            name: "f{i}"
            args: ["$ens.sim.r{i}/out.txt"]
            replicas: 2
"""


def test_placeholders_are_filled_before_references_are_checked(tmp_path):
    """Issue 35: ``arguments: ["-c", "cat $ens.sim.r{i}/out.txt"]`` in a ``replicas:`` task was
    refused ('ens.sim.r' names no pipeline...): the embedded reference was read from the
    template and stopped at the brace.  Arguments, stdin and function args all chain copy i
    of one stage to copy i of the next."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(CHAINED)
    report = run(load_yaml(str(wf)), journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 10, report
    for i in range(3):
        assert (tmp_path / f"run.sandbox/ens/ana/a{i}/stdout").read_text() == f"{i}\n"
    for i in range(2):
        assert (tmp_path / f"run.sandbox/ens/ana/s{i}/stdout").read_text() == f"{i}\n"
        assert report.result(f"ens.ana.f{i}") == f"{i}\n"


@pytest.mark.parametrize("field", ['arguments: ["-c", "cat $ens.sim.r{i}/out.txt"]',
                                   'stdin: "$ens.sim.r{i}/out.txt"'])
def test_a_reference_to_a_copy_that_does_not_exist_is_an_error(tmp_path, field):
    wf = tmp_path / "wf.yaml"
    wf.write_text(CHAINED.split("      - name: ana")[0] + "      - name: ana\n        tasks:\n"
                  "          - executable: /bin/sh\n            name: 'a{i}'\n"
                  f"            {field}\n            replicas: 4\n")
    with pytest.raises(EnsembleError) as info:
        load_yaml(str(wf))
    assert "'ens.sim.r3' names no pipeline, stage or task" in str(info.value)
    assert "did you mean" in str(info.value)


KWARGS_CHAINED = CHAINED.split("      - name: ana")[0] + """\
      - name: ana
        tasks:
          - function: "ens_tasks:read_text"
            name: "k{i}"
            kwargs: {path: "$ens.sim.r{i}/out.txt"}
            replicas: 3
"""


def test_a_reference_in_kwargs_is_resolved_like_one_in_args(tmp_path):
    """``kwargs: {path: "$ens.sim.r{i}/out.txt"}`` reached the function as that text (a
    FileNotFoundError naming '$ens.sim.r0/out.txt') while the same value in ``args`` was the
    file's path; a copy that does not exist is an error at load, as in args."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(KWARGS_CHAINED)
    report = run(load_yaml(str(wf)), journal=str(tmp_path / "run.db"))
    assert report.ok, report
    assert [report.result(f"ens.ana.k{i}") for i in range(3)] == ["0\n", "1\n", "2\n"]
    head, _, tail = KWARGS_CHAINED.rpartition("replicas: 3\n")  # the ana stage's copies only
    wf.write_text(head + "replicas: 4\n" + tail)
    with pytest.raises(EnsembleError) as info:
        load_yaml(str(wf))
    assert "kwargs.path: 'ens.sim.r3' names no pipeline, stage or task" in str(info.value)


@pytest.mark.parametrize("field", ['pre_exec: ["cp $ens.sim.r{i}/out.txt in.txt"]',
                                   'post_exec: ["cat $ens.sim.r{i}/out.txt"]',
                                   'environment: {IN: "$ens.sim.r{i}/out.txt"}'])
def test_a_reference_where_none_is_resolved_is_refused_saying_where_they_work(tmp_path, field):
    """In a pre_exec line the shell expanded ``$ens`` to nothing (``cp: cannot stat
    '.sim.r0/out.txt'``, a failure at run time far from its cause)."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(CHAINED.split("      - name: ana")[0] + "      - name: ana\n        tasks:\n"
                  "          - executable: /bin/sh\n            name: 'a{i}'\n"
                  "            arguments: ['-c', 'true']\n"
                  f"            {field}\n            replicas: 2\n")
    with pytest.raises(EnsembleError) as info:
        load_yaml(str(wf))
    message = str(info.value)
    assert "holds the reference $ens.sim.r0, which is not resolved there" in message, message
    assert "stage the file with inputs=[...]" in message and "\n" not in message
