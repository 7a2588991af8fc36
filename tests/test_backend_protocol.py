"""Every backend implements ``shoal.runtime.api.Backend`` completely, with the protocol's
signatures, and the Pilot reaches its backend only through that protocol.

Checked statically on the classes (no cluster needed): each method of the protocol
exists with the same parameter names, kinds and defaults; each property is a property;
each data member is a class attribute or is assigned as ``self.<name>`` in the class.
A live LocalBackend (and a live DaskBackend in tests/dask/test_dask_resources.py) passes
``isinstance`` against the runtime-checkable protocols.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

import shoal
from shoal.backends.dask import DaskBackend
from shoal.backends.local import LocalBackend
from shoal.runtime import api
from shoal.runtime.shared import LocalShared

BACKENDS = {api.BackendKind.LOCAL: LocalBackend, api.BackendKind.DASK: DaskBackend}


def _members(proto) -> tuple[dict, set[str], set[str]]:
    """(methods name -> function, property names, data member names) of a Protocol."""
    methods, props = {}, set()
    for name, value in vars(proto).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            props.add(name)
        elif inspect.isfunction(value):
            methods[name] = value
    data = {n for n in proto.__annotations__ if not n.startswith("_")}
    return methods, props, data


def _shape(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _assigned(cls) -> set[str]:
    """Names assigned as ``self.<name> = ...`` anywhere in ``cls``'s own source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_every_backend_kind_has_a_backend():
    assert set(BACKENDS) == set(api.BackendKind)
    for kind, cls in BACKENDS.items():
        assert cls.kind == kind.value


@pytest.mark.parametrize("kind", list(BACKENDS), ids=lambda k: k.value)
def test_backend_implements_the_protocol(kind):
    cls = BACKENDS[kind]
    methods, props, data = _members(api.Backend)
    assert {"submit", "map", "stats", "close", "cancel_pending", "cancel_children",
            "force_cancel"} <= set(methods)
    assert {"nodes"} <= props and {"n", "topology", "closing", "closed", "broken", "shared",
                                   "kind"} <= data
    for name, proto_fn in methods.items():
        impl = getattr(cls, name, None)
        assert callable(impl), f"{cls.__name__} has no {name}()"
        assert _shape(impl) == _shape(proto_fn), f"{cls.__name__}.{name} differs from the protocol"
    for name in props:
        assert isinstance(inspect.getattr_static(cls, name, None), property), \
            f"{cls.__name__}.{name} is not a property"
    assigned = _assigned(cls)
    for name in data:
        assert name in vars(cls) or name in assigned, f"{cls.__name__} never sets {name}"


@pytest.mark.parametrize("factory", [LocalShared, type(None)], ids=["LocalShared", "CellHub"])
def test_shared_factories_implement_the_sub_protocol(factory):
    from shoal.backends.dask.cells import CellHub

    cls = CellHub if factory is type(None) else factory
    methods, _, _ = _members(api.SharedFactory)
    assert set(methods) == {"node_array", "best_cell", "channel"}
    for name, proto_fn in methods.items():
        assert _shape(getattr(cls, name)) == _shape(proto_fn), f"{cls.__name__}.{name}"


def test_live_local_backend_is_a_backend():
    with shoal.Pilot(1) as pilot:
        assert isinstance(pilot.shared, api.SharedFactory)
        assert pilot.nodes == 1
        arr = shoal.SharedArray.per_node(pilot, 3, "int64", fill=7)
        assert arr.array.tolist() == [7, 7, 7]
        arr.close()
    # the backend itself, through the runtime-checkable protocol
    backend = LocalBackend(1)
    try:
        assert isinstance(backend, api.Backend)
    finally:
        backend.close()


def test_local_backend_refuses_resources_clearly():
    with shoal.Pilot(1) as pilot:
        opts = pilot.options(resources={"GPU": 1})
        with pytest.raises(ValueError, match="local backend has no worker resources"):
            opts.submit(abs, -1)
        with pytest.raises(ValueError, match="local backend has no worker resources"):
            opts.map(abs, [1, 2])
        assert pilot.submit(abs, -2).result(30) == 2  # the pilot goes on


@pytest.mark.parametrize("bad, culprit", [
    ({}, "non-empty mapping"), ([("GPU", 1)], "mapping"), ({"GPU": 0}, "'GPU'"),
    ({"GPU": -1}, "'GPU'"), ({"GPU": float("nan")}, "'GPU'"), ({"GPU": True}, "'GPU'"),
    ({"": 1}, "non-empty strings"), ({1: 1}, "non-empty strings"), ({"GPU": "1"}, "'GPU'"),
])
def test_options_validate_resources(bad, culprit):
    with pytest.raises(ValueError, match=culprit):
        api.check_options(0, None, bad)
