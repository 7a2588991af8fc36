"""The across-hosts runner (shoal/workloads/txstream/hosts.py) on a local pilot: key groups
exchanged in waves through the driver, no shared memory between tasks.  Everything here is
asked for with ``across_hosts=True``; on a pilot whose workers are on other hosts the engine
picks it itself (tests/multihost/test_multihost_txstream.py, on scripts/testbed's hosts).

Each run is compared with the serial oracle; a worker killed inside a wave (the loss of a
host, seen from the driver) is re-run; one lost every time fails the batch, naming it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from test_txstream import BAD, _ok, _tables, streams
from txs_helpers import assert_same, run

import shoal
from shoal.workloads import txstream as ts
from shoal.workloads.txstream import hosts
from shoal.workloads.txstream.apps import APPS

EAGER = ts.TPG("op", "structured", "eager")


@pytest.fixture(scope="module", params=[1, 3], ids=lambda w: f"{w}w")
def pilot(request):
    with shoal.Pilot(request.param) as p:
        yield p


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(2) as p:
        yield p


@pytest.fixture(scope="module")
def pilot3():
    with shoal.Pilot(3) as p:
        yield p


def test_key_groups_follow_the_index_within_each_table():
    layout = {"accounts": (0, 5), "assets": (5, 5), "t": (10, 2)}
    assert hosts.key_groups(layout, 3).tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 0, 1, 0, 1]
    assert hosts.key_groups(layout, 1).tolist() == [0] * 12


@pytest.mark.parametrize("name", sorted(APPS))
@pytest.mark.parametrize("theta,abort", [(0.0, 0.0), (1.2, 0.3)])
def test_every_app_equals_serial(pilot, name, theta, abort):
    app = APPS[name]
    evs = app.events(240, 32, theta=theta, abort=abort, seed=11)
    ref = run(app.tables(32), evs, "serial")
    for sched in ("adaptive", EAGER):
        got = run(app.tables(32), evs, sched, pilot, punctuation=60, across_hosts=True)
        assert_same(got, ref, f"{name} {sched} {pilot.workers}w across hosts")
        assert {b.decisions for b in got[1].batches} == {hosts.DECISIONS}
        assert all(b.waves >= 1 for b in got[1].batches)


def _guard_fails_then_raises(txn, ev):
    txn.update("a", 0, lambda v: v + 1, guard=lambda v: v < ev["limit"])
    txn.update("a", 1, lambda v: v + 1 if v < ev["limit"] else 1 // 0)


def test_an_update_after_a_failed_guard_never_runs(pilot):
    """Serial order: a guard that fails aborts the transaction before its later updates run,
    so their errors are never seen.  Regression: the later update's key was in another group,
    ran in the same wave and reported its ZeroDivisionError (on_error='stop': the run
    stopped where serial goes on)."""
    evs = [ts.Event(_guard_fails_then_raises, {"limit": 2})] * 6
    ref = run({"a": np.zeros(2, np.int64)}, evs, "serial")
    assert ref[1].aborted == {2, 3, 4, 5} and not ref[1].errors
    got = run({"a": np.zeros(2, np.int64)}, evs, "adaptive", pilot, punctuation=6,
              across_hosts=True)
    assert_same(got, ref, "a failed guard, then an update that raises")


_calls = {"n": 0}


def _declares_another_key_each_call(txn, ev):
    _calls["n"] += 1
    txn.update("a", _calls["n"] % 2, lambda v: v + 1)


def test_processes_that_record_other_transactions_are_refused():
    """An event fn with state of its own declares other keys in another process: the groups'
    operation numbers would name other operations.  The groups' digests of what they recorded
    differ: a ValueError saying what the fn must do, never a silently wrong store."""
    layout = {"a": (0, 2)}
    blob = ts.txn.dumps_events([ts.Event(_declares_another_key_each_call, {})] * 3)
    base = np.zeros(2, np.int64)
    results = []
    for g in range(2):
        hosts._PLANS.clear()  # as if each group ran in a process of its own
        results.append(hosts.wave_task(hosts.Wave("r", 0, g, 2, layout), (blob, base), None))
    with pytest.raises(ValueError, match=r"batch 0: key groups \[\[0\], \[1\]\] recorded "
                       "different transactions.*same accesses every time"):
        hosts.same_plans(results, 0)
    hosts.same_plans(results[:1] * 2, 0)  # the same record: accepted


def _random_streams_equal_serial(pilot2, stream):
    evs, punct = stream
    ref = run(_tables(), evs, "serial")
    got = run(_tables(), evs, "adaptive", pilot2, punctuation=punct, across_hosts=True)
    assert_same(got, ref, "across hosts")


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams())
def test_random_streams_equal_serial(pilot2, stream):
    """Random streams across key groups equal the serial executor (a few examples here;
    ``-m txstream_heavy`` runs 25)."""
    _random_streams_equal_serial(pilot2, stream)


@pytest.mark.txstream_heavy
@pytest.mark.timeout(900)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams())
def test_random_streams_equal_serial_heavy(pilot2, stream):
    _random_streams_equal_serial(pilot2, stream)


def _adds(d, limit):
    return lambda v, *r: v + d + sum(r) % 7 if v <= limit else 1 // 0


def _at_least(gmin):
    return lambda v, *r: v + sum(r) >= gmin


def _guards_and_errors(txn, ev):
    """ev: [(key, delta, guard min or None, the value above which the update raises, reads)]."""
    for key, d, gmin, limit, reads in ev:
        txn.update("t", key, _adds(d, limit), guard=None if gmin is None else _at_least(gmin),
                   reads=[("t", r) for r in reads])


@hs.composite
def failing_streams(draw):
    """Transactions of 1-4 updates over 9 keys (3 per group of 3), guards that may fail,
    updates that raise past a limit: the order of a transaction's failures matters."""
    op = hs.tuples(hs.integers(0, 8), hs.integers(-30, 30),
                   hs.one_of(hs.none(), hs.integers(-50, 150)), hs.integers(0, 400),
                   hs.lists(hs.integers(0, 8), max_size=2))
    txns = draw(hs.lists(hs.lists(op, min_size=1, max_size=4), min_size=1, max_size=60))
    return [ts.Event(_guards_and_errors, t) for t in txns], draw(hs.sampled_from([1, 5, 60]))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=failing_streams())
