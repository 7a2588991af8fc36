"""The docs' code runs: every ```python block of the pages in ``DOCS`` (README.md, the guide,
the dashboard, dl, search, all-pairs and runtime pages) is a program (the one runner for
every doc: add a doc to ``DOCS``; docs/ensemble.md's and docs/txstream.md's programs run in
their own areas' tests).

A ``print(...)  # expected`` comment is checked against what the block prints (the
whole comment, e.g. ``# 3 True``).
Blocks without ``if __name__ == "__main__"`` are skipped (fragments).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "docs/guide.md", "docs/dashboard.md", "docs/dl.md", "docs/search.md",
        "docs/all_pairs.md", "docs/runtime.md"]


def _blocks():
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc)).read()
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
            if '__name__ == "__main__"' in block:
                yield pytest.param(block, id=f"{doc}#{i}")


@pytest.mark.parametrize("code", list(_blocks()))
def test_doc_block_runs(code, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for expected in re.findall(r"print\(.*\)\s+#\s*(.+)", code):
        assert expected.strip() in out.stdout, f"expected {expected.strip()!r} in output:\n{out.stdout}"


def test_examples_demo_runs():
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--queens", "9"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "352 solutions" in out.stdout and "speed-up" in out.stdout
