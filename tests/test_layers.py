"""Enforce ARCHITECTURE.md's import direction with an AST scan of every module under shoal/.

Layers, bottom to top: leaf modules (``shoal/_*.py``), ``queues``, ``runtime``,
``backends``, ``pilot``, ``patterns``/``workloads``, ``dashboard`` (beside them:
the pilot starts it, handing it the backend), ``cli``.  Every import
statement anywhere in a file (also inside functions and ``if TYPE_CHECKING``)
counts; relative imports are resolved.  ``from shoal import X`` is an import
of module ``shoal.X`` when that module exists, else of the public package
``shoal`` itself, which re-exports the upper layers.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "shoal"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
UPPER = ("shoal.backends", "shoal.pilot", "shoal.patterns", "shoal.workloads", "shoal.cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or base.is_dir()


def imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules ``source`` (the text of ``module``) imports."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level > len(parts):
                    raise ValueError(f"{module}: relative import beyond the top package")
                base_parts = parts[: len(parts) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            submodules = {f"{base}.{alias.name}" for alias in node.names if alias.name != "*"}
            shoal_submodules = {name for name in submodules if _is_module(name)}
            found.update(shoal_submodules)
            if not shoal_submodules or len(shoal_submodules) < len(submodules):
                found.add(base)  # names imported from the module itself
    return found


def _within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _is_leaf(name: str) -> bool:
    """``shoal/_x.py`` (not ``__main__``/``__init__``)."""
    parts = name.split(".")
    return len(parts) == 2 and parts[0] == "shoal" and parts[1][:1] == "_" != parts[1][1:2]


def _is_root(name: str) -> bool:
    return name == "shoal"


# (layer, may this layer import shoal module ``name``?, the rule in words); first match wins.
RULES = [
    (
        "shoal.queues",
        lambda n: _within(n, "shoal.queues") or _is_leaf(n),
        "queues import only shoal.queues and leaf modules",
    ),
    (
        "shoal.runtime",
        lambda n: not _is_root(n) and not _within(n, *UPPER),
        "runtime never imports the public package, backends, pilot, patterns, workloads, cli",
    ),
    (
        "shoal.backends",
        lambda n: not _is_root(n) and not _within(n, *UPPER[1:]),
        "backends never import the public package, pilot, patterns, workloads, cli",
    ),
    (
        "shoal.pilot",
        lambda n: not _within(n, *UPPER[2:]),
        "pilot never imports patterns, workloads, cli",
    ),
    (
        "shoal.patterns",
        lambda n: _is_root(n) or _within(n, "shoal.patterns"),
        "patterns import only the public package shoal and shoal.patterns",
    ),
    (
        "shoal.dashboard",
        lambda n: _within(n, "shoal.dashboard", "shoal.runtime", "shoal.patterns.ensemble") or _is_leaf(n),
        "the dashboard imports only itself, runtime, the ensemble journal and leaf modules "
        "(a pilot's backend is handed to it, never imported)",
    ),
    (
        "shoal.integrations",
        lambda n: _is_root(n) or _within(n, "shoal.integrations"),
        "integrations import only the public package shoal and shoal.integrations",
    ),
    (
        "shoal.workloads",
        lambda n: _is_root(n) or _within(n, "shoal.patterns", "shoal.workloads"),
        "workloads import only the public package shoal, shoal.patterns and shoal.workloads",
    ),
]


def violations(module: str, imported: set[str]) -> list[str]:
    """The imports ``module`` may not make, each with the rule it breaks."""
    if _is_leaf(module):
        return [
            f"{name} (leaf modules import only the stdlib and other leaf modules)"
            for name in sorted(imported)
            if name.split(".")[0] not in STDLIB and not _is_leaf(name)
        ]
    for layer, allowed, rule in RULES:
        if _within(module, layer):
            return [
                f"{name} ({rule})"
                for name in sorted(imported)
                if _within(name, "shoal") and not allowed(name)
            ]
    return []  # shoal/__init__.py, __main__.py, cli.py: top of the stack


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_import_direction(path):
    module = module_name(path)
    imported = imports_of(path.read_text(), module, path.name == "__init__.py")
    assert violations(module, imported) == []


# -- the checker checks what it should ------------------------------------------
@pytest.mark.parametrize(
    "module, is_package, source, expected",
    [
        ("shoal.runtime.worker", False, "from ..queues import ring", {"shoal.queues.ring"}),
        ("shoal.runtime", True, "from . import policy", {"shoal.runtime.policy"}),
        ("shoal.runtime.worker", False, "from .. import _errors", {"shoal._errors"}),
        ("shoal.runtime.worker", False, "from . import Nope", {"shoal.runtime"}),
        ("shoal.patterns.x", False, "from shoal import Pilot", {"shoal"}),
        ("shoal.patterns.x", False, "import shoal.runtime.topology", {"shoal.runtime.topology"}),
        ("shoal.cli", False, "def f():\n    import shoal.backends", {"shoal.backends"}),
        ("shoal.queues", True, "from ._impl import NATIVE", {"shoal.queues._impl"}),
        ("shoal.queues.ring", False, "from . import _impl", {"shoal.queues._impl"}),
    ],
)
def test_resolver(module, is_package, source, expected):
    assert imports_of(source, module, is_package) == expected


@pytest.mark.parametrize(
    "module, imported, ok",
    [
        ("shoal._errors", {"os", "__future__"}, True),
        ("shoal._errors", {"psutil"}, False),
        ("shoal._errors", {"shoal.queues"}, False),
        ("shoal.queues.ring", {"shoal.queues._impl", "shoal._errors", "struct"}, True),
        ("shoal.queues.ring", {"shoal.runtime.wire"}, False),
        ("shoal.queues.ring", {"shoal"}, False),
        ("shoal.runtime.worker", {"shoal.queues", "shoal.runtime.policy", "msgpack"}, True),
        ("shoal.runtime.worker", {"shoal.backends.local"}, False),
        ("shoal.runtime.api", {"shoal.pilot"}, False),
        ("shoal.backends.local", {"shoal.runtime.api", "shoal.queues"}, True),
        ("shoal.backends.local", {"shoal.patterns"}, False),
        ("shoal.patterns.ensemble", {"shoal", "shoal.patterns.base"}, True),
        ("shoal.patterns.ensemble", {"shoal.runtime.future"}, False),
        ("shoal.patterns.ensemble", {"shoal.backends.local"}, False),
        ("shoal.workloads.dl", {"shoal", "shoal.patterns"}, True),
        ("shoal.workloads.dl", {"shoal.queues"}, False),
        ("shoal.cli", {"shoal.backends", "shoal.runtime.topology"}, True),
        ("shoal.__main__", {"shoal.cli"}, True),
        ("shoal.pilot", {"shoal.backends.local", "shoal.runtime.api"}, True),
        ("shoal.pilot", {"shoal.patterns"}, False),
        ("shoal.pilot", {"shoal.dashboard"}, True),
        ("shoal.dashboard.sources", {"shoal.runtime.progress", "starlette"}, True),
        ("shoal.dashboard.journal", {"shoal.patterns.ensemble.journal"}, True),
        ("shoal.dashboard.app", {"shoal.backends.local"}, False),
        ("shoal.dashboard.app", {"shoal"}, False),
    ],
)
def test_rules(module, imported, ok):
    assert (violations(module, imported) == []) is ok
