"""Prose stays true: every file path and ``shoal.*`` name the docs mention exists.

Scanned: README.md, docs/*.md, every *.md inside shoal/, and the module docstring of
every shoal/**/*.py.  A path is a token such as ``shoal/runtime/worker.py``,
``tests/runtime/test_pilot.py`` or ``docs/guide.md`` (relative to the repository
root); a name is a dotted ``shoal.x.y`` in backticks, which must import or be an
attribute of what imports.  Paths under build outputs or made by a run (run.db,
run.json) are not checked.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATH_RE = re.compile(
    r"(?<![\w./-])((?:shoal|tests|examples|benchmarks|docs|scripts)/[\w./-]*[\w/])")
NAME_RE = re.compile(r"`(shoal(?:\.\w+)+)")


def _texts():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                *sorted((ROOT / "shoal").rglob("*.md"))]:
        yield doc.relative_to(ROOT).as_posix(), doc.read_text()
    for mod in sorted((ROOT / "shoal").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(mod.read_text()))
        if doc:
            yield mod.relative_to(ROOT).as_posix(), doc


def _exists(token: str) -> bool:
    token = token.rstrip(".")
    if "*" in token or "{" in token:
        return True
    if (ROOT / token).exists():
        return True
    # a path with a pytest node id or line suffix: tests/x.py::test_y, shoal/x.py:12
    return (ROOT / token.split("::")[0].split(":")[0]).exists()


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


CASES = list(_texts())


@pytest.mark.parametrize("where,text", CASES, ids=[c[0] for c in CASES])
def test_mentioned_paths_and_names_exist(where, text):
    missing = sorted({t for t in PATH_RE.findall(text) if not _exists(t)})
    unresolved = sorted({n for n in NAME_RE.findall(text) if not _resolves(n)})
    assert not missing, f"{where} mentions paths that do not exist: {missing}"
    assert not unresolved, f"{where} mentions names that do not resolve: {unresolved}"


# Development history in names and prose: aliases of the development rounds that wrote code,
# "issue N's <ordinal> round", "(the <ordinal> round)", and test files named after rounds or
# fixes.  Code and tests say what they do; history lives in git log.
HISTORY_RE = re.compile(
    r"\br-(?:break|ens|fix|nq|dask|local|pool)\w*"
    r"|\bissue \d+'s (?:\w+ )?round\b"
    r"|\((?:the )?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|\d+(?:st|nd|rd|th))"
    r" round\)",
    re.IGNORECASE)
HISTORY_FILE_RE = re.compile(r"(?:_break\d+|_fix\d+|ensfix)\.py$")
SCANNED = ("README.md", "docs", "shoal", "tests", "examples", "benchmarks", "scripts", ".ci")
SUFFIXES = {".py", ".c", ".md", ".txt", ".yaml", ".yml", ".toml", ".rst", ".sh", ""}


def _repository_texts():
    for top in SCANNED:
        base = ROOT / top
        paths = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix in SUFFIXES and "_build" not in path.parts \
                    and "__pycache__" not in path.parts:
                try:
                    yield path.relative_to(ROOT).as_posix(), path.read_text()
                except UnicodeDecodeError:
                    continue


def test_no_development_history_in_names_or_prose():
    this = Path(__file__).relative_to(ROOT).as_posix()
    found = [f"{where}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for where, text in _repository_texts() if where != this
             for m in HISTORY_RE.finditer(text)]
    named = [where for where, _ in _repository_texts() if HISTORY_FILE_RE.search(where)]
    assert not named, f"files named after development rounds: {named}"
    assert not found, "development history instead of behaviour (say what the code does):\n" \
        + "\n".join(found[:40])


RATIO_RE = re.compile(r"(?<![\w.])\d+(\.\d+)?(-\d+(\.\d+)?)?x\b(?![-\w])")


def _comments_and_docstrings(text: str):
    """(line, text) of every comment and docstring (a string standing as a statement)."""
    prev = None
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and (
                prev is None or prev.type in (tokenize.INDENT, tokenize.DEDENT,
                                              tokenize.NEWLINE, tokenize.NL))):
            yield tok.start[0], tok.string
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            prev = tok


def test_no_measured_ratios_in_code_prose():
    """A ratio like "1.16-1.19x" in a comment or docstring goes stale the first time the
    code or the machine changes: the figures live in docs/benchmarks.md ("Measurements
    behind design choices"), the docstring says which choice won and why."""
    found = []
    for path in sorted((ROOT / "shoal").rglob("*.py")):
        text = path.read_text()
        for line, prose in _comments_and_docstrings(text):
            for m in RATIO_RE.finditer(prose):
                found.append(f"{path.relative_to(ROOT)}:{line + prose.count(chr(10), 0, m.start())}: "
                             f"{m.group(0)}")
    assert not found, "measured ratios in code prose (move them to docs/benchmarks.md):\n" \
        + "\n".join(found[:40])
