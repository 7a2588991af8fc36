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
