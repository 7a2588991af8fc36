"""Enforce docs/architecture.md's import direction with an AST scan of every module under shoal/.

Layers, bottom to top: leaf modules (``shoal/_*.py``: they import only the stdlib and
other leaves, so any layer may use them: patterns too, e.g. ``shoal._room``), ``queues``, ``runtime``,
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
    """A module or package of the tree, also a C extension (its ``.c`` source or built ``.so``)."""
    base = ROOT.joinpath(*dotted.split("."))
    return (base.with_suffix(".py").exists() or base.is_dir() or base.with_suffix(".c").exists()
            or any(base.parent.glob(base.name + ".*.so")))


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
        lambda n: _is_root(n) or _within(n, "shoal.patterns") or _is_leaf(n),
        "patterns import only the public package shoal, shoal.patterns and leaf modules "
        "(stdlib-only utilities such as shoal._room, shared with the runtime)",
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
        lambda n: _is_root(n) or _within(n, "shoal.patterns", "shoal.workloads") or _is_leaf(n),
        "workloads import only the public package shoal, shoal.patterns, shoal.workloads and "
        "leaf modules (stdlib-only utilities such as shoal._durable, the checkpoint files)",
    ),
]


# Known imports across the rules, each with its reason; remove an entry when its import goes.
# Keyed by (importing module, imported module).
IMPORTS_ALLOWED = {
    ("shoal.integrations.joblib", "shoal.runtime.wire"): "joblib's memmapping reducers must "
        "apply when a batch is pickled, so the backend pickles batches with the runtime's "
        "serializer (wire.cloud_dumps with extra reducers)",
    ("shoal.patterns.ensemble.nodes", "shoal.runtime.allocation"): "the node sizes of a SLURM "
        "allocation come from the same nodelist parser the provider uses (expand_nodelist)",
}


def violations(module: str, imported: set[str]) -> list[str]:
    """The imports ``module`` may not make, each with the rule it breaks."""
    imported = {name for name in imported if (module, name) not in IMPORTS_ALLOWED}
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
        ("shoal.patterns.search.room", {"shoal._room"}, True),  # a leaf: stdlib only
        ("shoal.patterns.search.room", {"shoal.runtime.worker"}, False),
        ("shoal._room", {"types", "shoal._errors"}, True),
        ("shoal._room", {"shoal.runtime"}, False),  # a leaf that is not a leaf
        ("shoal._room", {"shoal"}, False),
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


# -- no import cycles inside a package ---------------------------------------------------
#
# Within each package listed here no module imports another that (directly or through others)
# imports it back, counting every import statement (also inside functions): a function-level
# import that closes a cycle still couples the two modules both ways, and hides it from the
# reader of the module's header.  A submodule importing its own package (``from . import x``
# for a name the ``__init__`` defines) counts as importing the package's ``__init__``.

ACYCLIC_PACKAGES = ("shoal.patterns.ensemble",)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself),
    each sorted; Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1 or node in graph[node]:
                        cycles.append(sorted(comp))
    return sorted(cycles)


def package_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` (itself included) it imports."""
    folder = ROOT.joinpath(*package.split("."))
    graph = {}
    for path in sorted(folder.glob("*.py")):
        module = module_name(path)
        graph[module] = {name for name in imports_of(path.read_text(), module, path.name == "__init__.py")
                         if _within(name, package) and name != module}
    return graph


@pytest.mark.parametrize("package", ACYCLIC_PACKAGES)
def test_no_import_cycles(package):
    graph = package_graph(package)
    described = [" -> ".join(c) + f" (each imports: {', '.join(f'{m}: {sorted(graph[m] & set(c))}' for m in c)})"
                 for c in import_cycles(graph)]
    assert described == []


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b", "x"}, "b": {"c"}, "c": set(), "d": {"e"}, "e": {"d"}}, [["d", "e"]]),
        ({"a": {"a"}}, [["a"]]),
    ],
)
def test_cycle_finder(graph, expected):
    assert import_cycles(graph) == expected


def test_function_level_import_counts():
    source = "def f():\n    from .yamlfile import _Loader\n"
    assert "shoal.patterns.ensemble.yamlfile" in imports_of(source, "shoal.patterns.ensemble.resource", False)


