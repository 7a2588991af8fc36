"""dask graphs on shoal: ``scheduler=pilot`` (Executor protocol) and ``scheduler=pilot.get`` (the
whole graph as one shoal task graph), checked against dask's own synchronous scheduler."""

from __future__ import annotations

import int_tasks as it
import pytest

import shoal

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
db = pytest.importorskip("dask.bag")
from dask import delayed  # noqa: E402


@pytest.fixture(scope="module")
def pilot():
    with shoal.Pilot(2) as p:
        yield p


@pytest.fixture(autouse=True)
def leak_check():
    yield


def _graph():
    xs = [delayed(it.inc)(i) for i in range(300)]
    pairs = [delayed(it.add)(a, b) for a, b in zip(xs[::2], xs[1::2], strict=True)]
    return delayed(sum)(pairs), xs[7]


@pytest.mark.parametrize("how", ["executor", "get"])
def test_delayed_graph_matches_the_sync_scheduler(pilot, how):
    scheduler = pilot if how == "executor" else pilot.get
    expected = dask.compute(*_graph(), scheduler="sync")
    assert dask.compute(*_graph(), scheduler=scheduler) == expected


# dask's own advice about its chunking of the reshape (the graph is the test's, not shoal's)
@pytest.mark.filterwarnings("ignore::dask.array.core.PerformanceWarning")
def test_array_and_bag(pilot):
    x = da.arange(10_000, chunks=1_000).reshape(100, 100)
    expr = (x + x.T).sum(axis=0)
    assert (expr.compute(scheduler=pilot.get) == expr.compute(scheduler="sync")).all()
    bag = db.from_sequence(range(1000), npartitions=8).map(it.inc).filter(lambda v: v % 3 == 0)
    assert bag.sum().compute(scheduler=pilot.get) == bag.sum().compute(scheduler="sync")


def test_error_propagates_with_remote_traceback(pilot):
    bad = delayed(it.boom)(delayed(it.inc)(1))
    after = delayed(it.inc)(bad)
    with pytest.raises(ValueError, match="boom 2") as info:
        dask.compute(after, scheduler=pilot.get)
    assert isinstance(info.value.__cause__, shoal.RemoteTraceback)
    assert pilot.submit(it.inc, 1).result(30) == 2


def test_raw_graph_and_nested_keys(pilot):
    dsk = {"x": 1, "y": (it.inc, "x"), "z": (it.add, "y", "x"), "w": (sum, ["x", "y", "z"])}
    assert pilot.get(dsk, "w") == 1 + 2 + 3
    assert pilot.get(dsk, ["z", ["x", "y"]]) == (3, (1, 2))
    with pytest.raises(KeyError, match="nope"):
        pilot.get(dsk, "nope")


def test_intermediate_results_stay_on_the_workers(pilot):
    """``pilot.get`` on the local backend: a result that only other nodes need never
    crosses the driver.  The intermediates here refuse to be unpickled in the driver's
    process, and the driver receives a handful of messages for a 511-node graph."""
    import os

    me = os.getpid()
    level = [delayed(it.make_refusing)(i, me) for i in range(256)]
    while len(level) > 1:  # a tree of reductions: inner nodes need each other's results
        level = [delayed(it.combine_refusing)(a, b) for a, b in zip(level[::2], level[1::2], strict=True)]
    total = delayed(it.unwrap)(level[0])
    before = pilot.stats()["driver"]["messages_in"]
    assert dask.compute(total, scheduler=pilot.get) == (sum(range(256)),)
    received = pilot.stats()["driver"]["messages_in"] - before
    assert received < 20, f"the driver received {received} messages for a 511-node graph"
    with pytest.raises(shoal.UnpicklingError, match="reached the driver"):  # the check works
        dask.compute(level[0], scheduler=pilot.get)


from dask.utils_test import GetFunctionTestMixin  # noqa: E402


class TestGetFunctionSpec(GetFunctionTestMixin):
    """dask's own tests of a ``get`` function (``dask.utils_test``), through ``pilot.get``.

    ``test_get_stack_limit`` walks a 10,000-node chain with done-callbacks: it hung in 6
    runs of 9 while a worker's SIGURG handler could settle a future inside
    ``add_done_callback`` (tests/runtime/test_signal_safety.py)."""

    @pytest.fixture(autouse=True)
    def _on_the_pilot(self, pilot):
        self.get = pilot.get

    @pytest.mark.slow
    def test_get_stack_limit(self):
        """The 10,000-node chain (a minute under load on 2 cores): .ci/run runs it."""
        super().test_get_stack_limit()
