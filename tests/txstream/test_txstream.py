"""Transactional streams: every scheduler equals the serial oracle, and the oracle equals a
plain loop written per app; the TPG's edges on hand-made batches; bad input; stats; files.

Real components: worker processes of a local pilot (1 and 2 workers), the store and batch
state in shared memory, partition claims through the file system.  The dask backend is in
tests/dask/test_dask_txstream.py; the large matrices run with ``-m txstream_heavy``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from txs_helpers import FIXED, SCHEDULERS, assert_same, run

import shoal
from shoal.workloads import txstream as ts
from shoal.workloads.txstream import policy, tpg
from shoal.workloads.txstream.apps import APPS, generic, gs, sl


@pytest.fixture(scope="module", params=[1, 2], ids=lambda w: f"{w}w")
def pilot(request):
    with shoal.Pilot(request.param) as p:
        yield p


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(2) as p:
        yield p


# -- the oracle against plain loops nobody shares code with ----------------------------


@pytest.mark.parametrize("name", sorted(APPS))
@pytest.mark.parametrize("theta,abort", [(0.0, 0.0), (1.2, 0.3)])
def test_serial_equals_plain_loop(name, theta, abort):
    app = APPS[name]
    evs = app.events(400, 24, theta=theta, abort=abort, seed=3)
    snap, rep = run(app.tables(24), evs, "serial", on_error="abort")
    plain = {k: v.tolist() for k, v in app.tables(24).items()}
    app.plain(plain, evs)
    for k in plain:
        assert snap[k].tolist() == plain[k], k
    assert not rep.errors
    if abort:
        assert rep.aborted  # the generator's aborts happen


# -- every app x scheduler x worker count equals serial ------------------------------------


@pytest.mark.parametrize("name", sorted(APPS))
def test_schedulers_equal_serial(pilot, name):
    app = APPS[name]
    evs = app.events(240, 32, theta=1.0, abort=0.2, seed=11)
    ref = run(app.tables(32), evs, "serial")
    for sched in SCHEDULERS:
        got = run(app.tables(32), evs, sched, pilot, punctuation=60)
        assert_same(got, ref, f"{name} {sched} {pilot.workers}w")


def test_ledger_conserves_money(pilot2):
    evs = sl.events(600, 40, theta=0.9, abort=0.3, seed=5)
    snap, rep = run(sl.tables(40), evs, "adaptive", pilot2, punctuation=128)
    deposits = sum(ev["amount"] for seq, (fn, ev) in enumerate(evs)
                   if fn is sl.deposit and seq not in rep.aborted)
    assert int(snap["accounts"].sum()) == 40 * sl.INITIAL + deposits
    assert (snap["accounts"] >= 0).all() and (snap["assets"] >= 0).all()
    assert rep.aborted and all(evs[s].fn is sl.transfer for s in rep.aborted)


# -- Hypothesis: random small streams, repeated keys, guards, skew --------------------------

KINDS = ["add", "avg", "set"]


@hs.composite
def streams(draw):
    rng = np.random.default_rng(draw(hs.integers(0, 2**32 - 1)))
    theta = draw(hs.floats(0, 1.5))
    abort = draw(hs.floats(0, 0.5))
    n = draw(hs.integers(1, 300))
    keys = ts.apps.Keys(16, theta, rng, 2)
    evs = []
    for _ in range(n):
        ops = []
        for _ in range(int(rng.integers(1, 4))):
            k = int(keys.draw(1)[0])
            reads = [["t", int(x)] for x in keys.draw(int(rng.integers(0, 3)))]
            if rng.random() < 0.3:
                reads.append(["u", k % 4])
            gmin = None
            if rng.random() < abort:
                gmin = int(rng.integers(0, 200))  # may or may not hold
            table = "t" if rng.random() < 0.8 else "u"
            key = k if table == "t" else k % 4
            ops.append([table, key, KINDS[int(rng.integers(0, 3))], int(rng.integers(-50, 50)),
                        gmin, reads])
        if rng.random() < 0.3:  # a key repeated inside the transaction
            ops.append(list(ops[0]))
        evs.append(ts.Event(generic.program, {"ops": ops}))
    punct = draw(hs.sampled_from([1, 7, 64, 300]))
    return evs, punct


def _tables():
    return {"t": np.arange(16, dtype=np.int64) * 10, "u": np.full(4, 50, np.int64)}


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams(), sched=hs.sampled_from(SCHEDULERS))
def test_random_streams_equal_serial(pilot2, stream, sched):
    evs, punct = stream
    ref = run(_tables(), evs, "serial")
    got = run(_tables(), evs, sched, pilot2, punctuation=punct)
    assert_same(got, ref, str(sched))


# -- the semantics on hand-made transactions -------------------------------------------------


def _t_self_transfer(txn, ev):
    txn.update("a", ev["src"], lambda v: v - ev["amt"], guard=lambda v: v >= ev["amt"])
    txn.update("a", ev["dst"], lambda v: v + ev["amt"])


def _t_read_own(txn, ev):
    txn.update("a", 0, lambda v: v + 1)
    txn.update("a", 1, lambda v, x: v + 10 * x, reads=[("a", 0)])  # sees the +1 above
    txn.update("a", 2, lambda v, x: v + x, guard=lambda v, x: x < ev["limit"], reads=[("a", 1)])


@pytest.mark.parametrize("sched", ["serial", "adaptive", "2pl", "partitioned", FIXED[3]])
def test_semantics_by_hand(pilot2, sched):
    evs = [ts.Event(_t_self_transfer, {"src": 1, "dst": 1, "amt": 5}),   # src == dst: no change
           ts.Event(_t_self_transfer, {"src": 0, "dst": 2, "amt": 500}),  # guard fails: abort
           ts.Event(_t_read_own, {"limit": 10 ** 6}),
           ts.Event(_t_read_own, {"limit": 0})]                          # aborts at its 3rd update
    snap, rep = run({"a": np.array([100, 7, 0])}, evs, sched, pilot2 if sched != "serial" else None,
                    punctuation=3)
    assert rep.aborted == {1, 3}
    assert rep.outputs[0] == (2, 7) and rep.outputs[1] is None and rep.outputs[3] is None
    assert rep.outputs[2] == (101, 7 + 1010, 1017)
    assert snap["a"].tolist() == [101, 1017, 1017]


def test_tpg_edges_by_hand():
    layout = {"a": (0, 4)}
    evs = [ts.Event(_t_self_transfer, {"src": 1, "dst": 2, "amt": 1}),
           ts.Event(_t_read_own, {"limit": 5})]
    plan = tpg.build(evs, layout, 2)
    # ops: 0: a1, 1: a2 (txn 0); 2: a0, 3: a1 reads a0, 4: a2 reads a1 (txn 1)
    assert plan.op_gid == [1, 2, 0, 1, 2]
    assert plan.prev == [-1, -1, -1, 0, 1]                       # temporal edges
    assert plan.op_reads[3] == ((2, 0),) and plan.op_reads[4] == ((3, 1),)  # parametric
    assert plan.txn_start == [0, 2, 5]                            # logical: txn 0 = ops 0..1
    assert sorted(map(sorted, plan.chains)) == [[0, 3], [1, 4], [2]]
    assert not plan.cyclic()


def test_cyclic_reads_fall_back_to_operations(pilot2):
    # key 0 reads 1, key 1 reads 0: the chain graph has a cycle
    evs = [ts.Event(gs.grep_sum, {"keys": [0, 1], "c": 0, "ok": True}),
           ts.Event(gs.grep_sum, {"keys": [1, 0], "c": 0, "ok": True})] * 20
    plan = tpg.build(evs, {"table": (0, 4)}, 2)
    assert plan.cyclic()
    ref = run(gs.tables(4), evs, "serial")
    got = run(gs.tables(4), evs, ts.TPG("chain", "structured", "lazy"), pilot2, punctuation=40)
    assert_same(got, ref)
    assert got[1].batches[0].decisions == "op/structured/lazy"


def test_adaptive_policy_is_pure_and_reasoned():
    flat = policy.Shape(100, 200, 50, 0.0, 0.05, 0.01, False)
    assert str(policy.choose(flat, None)) == "chain/structured/lazy"
    assert policy.choose(flat, 0.2).abort is policy.AbortHandling.EAGER  # aborts seen
    guarded = policy.Shape(100, 200, 50, 0.5, 0.05, 0.3, None)
    d = policy.choose(guarded, None, cyclic=lambda: False)
    assert str(d) == "op/nonstructured/eager"
    cyc = policy.Shape(100, 200, 50, 0.0, 0.05, 0.3, None)
    assert policy.choose(cyc, 0.0, cyclic=lambda: True).granularity is policy.Granularity.OP
    with pytest.raises(ValueError, match="lazy"):
        ts.TPG("chain", "structured", "eager")


# -- bad input ---------------------------------------------------------------------------------


def _bad_table(txn, ev):
    txn.update("nope", 0, lambda v: v)


def _bad_key(txn, ev):
    txn.update("a", ev["k"], lambda v: v + 1)


def _raises(txn, ev):
    txn.update("a", 0, lambda v: v + 1)
    txn.update("a", 1, lambda v: 1 // 0)


def _floaty(txn, ev):
    txn.update("a", 0, lambda v: v / 2)


def _huge(txn, ev):
    txn.update("a", 0, lambda v: 2 ** 70)


def _ok(txn, ev):
    txn.update("a", 0, lambda v: v + 1)


BAD = [(_bad_table, {}, "unknown table 'nope'"), (_bad_key, {"k": 3}, "key 3 out of range"),
       (_bad_key, {"k": "x"}, "not an integer"), (_raises, {}, "ZeroDivisionError"),
       (_floaty, {}, "must return an integer"), (_huge, {}, "does not fit int64")]


@pytest.mark.parametrize("sched", ["serial", "adaptive", "2pl", FIXED[3]])
@pytest.mark.parametrize("fn,ev,msg", BAD, ids=[b[2].split()[0] for b in BAD])
def test_bad_transactions(pilot2, sched, fn, ev, msg):
    p = None if sched == "serial" else pilot2
    evs = [ts.Event(_ok, {})] * 3 + [ts.Event(fn, ev)] + [ts.Event(_ok, {})] * 3
    snap, rep = run({"a": np.zeros(3, np.int64)}, evs, sched, p, punctuation=2, on_error="abort")
    assert rep.aborted == {3} and msg in rep.errors[3] and snap["a"][0] == 6
    store = ts.Store({"a": np.zeros(3, np.int64)})
    with pytest.raises(ts.TxnError, match=f"event 3: .*{msg}") as info:
        ts.Engine(store, pilot=p, scheduler=sched, punctuation=2).run(evs)
    assert info.value.seq == 3
    assert store.snapshot()["a"][0] == 2  # as of the last punctuation: the failing batch undone
    store.close()


def test_engine_arguments():
    store = ts.Store({"a": np.zeros(2, np.int64)})
    with pytest.raises(ValueError, match="unknown scheduler"):
        ts.Engine(store, scheduler="2PC")
    with pytest.raises(ValueError, match="runs on a pilot"):
        ts.Engine(store, scheduler="adaptive")
    with pytest.raises(ValueError, match="punctuation"):
        ts.Engine(store, scheduler="serial", punctuation=0)
    with pytest.raises(TypeError, match="event 1"):
        ts.Engine(store, scheduler="serial").run([ts.Event(_ok, {}), 42])
    with pytest.raises(TypeError, match="not callable"):
        ts.Engine(store, scheduler="serial").run([("fn", {})])
    store.close()
    with pytest.raises(TypeError, match="integers"):
        ts.Store({"a": np.zeros(2)})
    with pytest.raises(ValueError, match="1-D"):
        ts.Store({"a": np.zeros((2, 2), np.int64)})


# -- stats for a dashboard, files -------------------------------------------------------------


def test_batch_stats_callback(pilot2):
    seen = []
    evs = gs.events(300, 50, theta=0.5, abort=0.1, seed=2)
    store = ts.Store(gs.tables(50))
    eng = ts.Engine(store, pilot=pilot2, punctuation=100, on_batch=seen.append)
    rep = eng.run(evs)
    store.close()
    assert [s.batch for s in seen] == [0, 1, 2] and seen == rep.batches and eng.last is seen[-1]
    assert sum(s.events for s in seen) == 300 and sum(s.aborted for s in seen) == len(rep.aborted)
    s = seen[1].as_dict()
    assert s["first_seq"] == 100 and s["events_per_s"] > 0 and 0 < s["latency_p50"] <= s["latency_p99"]
    assert rep.throughput > 0 and 0 < rep.latency["p50"] <= rep.latency["p99"]


@pytest.mark.parametrize("ext", [".jsonl", ".msgpack"])
def test_event_files(tmp_path, ext):
    evs = sl.events(500, 20, abort=0.2, seed=4)
    path = tmp_path / f"ev{ext}"
    assert ts.write_events(path, evs) == 500
    back = ts.read_events(path)
    assert iter(back) is back  # a generator: read as consumed
    ref = run(sl.tables(20), evs, "serial")
    got = run(sl.tables(20), ts.read_events(path), "serial", punctuation=77)
    assert_same(got, ref)


def test_event_file_errors(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"fn": "shoal.workloads.txstream.apps.gs:grep_sum", "ev": {}}\nnot json\n')
    it = ts.read_events(p)
    next(it)
    with pytest.raises(ValueError, match="x.jsonl:2"):
        next(it)
    p.write_text('{"ev": {}}\n')
    with pytest.raises(ValueError, match="'fn'"):
        list(ts.read_events(p))
    with pytest.raises(ValueError, match="format"):
        list(ts.read_events(tmp_path / "x.csv"))


def test_example_ledger_runs():
    """examples/txstream_ledger.py: event functions of __main__ reach the workers (by value)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, os.path.join(root, "examples", "txstream_ledger.py"),
                          "--events", "1500", "--accounts", "200"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "equal to the serial oracle; money conserved" in out.stdout


