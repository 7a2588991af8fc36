"""Transactional streams on the 3 hosts of scripts/testbed (``ts.Engine`` across hosts,
shoal/workloads/txstream/hosts.py): every run is compared with the serial oracle applying the
transactions in stream order, and after the pilot closes no host holds anything new."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from testbed_helpers import ROOT, testbed, wait_until  # noqa: F401 - fixture

import shoal

sys.path.insert(0, os.path.join(ROOT, "tests", "txstream"))
from txs_helpers import assert_same, run  # noqa: E402

from shoal.workloads import txstream as ts  # noqa: E402
from shoal.workloads.txstream.apps import APPS  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.no_leak_check]


@pytest.fixture
def no_leftovers(testbed):  # noqa: F811
    """The hosts' /dev/shm and /tmp and shoal processes now; after the test: nothing new."""
    testbed.ensure_up()
    before = testbed.snapshot()
    yield testbed
    testbed.assert_clean(before)


@pytest.fixture
def pilot(no_leftovers):
    with shoal.Pilot(backend="dask", address=no_leftovers.dask, workers=1) as p:
        yield p


def test_txstream_engine_on_a_multi_host_pilot(pilot):
    """Before: the store and the batch area were the driver's shared memory and the claim
    files in its /tmp, so a task on another host was refused.  Now the engine finds the hosts
    itself and runs key groups in waves; the result is the serial order's."""
    app = APPS[sorted(APPS)[0]]
    evs = app.events(60, 12, theta=1.0, abort=0.2, seed=21)
    ref = run(app.tables(12), evs, "serial")
    got = run(app.tables(12), evs, "adaptive", pilot, punctuation=20)
    assert_same(got, ref, "txstream across hosts")
    assert {b.decisions for b in got[1].batches} == {"op/waves/eager"}


@pytest.mark.parametrize("name", sorted(APPS))
def test_every_app_across_hosts_equals_serial(pilot, name):
    """Each app, skewed and with aborts, on the 3 hosts: equal to serial; the key groups ran on
    two hosts or more."""
    app = APPS[name]
    evs = app.events(240, 40, theta=0.75, abort=0.1, seed=5)
    ref = run(app.tables(40), evs, "serial")
    got = run(app.tables(40), evs, ts.TPG("op", "nonstructured", "eager"), pilot, punctuation=80,
              on_error="abort")
    assert_same(got, ref, f"{name} across hosts")
    hosts = {h for b in got[1].batches for h in b.hosts}
    assert len(hosts) >= 2 and hosts <= {"h1", "h2", "h3"}, hosts


def test_schedulers_that_need_one_host_are_refused_naming_the_way_out(pilot):
    store = ts.Store(APPS["sl"].tables(8))
    try:
        with pytest.raises(ValueError, match="'2pl' locks in one host's shared memory.*adaptive"):
            ts.Engine(store, pilot=pilot, scheduler="2pl")
        with pytest.raises(ValueError, match="eager abort"):
            ts.Engine(store, pilot=pilot, scheduler=ts.TPG("op", "structured", "lazy"))
    finally:
        store.close()


def test_a_host_crashed_mid_stream_the_run_completes_equal_to_serial(no_leftovers, tmp_path):
    """h2 is SIGKILLed (its processes, /tmp and /dev/shm gone) while a checkpointed stream
    runs.  No host holds state between waves, so a group task lost with h2 is submitted
    again (dask re-runs it elsewhere at once; a second loss comes back as WorkerLost and the
    engine submits it itself): the run completes, store, outputs and aborts equal to serial,
    and the batches after the crash ran on the two hosts left."""
    bed = no_leftovers
    app = APPS["gs"]
    evs = app.events(600, 64, theta=0.5, abort=0.1, complexity=400.0, seed=9)
    ref = run(app.tables(64), evs, "serial")
    store = ts.Store(app.tables(64))
    box: dict = {}
    try:
        with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
            engine = ts.Engine(store, pilot=pilot, punctuation=100, stall_timeout=120,
                               checkpoint=str(tmp_path / "ckpt"))
            assert engine.across_hosts

            def go():
                try:
                    box["report"] = engine.run(evs)
                except BaseException as exc:  # noqa: BLE001 - the test reports it
                    box["error"] = exc

            th = threading.Thread(target=go)
            th.start()
            wait_until(lambda: engine.last is not None or not th.is_alive(), 300,
                       "the first batch to commit")
            assert "error" not in box, box.get("error")
            assert th.is_alive(), "the stream ended before the crash: make it longer"
            bed.verb("crash", "h2")
            th.join(600)
            assert not th.is_alive(), "the run hangs after a host crashed"
            assert "error" not in box, box.get("error")
            got = (store.snapshot(), box["report"])
            assert_same(got, ref, "a host crashed mid-stream")
            assert all("h2" not in b.hosts for b in got[1].batches[-2:]), got[1].batches
            print("\n[txstream crash] waves per batch:", [b.waves for b in got[1].batches],
                  "hosts:", [b.hosts for b in got[1].batches], flush=True)
    finally:
        store.close()
        bed.repair()
