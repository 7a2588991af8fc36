"""Code travels (issue 14): function tasks from a module beside the workflow run on dask workers
started from the command line, which cannot import that module (docs/ensemble.md promises it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from dask_cluster import ROOT, CliCluster

pytestmark = pytest.mark.fd_slack(8)

HOOKS = '''
import os

def double(x):
    return {"value": 2 * x, "pid": os.getpid()}

def check(ctx):
    total = sum(ctx.results[f"rx.s0.t{i}"]["value"] for i in range(4))
    assert total == 12, total
'''

PY = '''
import replica_hooks
from shoal.ensemble import Pipeline, Stage, Task

def local_triple(x):  # the workflow script's own function
    return 3 * x

workflow = Pipeline([Stage([Task(function=replica_hooks.double, args=(i,)) for i in range(4)],
                           post_exec=replica_hooks.check),
                     Stage([Task(function=local_triple, args=(5,))])], name="rx")
'''

YAML = '''
pipelines:
  - name: ry
    stages:
      - tasks:
          - function: "replica_hooks:double"
            args: [21]
'''


@pytest.fixture(scope="module")
def cluster():
    c = CliCluster(2)
    yield c
    c.close()


@pytest.mark.parametrize("kind", ["py", "yaml"])
def test_module_beside_the_workflow_reaches_cli_started_dask_workers(cluster, tmp_path, kind):
    wfdir = tmp_path / "wf"
    wfdir.mkdir()
    (wfdir / "replica_hooks.py").write_text(HOOKS)
    wf = wfdir / ("wf.py" if kind == "py" else "wf.yaml")
    wf.write_text(PY if kind == "py" else YAML)
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the workers' sys.path has no wf/ either
    out = subprocess.run([sys.executable, "-m", "shoal", "run", str(wf), "--dask", cluster.address,
                          "--workers", "1", "--journal", str(tmp_path / "run.db")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]  # was: No module named 'replica_hooks'
    from shoal.ensemble import RunStatus, TaskState

    status = RunStatus.load(str(tmp_path / "run.db"))
    assert status.counts[TaskState.DONE] == (5 if kind == "py" else 1) and status.finished
