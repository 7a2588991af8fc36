"""The large matrices (``-m txstream_heavy``, run by .ci/run): every app x scheduler x worker
count x skew x abort rate x multi-partition ratio equals serial; many more Hypothesis streams;
a long event file in bounded driver memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from test_txstream import _tables, streams
from txs_helpers import SCHEDULERS, assert_same, run

import shoal
from shoal.workloads import txstream as ts
from shoal.workloads.txstream.apps import APPS, gs

pytestmark = pytest.mark.txstream_heavy


@pytest.fixture(scope="module", params=[1, 2], ids=lambda w: f"{w}w")
def pilot(request):
    with shoal.Pilot(request.param) as p:
        yield p


@pytest.mark.parametrize("name", sorted(APPS))
@pytest.mark.parametrize("theta", [0.0, 0.75, 1.5])
@pytest.mark.parametrize("abort", [0.0, 0.4])
@pytest.mark.parametrize("mp", [0.0, 1.0])
def test_matrix_equals_serial(pilot, name, theta, abort, mp):
    app = APPS[name]
    evs = app.events(1000, 200, theta=theta, abort=abort, multi_partition=mp, seed=int(theta * 10))
    ref = run(app.tables(200), evs, "serial")
    for sched in SCHEDULERS:
        assert_same(run(app.tables(200), evs, sched, pilot, punctuation=256), ref,
                    f"{name} {sched} theta={theta} abort={abort} mp={mp} {pilot.workers}w")


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(2) as p:
        yield p


@pytest.mark.timeout(900)  # the whole Hypothesis run, not one example
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams(), sched=hs.sampled_from(SCHEDULERS))
def test_many_random_streams(pilot2, stream, sched):
    evs, punct = stream
    assert_same(run(_tables(), evs, sched, pilot2, punctuation=punct),
                run(_tables(), evs, "serial"), str(sched))


def _peak(path, n_keys) -> int:
    store = ts.Store(gs.tables(n_keys))
    tracemalloc.start()
    rep = ts.Engine(store, scheduler="serial", punctuation=2048, keep_outputs=False).run(
        ts.read_events(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    store.close()
    assert len(rep.outputs) == 0 and rep.events > 0
    return peak


def test_long_file_in_bounded_driver_memory(tmp_path):
    small, big = tmp_path / "small.msgpack", tmp_path / "big.msgpack"
    ts.write_events(small, gs.events(20_000, 500, seed=1))
    ts.write_events(big, (e for i in range(10) for e in gs.events(20_000, 500, seed=i)))
    p_small, p_big = _peak(small, 500), _peak(big, 500)
    assert p_big < 1.5 * p_small + (1 << 20), (p_small, p_big)  # 10x the events, same memory
    assert np.isfinite(p_big)
