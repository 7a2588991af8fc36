"""examples/dask_cluster.py runs and prints what its comments say."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dask_example_runs():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH")] if p)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "dask_cluster.py")],
                         capture_output=True, text=True, timeout=110, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[:3] == ["196418", "7998000", "10000000000"]