def test_guards_and_errors_across_groups_equal_serial(pilot3, stream):
    """Which failure of a transaction counts (a guard: an abort; an error: report.errors) is
    decided in declaration order, also when the updates are in different groups that run in
    the same wave."""
    evs, punct = stream
    tables = {"t": np.arange(9, dtype=np.int64) * 20}
    ref = run(tables, evs, "serial", on_error="abort")
    got = run(tables, evs, "adaptive", pilot3, punctuation=punct, on_error="abort",
              across_hosts=True)
    assert_same(got, ref, "guards and errors across groups")
    assert dict(got[1].errors) == dict(ref[1].errors)


@pytest.mark.parametrize("fn,ev,msg", BAD, ids=[b[2].split()[0] for b in BAD])
def test_bad_transactions(pilot2, fn, ev, msg):
    evs = [ts.Event(_ok, {})] * 3 + [ts.Event(fn, ev)] + [ts.Event(_ok, {})] * 3
    snap, rep = run({"a": np.zeros(3, np.int64)}, evs, "adaptive", pilot2, punctuation=2,
                    on_error="abort", across_hosts=True)
    assert rep.aborted == {3} and msg in rep.errors[3] and snap["a"][0] == 6
    store = ts.Store({"a": np.zeros(3, np.int64)})
    try:
        with pytest.raises(ts.TxnError, match=f"event 3: .*{msg}"):
            ts.Engine(store, pilot=pilot2, punctuation=2, across_hosts=True).run(evs)
        assert store.snapshot()["a"][0] == 2  # as of the last punctuation
    finally:
        store.close()


def test_schedulers_of_one_host_are_refused_across_hosts(pilot2):
    store = ts.Store({"a": np.zeros(3, np.int64)})
    try:
        for sched in ("2pl", "partitioned"):
            with pytest.raises(ValueError, match=f"'{sched}' locks in one host's shared memory"):
                ts.Engine(store, pilot=pilot2, scheduler=sched, across_hosts=True)
        for sched in (ts.TPG("op", "structured", "lazy"), ts.TPG("chain", "structured", "lazy")):
            with pytest.raises(ValueError, match="eager abort"):
                ts.Engine(store, pilot=pilot2, scheduler=sched, across_hosts=True)
        with pytest.raises(TypeError, match="across_hosts must be True, False or None"):
            ts.Engine(store, pilot=pilot2, across_hosts="yes")
        assert not ts.Engine(store, pilot=pilot2).across_hosts  # a local pilot: one host
    finally:
        store.close()


def _exit_once(path):
    """An update that kills its worker process the first time any worker runs it."""
    def fn(v):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return v + 1
        os._exit(3)
    return fn


def _dies_once(txn, ev):
    txn.update("a", 1, _exit_once(ev["marker"]))


