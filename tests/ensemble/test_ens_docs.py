"""docs/ensemble.md's programs and the examples/ensemble_*.py programs run and print what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from ens_tasks import ROOT, run_py

DOC = ROOT / "docs" / "ensemble.md"


def _blocks():
    text = DOC.read_text()
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
        if '__name__ == "__main__"' in block:
            yield pytest.param(block, id=f"ensemble.md#{i}")


def _check(out, code):
    assert out.returncode == 0, out.stderr[-3000:]
    for expected in re.findall(r"print\(.*\)\s+#\s*(.+)$", code, re.M):
        assert expected.strip() in out.stdout, f"expected {expected!r} in:\n{out.stdout}"


@pytest.mark.parametrize("code", list(_blocks()))
def test_doc_block(code, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(code)
    _check(run_py(str(script), cwd=tmp_path), code)


@pytest.mark.parametrize("name", ["ensemble_pipelines.py", "ensemble_sal.py", "ensemble_replica_exchange.py",
                                  "ensemble_pipeline_of_ensembles.py"])
def test_example(name, tmp_path):
    path = ROOT / "examples" / name
    _check(run_py(str(path), cwd=tmp_path), path.read_text())


def test_workflow_file_through_cli(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "shoal", "run", str(ROOT / "examples" / "ensemble_workflow.py"),
                          "--journal", str(tmp_path / "run.db")], capture_output=True, text=True, env=env,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "17 done, 0 failed" in out.stdout
    assert (tmp_path / "run.sandbox/p0/summary/cat/stdout").read_text().split() == [str(i) for i in range(8)]
    again = subprocess.run([sys.executable, "-m", "shoal", "run", str(ROOT / "examples" / "ensemble_workflow.py"),
                            "--journal", str(tmp_path / "run.db")], capture_output=True, text=True, env=env,
                           timeout=120, cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr


def test_cli_errors(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    bad = tmp_path / "wf.py"
    bad.write_text("x = 1\n")
    out = subprocess.run([sys.executable, "-m", "shoal", "run", str(bad)], capture_output=True, text=True,
                         env=env, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and "defines no 'workflow'" in out.stderr
    out = subprocess.run([sys.executable, "-m", "shoal", "status", str(tmp_path / "nope.db")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "no journal" in out.stderr