# -- no reaching into another module's private attributes --------------------------------
#
# ``x._name`` (or ``getattr(x, "_name")``) where ``x`` is not ``self``/``cls`` is allowed only
# in a module that defines ``_name`` itself (a ``def``/``class``, a ``self._name = ...``, a
# class attribute or ``__slots__`` entry, a module global): the owner.  Private names that
# no shoal module defines (a third-party object's) are not judged here.  ``from M import
# _name`` is allowed only between modules of the same package.  An AST heuristic: it goes
# by names, not types, so two modules defining the same private name own it both.


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_definitions(source: str) -> set[str]:
    """The private names a module defines (and so owns)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                            and sub.value.id in ("self", "cls")):
                        found.add(sub.attr)
                    elif isinstance(sub, ast.Name):
                        found.add(sub.id)
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets) and isinstance(
                    node.value, (ast.Tuple, ast.List)):
                found.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        elif isinstance(node, ast.alias) and node.asname:
            found.add(node.asname)  # ``import x as _x``: a private alias of this module
    return {n for n in found if isinstance(n, str) and _private(n)}


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def private_reaches(source: str, module: str, is_package: bool,
                    owners: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(private name, where)`` for each access to a private name another module owns."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = obj = None
        if isinstance(node, ast.Attribute):
            name, obj = node.attr, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            name, obj = node.args[1].value, node.args[0]
        elif isinstance(node, ast.ImportFrom):
            base = next(iter(imports_of(ast.unparse(node), module, is_package) or {""}))
            if not _within(base, "shoal"):
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if not _private(alias.name) or (_is_module(target) and not _private(alias.name)):
                    continue
                home = _package_of(target, False) if _is_module(target) else _package_of(
                    base, ROOT.joinpath(*base.split(".")).is_dir())
                if home != _package_of(module, is_package):
                    found.append((alias.name, f"line {node.lineno}: from {base} import {alias.name}"))
            continue
        if name is None or not _private(name):
            continue
        if isinstance(obj, ast.Name) and obj.id in ("self", "cls"):
            continue
        if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "super":
            continue
        owned_by = owners.get(name, set())
        if owned_by and module not in owned_by:
            found.append((name, f"line {node.lineno}: {ast.unparse(node)[:70]} "
                                f"(owner: {', '.join(sorted(owned_by))})"))
    return found


# Known reaches, each with its reason; remove an entry when its access goes.  Keyed by
# (module or package prefix, private name).
PRIVATE_ALLOWED = {
    ("shoal.backends", "_canceller"): "Future's backend hooks (runtime/future.py): the executor "
        "side of a concurrent.futures.Future, set per future on the submit hot path",
    ("shoal.backends", "_prober"): "the same Future hook (RUNNING on demand)",
    ("shoal.backends", "_state"): "the stdlib Future's state, read by the executor side as "
        "CPython's own executors do; in backends/dask/backend.py also distributed.Future's "
        "state, the only place its cancel reason is kept",
    ("shoal.backends", "_condition"): "the stdlib Future's condition (force-cancel of a "
        "RUNNING future, which Future.cancel refuses)",
    ("shoal.runtime.worker", "_canceller"): "Future's hook, worker-local futures",
    ("shoal.runtime.worker", "_prober"): "the same hook: is a worker-local future's task out "
        "on loan (then cancel() says False)",
    ("shoal.runtime.worker", "_state"): "the stdlib Future's state, worker-local futures",
    ("shoal.runtime.loans", "_state"): "the same worker-local futures, read by the loan book "
        "when it decides whether a lost loan must run again",
    ("shoal.backends.local", "_ring_offsets"): "the ring layout the local backend hands its "
        "workers; queues/matrix.py to expose it (s-submit's files)",
    ("shoal.patterns", "_limits"): "the search checkpoint reads the engine's limits "
        "(patterns/search, s-search's files)",
    ("shoal.integrations", "_context"): "the joblib backend finds the innermost pilot through "
        "shoal's private context alias (s-submit's files)",
    ("shoal.integrations", "_backend"): "the joblib backend asks whether a pilot it was given "
        "can still take work in this process (closing, or a fork's parent's pilot)",
    ("shoal.integrations", "_closed_reason"): "the same check: the backend's own words for why "
        "it is closed, in the one-line PilotClosed",
    ("shoal.patterns.ensemble", "_shell"): "EnTK's tasks run through a shell: the flag is set by "
        "the EnTK Task (entk_model.py) and read by the launcher and engine; shoal's own Task "
        "keeps argv semantics and has no public shell option",
    ("shoal.patterns.ensemble", "_name_rule"): "which naming rule (shoal's or EnTK's) a model "
        "object follows, read when names become journal keys (identity.Names)",
    ("shoal.patterns.ensemble", "_entk"): "an Input made from EnTK's staging directives keeps "
        "the directive's name for error messages (walker.py)",
    ("shoal.patterns.ensemble", "_placeholder"): "the same Input keeps its unresolved EnTK "
        "reference (model.py sets it with object.__setattr__ on the frozen Input; the walker "
        "resolves it when the run reaches the task)",
}


def _allowed(module: str, name: str) -> bool:
    return any(_within(module, prefix) and name == n for prefix, n in PRIVATE_ALLOWED)


def _owners() -> dict[str, set[str]]:
    owners: dict[str, set[str]] = {}
    for path in _modules():
        for name in private_definitions(path.read_text()):
            owners.setdefault(name, set()).add(module_name(path))
    return owners


_OWNERS = _owners()


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_reach_through(path):
    module = module_name(path)
    found = private_reaches(path.read_text(), module, path.name == "__init__.py", _OWNERS)
    assert [where for name, where in found if not _allowed(module, name)] == []


@pytest.mark.parametrize(
    "module, source, bad",
    [
        ("shoal.runtime.shared", "getattr(pilot, '_backend', None)", ["_backend"]),
        ("shoal.runtime.context", "def f(pilot):\n    return pilot._backend", ["_backend"]),
        ("shoal.pilot", "def f(o):\n    return o._backend", []),  # the owner
        ("shoal.runtime.shared", "def f(self):\n    return self._backend", []),
        ("shoal.runtime.shared", "def f(x):\n    return x._not_a_shoal_name", []),
        ("shoal.backends.dask.backend", "from ..local import _check_options", ["_check_options"]),
        ("shoal.backends.dask.backend", "from .node import _enter", []),  # same package
        ("shoal.backends.dask.backend", "from ...runtime.api import check_options", []),
        ("shoal.patterns.x", "from shoal import _context", ["_context"]),
    ],
)
def test_private_rule(module, source, bad):
    owners = {"_backend": {"shoal.pilot"}, "_check_options": {"shoal.backends.local"},
              "_enter": {"shoal.backends.dask.node"}, "_context": {"shoal"}}
    assert [name for name, _ in private_reaches(source, module, False, owners)] == bad


# ---------------------------------------------------------------------------
# the search package: no two of its modules import each other, directly or round a cycle
# ---------------------------------------------------------------------------

SEARCH = "shoal.patterns.search"


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports), each once, as the
    modules round it (first = the smallest name); an empty list when there are none."""
    cycles: set[tuple[str, ...]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                ring = path[path.index(nxt):]
                k = ring.index(min(ring))
                cycles.add(tuple(ring[k:] + ring[:k]))
            else:
                walk(nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, [start])
    return [list(c) for c in sorted(cycles)]


def search_import_graph() -> dict[str, set[str]]:
    """Module of the search package -> the package's modules it imports anywhere in its
    text (also inside functions: a lazy import is a cycle deferred, not a cycle gone)."""
    folder = ROOT.joinpath(*SEARCH.split("."))
    graph = {}
    for path in sorted(folder.glob("*.py")):
        module = module_name(path)
        found = imports_of(path.read_text(), module, path.name == "__init__.py")
        graph[module] = {m for m in found if m.startswith(SEARCH + ".") and m != module}
    return graph


def test_the_search_package_has_no_import_cycle():
    graph = search_import_graph()
    assert len(graph) > 5  # (the scan found the package)
    assert package_cycles(graph) == []


def test_cycles_are_found_also_through_function_level_imports():
    # (absolute names: a relative one resolves only to modules that exist under shoal/)
    src = {"a": "import x.pkg.b\n", "b": "def f():\n    import x.pkg.c\n", "c": "import x.pkg.a\n"}
    graph = {f"x.pkg.{m}": {n for n in imports_of(s, f"x.pkg.{m}", False)
                            if n.startswith("x.pkg.")} for m, s in src.items()}
    assert package_cycles(graph) == [["x.pkg.a", "x.pkg.b", "x.pkg.c"]]
    assert package_cycles({"a": {"b"}, "b": set()}) == []