def test_figure_of_the_docs_is_current():
    import os

    from shoal.workloads.txstream import tpg as _tpg

    evs, layout = _tpg.example_batch()
    fig = _tpg.to_mermaid(_tpg.build(evs, layout, 2), layout)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    doc = open(os.path.join(root, "docs", "txstream.md")).read()
    assert fig in doc, "docs/txstream.md's figure is stale: python -m shoal.workloads.txstream.tpg"
    assert "digraph tpg" in _tpg.to_dot(_tpg.build(evs, layout, 2), layout)


def _die(txn, ev):
    import os

    txn.update("a", 1, lambda v: os._exit(3))


@pytest.mark.parametrize("sched", ["2pl", pytest.param("adaptive", marks=pytest.mark.txstream_heavy)])
def test_worker_killed_mid_batch_leaves_no_half_batch(sched):
    """A worker dies inside a transaction: the run fails with WorkerLost (nothing hangs: the
    other task is cancelled), and the store is as of the last punctuation even for the
    in-place 2pl (regression: it kept the batch's partial writes)."""
    evs = [ts.Event(_ok, {})] * 6 + [ts.Event(_die, {})] + [ts.Event(_ok, {})]
    store = ts.Store({"a": np.zeros(3, np.int64)})
    with shoal.Pilot(2) as pilot:
        with pytest.raises(shoal.WorkerLost):
            ts.Engine(store, pilot=pilot, scheduler=sched, punctuation=4).run(evs)
    assert store.snapshot()["a"].tolist() == [4, 0, 0]
    store.close()


