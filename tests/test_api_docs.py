"""The API reference (docs/api) builds without a warning, lists every public name of the
modules it documents, and the examples in their docstrings run.

The modules are the ``.. automodule::`` directives of docs/api/*.rst; a module's public
names are its ``__all__`` (or the directive's ``:members:``), less its ``:exclude-members:``
(names documented on another page).  A docstring example is a ``::`` literal block: a
diagram (box-drawing characters) is skipped, every other block must compile, and a block
that names nothing it does not define or import is a whole program and runs in a fresh
interpreter in a temporary folder; the others are sketches over names the prose
introduces (``pilot``, ``fn``, ``X``), compiled only.  scripts/build-api-docs (run by
.ci/run) builds the same pages and runs Sphinx's doctest builder over them.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
DIAGRAM = re.compile("[\u2500-\u257f\u25b2\u25ba\u25bc]")  # box drawing, ▲ ► ▼


def _directives():
    """(module, members or None, excluded) for each ``.. automodule::`` of docs/api."""
    for page in sorted(API.glob("*.rst")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\.\. automodule:: (\S+)", line)
            if not m:
                continue
            options = {}
            for opt in lines[i + 1:]:
                o = re.match(r"\s+:([\w-]+):\s*(.*)", opt)
                if not o:
                    break
                options[o.group(1)] = [n.strip() for n in o.group(2).split(",") if n.strip()]
            yield m.group(1), options.get("members"), set(options.get("exclude-members", ()))


DIRECTIVES = list(_directives())


def _public(module_name, members, excluded):
    module = importlib.import_module(module_name)
    names = members if members else list(getattr(module, "__all__", ()))
    return module, [n for n in names if n not in excluded
                    and not inspect.ismodule(getattr(module, n))]


def _literal_blocks(doc: str):
    """The ``::`` literal blocks of a docstring, dedented."""
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            indent = len(line) - len(line.lstrip())
            j, block = i + 1, []
            while j < len(lines) and (not lines[j].strip()
                                      or len(lines[j]) - len(lines[j].lstrip()) > indent):
                block.append(lines[j])
                j += 1
            text = textwrap.dedent("\n".join(block)).strip("\n")
            if text:
                yield text
            i = j
        else:
            i += 1


def _docstrings(module, names):
    yield module.__name__, inspect.getdoc(module) or ""
    for name in names:
        obj = getattr(module, name)
        yield f"{module.__name__}.{name}", inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if not attr.startswith("_"):
                    doc = getattr(value, "__doc__", None)
                    if isinstance(doc, str):
                        yield f"{module.__name__}.{name}.{attr}", inspect.cleandoc(doc)


def _examples():
    seen = set()
    for module_name, members, excluded in DIRECTIVES:
        module, names = _public(module_name, members, excluded)
        for where, doc in _docstrings(module, names):
            for k, block in enumerate(_literal_blocks(doc)):
                if block not in seen and not DIAGRAM.search(block):
                    seen.add(block)
                    yield pytest.param(block, id=f"{where}#{k}")


def _free_names(tree: ast.AST) -> set[str]:
    bound, loaded = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded - bound


EXAMPLES = list(_examples())


def test_the_reference_documents_modules_with_examples():
    modules = {m for m, _, _ in DIRECTIVES}
    assert {"shoal", "shoal.ensemble", "shoal.entk", "shoal.workloads.dl"} <= modules
    programs = [p.id for p in EXAMPLES if not _free_names(ast.parse(p.values[0]))]
    # The ensemble's and EnTK's module examples are whole programs: they must stay so.
    assert any(i.startswith("shoal.ensemble#") for i in programs), programs
    assert any(i.startswith("shoal.entk#") for i in programs), programs


@pytest.mark.parametrize("code", EXAMPLES)
def test_docstring_example_compiles_and_whole_programs_run(code, tmp_path):
    tree = ast.parse(code)  # a SyntaxError names the example's line
    if _free_names(tree):
        return  # a sketch over names its prose introduces: compiling it is the check
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]


def test_api_reference_builds_without_warnings_and_lists_every_public_name(tmp_path):
    pytest.importorskip("sphinx", reason="the API reference needs Sphinx: pip install -e '.[dev]'")
    out = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(API), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, f"sphinx-build failed:\n{out.stderr[-5000:]}"
    html = "".join(p.read_text() for p in (tmp_path / "html").glob("*.html"))
    missing = []
    for module_name, members, excluded in DIRECTIVES:
        _, names = _public(module_name, members, excluded)
        missing += [f"{module_name}.{n}" for n in names if f'id="{module_name}.{n}"' not in html]
    assert not missing, f"public names the API reference does not document: {missing}"
