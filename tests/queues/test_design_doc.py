"""DESIGN.md stays true: every API name it mentions in backticks exists."""
from __future__ import annotations

import os
import re

import pytest

import shoal.queues as queues
from shoal.queues import _impl

QUEUES_DIR = os.path.dirname(queues.__file__)
DOC = os.path.join(QUEUES_DIR, "DESIGN.md")
REPO = os.path.dirname(os.path.dirname(QUEUES_DIR))

_TICKED = re.compile(r"`([^`\n]+)`")
_API = re.compile(r"^(_native\.)?([A-Z][A-Za-z]+(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\(\))?$")
_FILE = re.compile(r"^[\w/.-]+\.(?:py|c|md)$")
_ENV = re.compile(r"^(SHOAL_[A-Z_]+)(=\S+)?$")


def _ticked() -> list[str]:
    with open(DOC, encoding="utf-8") as fh:
        text = fh.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks are diagrams
    return _TICKED.findall(text)


def _resolve(root, dotted: str):
    """Follow attributes; a class's annotated instance attributes count as existing."""
    obj = root
    for part in dotted.split("."):
        if isinstance(obj, type) and part in getattr(obj, "__annotations__", {}):
            return None
        obj = getattr(obj, part)
    return obj


def test_doc_mentions_the_api():
    names = _ticked()
    for expected in ["Ring.push", "Ring.pop", "Doorbell.park", "Doorbell.ring", "Segment.create", "EMPTY"]:
        assert expected in names


def test_api_names_exist():
    checked = 0
    for name in _ticked():
        m = _API.match(name)
        if not m or "." not in name and not hasattr(queues, m.group(2)):
            continue
        native_prefix, dotted = m.group(1), m.group(2)
        if native_prefix:
            if not _impl.NATIVE_AVAILABLE:
                continue
            root = _impl._native
        else:
            root = queues
        try:
            _resolve(root, dotted)
        except AttributeError:
            pytest.fail(f"DESIGN.md mentions `{name}`, which does not exist")
        checked += 1
    assert checked >= 15


def test_files_and_env_vars_exist():
    sources = ""
    for fn in os.listdir(QUEUES_DIR):
        if fn.endswith((".py", ".c")):
            with open(os.path.join(QUEUES_DIR, fn), encoding="utf-8") as fh:
                sources += fh.read()
    for name in _ticked():
        if _FILE.match(name):
            here = os.path.join(QUEUES_DIR, name)
            assert os.path.exists(here) or os.path.exists(os.path.join(REPO, name)), name
        elif m := _ENV.match(name):
            assert m.group(1) in sources, name