def test_docs_snippet_runs(tmp_path):
    """docs/txstream.md's program runs and conserves money."""
    import os
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    doc = open(os.path.join(root, "docs", "txstream.md")).read()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "__main__" in b]
    script = tmp_path / "snippet.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=root), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("1000000")


@pytest.mark.parametrize("n,w", [(0, 2), (1, 2), (63, 2), (64, 2), (300, 2), (1000, 3), (129, 1)])
def test_ownership_blocks_cover_each_transaction_once(n, w):
    from shoal.workloads.txstream.area import BLOCK, owned

    got = [owned(p, n, w) for p in range(w)]
    assert sorted(t for part in got for t in part) == list(range(n))
    for p, part in enumerate(got):
        assert part == sorted(part) and all((t // BLOCK) % w == p for t in part)


def _ident(f):
    """What a recorded closure computes (each recording makes new closure objects)."""
    if isinstance(f, functools.partial):
        return f.func, f.args, f.keywords
    return f.__code__


def _declares_then_fails(txn, ev):
    txn.update("t", 0, lambda v: v + 1, guard=lambda v: v > 0, reads=[("t", 1), ("u", 2)])
    txn.update("nope", 0, lambda v: v)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams(), bad_at=hs.lists(hs.integers(0, 299), max_size=5))
def test_column_recorder_equals_per_transaction_recording(stream, bad_at):
    """Split planning's ArrayTxn columns hold exactly what Txn records transaction by
    transaction, a failed declaration (after some updates) leaving no operation behind."""
    from shoal.workloads.txstream.txn import ArrayTxn, record_or_error

    evs, _ = stream
    evs = list(evs)
    for i in bad_at:
        evs.insert(min(i, len(evs)), ts.Event(_declares_then_fails, {}))
    layout = {"t": (0, 16), "u": (16, 4)}
    rec = ArrayTxn(layout)
    for t, (fn, ev) in enumerate(evs):
        rec.record(t, fn, ev)
    cols = rec.arrays()
    ops, bad = [], {}
    for t, (fn, ev) in enumerate(evs):
        o, err = record_or_error(fn, ev, layout)
        if err is not None:
            bad[t] = err
        ops.append(o)
    flat = [op for o in ops for op in o]
    assert rec.bad == bad and set(bad) >= {t for t, e in enumerate(evs) if e.fn is _declares_then_fails}
    assert cols["txn_nops"].tolist() == [len(o) for o in ops]
    assert cols["txn_nreads"].tolist() == [sum(len(x[3]) for x in o) for o in ops]
    assert cols["txn_guard"].tolist() == [int(any(x[2] is not None for x in o)) for o in ops]
    assert cols["gid"].tolist() == [x[0] for x in flat]
    assert cols["nreads"].tolist() == [len(x[3]) for x in flat]
    assert cols["rgid"].tolist() == [g for x in flat for g in x[3]]
    assert [_ident(f) for f in rec.fn] == [_ident(x[1]) for x in flat]
    assert [g is None for g in rec.guard] == [x[2] is None for x in flat]