def _dies_always(txn, ev):
    txn.update("a", 1, lambda v: os._exit(3))


def test_a_worker_lost_in_a_wave_is_submitted_again_and_the_run_equals_serial(tmp_path):
    """The worker running a key group dies inside a transaction (what a crashed host looks
    like to the driver: WorkerLost): waves keep no state in workers, so the group's task is
    submitted again and the run's result is the serial order's."""
    evs = [ts.Event(_ok, {})] * 6 + [ts.Event(_dies_once, {"marker": str(tmp_path / "m")})]
    evs += [ts.Event(_ok, {})] * 5
    with shoal.Pilot(2) as pilot:
        got = run({"a": np.zeros(3, np.int64)}, evs, "adaptive", pilot, punctuation=4,
                  across_hosts=True)
    assert (tmp_path / "m").exists()  # it did die once
    ref = run({"a": np.zeros(3, np.int64)}, evs, "serial")
    assert_same(got, ref, "a worker lost once")
    assert got[0]["a"].tolist() == [11, 1, 0]


def test_a_group_lost_every_time_fails_the_batch_naming_it():
    evs = [ts.Event(_ok, {})] * 6 + [ts.Event(_dies_always, {})] + [ts.Event(_ok, {})]
    store = ts.Store({"a": np.zeros(3, np.int64)})
    try:
        with shoal.Pilot(2) as pilot:
            with pytest.raises(hosts.HostLost, match=r"batch 1: tasks lost with their host "
                               rf"{hosts.HOST_RETRIES + 1} times .*last punctuation"):
                ts.Engine(store, pilot=pilot, punctuation=4, across_hosts=True).run(evs)
        assert store.snapshot()["a"].tolist() == [4, 0, 0]  # batch 0 only
    finally:
        store.close()


def _slow(txn, ev):
    txn.update("a", 0, lambda v: ts.spin(ev["us"]) or v + 1)


def test_a_wave_that_does_not_end_fails_naming_its_groups(pilot2):
    store = ts.Store({"a": np.zeros(3, np.int64)})
    try:
        with pytest.raises(TimeoutError, match=r"batch 0, wave 1: key groups \[0\] did not "
                           r"finish within stall_timeout=0.5 s"):
            ts.Engine(store, pilot=pilot2, stall_timeout=0.5, across_hosts=True).run(
                [ts.Event(_slow, {"us": 3e6})])
        assert store.snapshot()["a"].tolist() == [0, 0, 0]
    finally:
        store.close()


def test_checkpoint_resume_across_hosts_is_exactly_once(pilot2, tmp_path):
    """A run stopped by a failing transaction, then resumed from its checkpoint with the
    failure gone: the final store and outputs are one uninterrupted run's."""
    app = APPS["sl"]
    evs = app.events(200, 16, theta=0.9, abort=0.2, seed=4)
    ref = run(app.tables(16), evs, "serial")
    broken = list(evs)
    broken[130] = ts.Event(BAD[3][0], {})
    store = ts.Store(app.tables(16))
    try:
        ckpt = str(tmp_path / "ckpt")
        with pytest.raises(ts.TxnError, match="event 130"):
            ts.Engine(store, pilot=pilot2, punctuation=50, checkpoint=ckpt,
                      across_hosts=True).run(broken)
        rep = ts.Engine(store, pilot=pilot2, punctuation=50, checkpoint=ckpt,
                        across_hosts=True).run(evs)
        assert rep.events == 100  # batches 0..2 were committed by the first run
        assert_same((store.snapshot(), rep), ref, "resumed across hosts")
    finally:
        store.close()


def test_event_functions_a_worker_cannot_import_are_named_with_the_host(pilot2, tmp_path,
                                                                        monkeypatch):
    """A module on the driver's path only (as one on the driver's host only would be): the
    wave task names the host, the module and what to do, instead of pickle's bare error."""
    import importlib
    import socket

    (tmp_path / "driver_only_txns.py").write_text(
        "def bump(txn, ev):\n    txn.update('a', 0, lambda v: v + 1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("driver_only_txns")
    store = ts.Store({"a": np.zeros(2, np.int64)})
    try:
        with pytest.raises(hosts.EventsUnavailable,
                           match=rf"batch 0: its events do not unpickle on host "
                                 rf"'{socket.gethostname()}': ModuleNotFoundError.*driver_only_txns"
                                 r".*importable on every host"):
            ts.Engine(store, pilot=pilot2, across_hosts=True).run([ts.Event(mod.bump, {})])
        assert store.snapshot()["a"].tolist() == [0, 0]
    finally:
        store.close()
