"""Issue 11, items 1, 2, 8 (and issue 12, item 1): the task graph's one walk and its settles.

* Futures nested at any depth inside list/tuple/dict values/set/frozenset are found,
  collected and substituted by the same walk (``shoal.runtime.graph``), so every such
  submit settles, on the local backend and on a dask LocalCluster (Hypothesis generates
  the structures; before, depth 4 hung and depth 5+ failed).
* A failed chain of 1,000 dependent links settles every link (before, the error was
  passed down by nested done-callbacks and 600+ links hung).
* Leaving ``with`` waits for tasks still waiting on their inputs (before, they got
  PilotClosed).
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import rt_tasks as t
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shoal
from shoal.runtime import graph


class Slot:
    """A placeholder for the k-th future in a generated structure (hashable)."""

    def __init__(self, k):
        self.k = k

    def __repr__(self):
        return f"Slot({self.k})"


_leaf = st.one_of(st.integers(-5, 5), st.text(max_size=2), st.builds(Slot, st.integers(0, 3)))
_hashable = st.recursive(_leaf, lambda c: st.tuples(c, c) | st.frozensets(c, max_size=3),
                         max_leaves=6)
_any = st.recursive(
    _leaf | _hashable,
    lambda c: (st.lists(c, max_size=3) | st.tuples(c, c) | st.tuples(c)
               | st.dictionaries(st.text(max_size=2), c, max_size=3)
               | st.sets(_hashable, max_size=3) | st.frozensets(_hashable, max_size=3)),
    max_leaves=12)
# also deep, narrow chains: [[[[[[slot]]]]]] and friends
_deep = st.integers(1, 40).flatmap(
    lambda d: st.builds(lambda leaf, kinds: _nest(leaf, kinds), _leaf,
                        st.lists(st.sampled_from("ltdsf"), min_size=d, max_size=d)))


def _nest(leaf, kinds):
    x = leaf
    for k in kinds:
        if k == "s" or k == "f":
            x = (set if k == "s" else frozenset)([(x,)]) if _hashable_ok(x) else [x]
        else:
            x = {"l": lambda v: [v], "t": lambda v: (v,), "d": lambda v: {"k": v}}[k](x)
    return x


def _hashable_ok(x):
    try:
        hash(x)
        return True
    except TypeError:
        return False


def _fill(shape, leaf):
    """``shape`` with every Slot replaced by ``leaf(slot)`` (a plain recursive rebuild)."""
    if isinstance(shape, Slot):
        return leaf(shape)
    if type(shape) in (list, tuple, set, frozenset):
        return type(shape)(_fill(x, leaf) for x in shape)
    if type(shape) is dict:
        return {k: _fill(v, leaf) for k, v in shape.items()}
    return shape


def _slots(shape) -> set:
    if isinstance(shape, Slot):
        return {shape.k}
    if type(shape) in (list, tuple, set, frozenset):
        return set().union(*(_slots(x) for x in shape)) if shape else set()
    if type(shape) is dict:
        return set().union(*(_slots(x) for x in shape.values())) if shape else set()
    return set()


def _check(pilot, shape):
    futs = [pilot.submit(t.inc, 10 * k) for k in range(4)]
    arg = _fill(shape, lambda s: futs[s.k])
    want = _fill(shape, lambda s: 10 * s.k + 1)
    used = _slots(shape)
    # detection, collection and substitution agree
    assert graph.has_futures(arg) == bool(used)
    assert {id(f) for f in graph.collect_futures(arg)} == {id(futs[k]) for k in used}
    assert graph.substitute(arg, lambda f: 10 * futs.index(f) + 1) == want
    # and the submit settles, with the values in place
    assert pilot.submit(t.ident, arg).result(timeout=60) == want
    args, kwargs = pilot.submit(t.ident_kw, arg, key=arg).result(timeout=60)
    assert args == (want,) and kwargs == {"key": want}


@pytest.fixture(scope="module")
def local_pilot():
    with shoal.Pilot(2) as p:
        yield p


_settings = settings(max_examples=40, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


@_settings
@given(shape=_any | _deep)
def test_nested_futures_settle_local(local_pilot, shape):
    _check(local_pilot, shape)


def test_four_deep_settles(local_pilot):
    """The issue's reproducer: depth 4 hung, 5+ failed."""
    f = local_pilot.submit(t.inc, 1)
    for depth in range(1, 12):
        x = f
        for _ in range(depth):
            x = [x]
        got = local_pilot.submit(t.ident, x).result(timeout=30)
        for _ in range(depth):
            got = got[0]
        assert got == 2


def test_cycles_and_shared_containers(local_pilot):
    f = local_pilot.submit(t.inc, 1)
    cyclic = [f]
    cyclic.append(cyclic)
    assert graph.has_futures(cyclic) and graph.collect_futures(cyclic) == [f]
    got = local_pilot.submit(t.ident, cyclic).result(timeout=30)
    assert got[0] == 2 and got[1] is got
    # a DAG: the same sub-list 40 times over 40 levels is walked once per container
    shared = [f]
    for _ in range(40):
        shared = [shared, shared]
    assert graph.collect_futures(shared) == [f]
    assert not graph.has_futures([[1, 2], {"a": (3, frozenset({4}))}])


def test_opaque_objects_are_not_walked(local_pilot):
    """Documented: subclasses and objects are opaque; a Future there is not a dependency
    and fails to pickle (a clear error, not a hang)."""
    import collections

    f = local_pilot.submit(t.inc, 1)
    pair = collections.namedtuple("pair", "a b")(f, 1)
    assert not graph.has_futures(pair) and not graph.has_futures({f: 1})
    with pytest.raises(shoal.SerializationError, match="Future cannot be pickled"):
        local_pilot.submit(t.ident, {f: 1}).result(timeout=30)


def test_failed_chain_settles_every_link(local_pilot):
    first = local_pilot.submit(t.boom, "root")
    links = [first]
    for _ in range(1500):
        links.append(local_pilot.submit(t.inc, links[-1]))
    done, not_done = cf.wait(links, timeout=60)
    assert not not_done, f"{len(not_done)} links never settled"
    assert all(isinstance(f.exception(), ValueError) for f in links)


def test_close_waits_for_dependents():
    for _ in range(5):
        with shoal.Pilot(2) as p:
            a = p.submit(t.sleep, 0.25)
            b = p.submit(t.inc, a)
            c = p.submit(t.inc, b)
            d = p.submit(t.add, c, b=[b, {"x": (a,)}][0])
        assert (b.result(0), c.result(0), d.result(0)) == (1.25, 2.25, 3.5)


def test_cancel_pending_cancels_dependents(tmp_path):
    with pytest.raises(KeyError), shoal.Pilot(2) as p:
        a = p.submit(t.wait_for, str(tmp_path / "never"))  # (a 0.5 s sleep could end first)
        b = p.submit(t.inc, a)
        raise KeyError("leave the block by an error")
    assert b.cancelled()


# -- the same walk on the dask backend (LocalCluster) -----------------------------------


@pytest.fixture(scope="module")
def dask_pilot():
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as p:
            p.submit(t.ident, [p.submit(t.inc, 1)]).result(timeout=60)  # node runtime up now
            yield p


@pytest.mark.fd_slack(16)
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shape=_any | _deep)
def test_nested_futures_settle_dask(dask_pilot, shape):
    _check(dask_pilot, shape)
