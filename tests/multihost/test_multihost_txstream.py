"""Transactional streams on the 3 hosts of scripts/testbed (``ts.Engine`` across hosts,
shoal/workloads/txstream/hosts.py): every run is compared with the serial oracle applying the
transactions in stream order, and after the pilot closes no host holds anything new."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import numpy as np
import pytest
from testbed_helpers import ROOT, testbed, wait_until  # noqa: F401 - fixture

import shoal

sys.path.insert(0, os.path.join(ROOT, "tests", "txstream"))
from txs_helpers import assert_same, run  # noqa: E402

from shoal.workloads import txstream as ts  # noqa: E402
from shoal.workloads.txstream.apps import APPS  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.no_leak_check, pytest.mark.timeout(400)]


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


def _run_in_thread(engine, evs) -> tuple:
    """``engine.run(evs)`` in a thread; the box gets its report or its error."""
    box: dict = {}

    def go():
        try:
            box["report"] = engine.run(evs)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            box["error"] = exc

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th, box


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
    try:
        with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
            engine = ts.Engine(store, pilot=pilot, punctuation=100, stall_timeout=120,
                               checkpoint=str(tmp_path / "ckpt"))
            assert engine.across_hosts
            th, box = _run_in_thread(engine, evs)
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


# -- a host lost while it runs a group's wave: deterministic, through marker files -----------


def _stalls(folder: str, times: int, d: int):
    """An update that stalls the first ``times`` times it runs, once per host at most
    (markers ``stall0``.. in ``folder``, which every host sees, hold the host's name): the
    test crashes or cuts off that host while it is inside a wave."""
    def fn(v):
        if socket.gethostname() in _marked(folder):
            return v + d  # one stall per host (a host may run several groups at once)
        for i in range(times):
            try:
                fd = os.open(os.path.join(folder, f"stall{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.write(fd, socket.gethostname().encode())
            os.close(fd)
            time.sleep(40)
            break
        return v + d
    return fn


def _stalling_add(txn, ev):
    txn.update("t", ev["k"], _stalls(ev["folder"], ev["times"], ev["d"]))
    txn.update("t", (ev["k"] + 1) % ev["n"], lambda v: v * 3 % 1000 + ev["d"])


def _stalling_stream(folder: str, times: int, n: int = 9) -> list:
    return [ts.Event(_stalling_add, {"k": i % n, "n": n, "d": i, "folder": folder, "times": times})
            for i in range(90)]


def _marked(folder: str) -> list:
    """The hosts stalled so far, in order."""
    out = []
    for i in range(9):
        try:
            with open(os.path.join(folder, f"stall{i}")) as f:
                host = f.read()
        except FileNotFoundError:
            break
        if not host:
            break  # being written
        out.append(host)
    return out


def test_two_hosts_crashed_inside_waves_the_run_completes_on_the_third(no_leftovers):
    """A wave task stalls on its host, which is crashed (SIGKILL: processes, /tmp, /dev/shm
    gone); dask re-runs it on another host, where a task stalls again, and that host is
    crashed too.  No host holds state between waves: a task lost once is re-run by dask, one
    lost twice comes back as WorkerLost and the engine submits it again itself.  The run
    completes on the host left, equal to serial."""
    bed = no_leftovers
    folder = bed.shared_dir("txstream-crash")
    evs = _stalling_stream(folder, times=2)
    tables = {"t": np.arange(9, dtype=np.int64)}
    ref = run(tables, _stalling_stream(folder, times=0), "serial")  # no stall in the driver
    store = ts.Store(tables)
    try:
        with shoal.Pilot(backend="dask", address=bed.dask, workers=1) as pilot:
            engine = ts.Engine(store, pilot=pilot, punctuation=30, stall_timeout=240)
            th, box = _run_in_thread(engine, evs)
            victims = []
            for k in (1, 2):
                wait_until(lambda k=k: len(_marked(folder)) >= k or box, 120,
                           f"wave task {k} to stall on a host")
                assert "error" not in box, box
                victims.append(_marked(folder)[k - 1])
                bed.verb("crash", victims[-1])  # the next stall is on another host
            assert len(set(victims)) == 2, victims
            th.join(300)
            assert not th.is_alive(), "the run hangs after two hosts crashed"
            assert "error" not in box, box.get("error")
            got = (store.snapshot(), box["report"])
            assert_same(got, ref, "two hosts crashed inside waves")
            left = {"h1", "h2", "h3"} - set(victims)
            assert set(got[1].batches[-1].hosts) == left, [b.hosts for b in got[1].batches]
    finally:
        store.close()
        bed.repair()


def test_a_host_cut_off_inside_a_wave_the_run_completes_equal_to_serial(no_leftovers):
    """The host running a stalled wave task loses its link: nothing resets, the pilot
    removes the silent dask worker after ``silent_after_s`` and dask re-runs the task on
    another host; the cut-off host's late answer (if any) is never merged.  Equal to serial."""
    bed = no_leftovers
    folder = bed.shared_dir("txstream-partition")
    evs = _stalling_stream(folder, times=1)
    tables = {"t": np.arange(9, dtype=np.int64)}
    ref = run(tables, _stalling_stream(folder, times=0), "serial")
    store = ts.Store(tables)
    try:
        with shoal.Pilot(backend="dask", address=bed.dask, workers=1,
                         silent_after_s=5.0) as pilot:
            engine = ts.Engine(store, pilot=pilot, punctuation=30, stall_timeout=240)
            th, box = _run_in_thread(engine, evs)
            cut = wait_until(lambda: _marked(folder) or box, 120, "a wave to stall on a host")
            assert isinstance(cut, list), box
            t0 = time.monotonic()
            bed.verb("partition", cut[0])
            th.join(300)
            print(f"\n[txstream partition] {cut[0]} cut off -> run done in "
                  f"{time.monotonic() - t0:.1f} s", flush=True)
            assert not th.is_alive(), "the run hangs after a host was cut off"
            assert "error" not in box, box.get("error")
            assert_same((store.snapshot(), box["report"]), ref, "a host cut off inside a wave")
            bed.verb("heal", cut[0])  # fenced: the scheduler forgot its worker, which then stops
            wait_until(lambda: not bed.processes_named(cut[0], "distributed.cli.dask_worker"),
                       120, f"{cut[0]}'s fenced dask worker to shut itself down")
    finally:
        store.close()
        bed.repair()
