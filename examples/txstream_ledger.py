"""A streaming ledger on a pilot: transfers and deposits as transactions, checked against serial.

    python examples/txstream_ledger.py [--events 20000] [--accounts 1000] [--theta 0.8]

Builds a seeded Streaming Ledger stream (guarded transfers, some built to
abort), runs it with the adaptive TPG scheduler on a 2-worker pilot with a
checkpoint and a per-batch stats callback (what a dashboard would read), then
runs the serial oracle and checks: same balances, same aborted events, same
outputs, and money conserved.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import shoal
from shoal.workloads import txstream as ts
from shoal.workloads.txstream.apps import Keys, sl


def transfer(txn, ev):
    """The issue's example transaction: a guarded debit, then a credit."""
    txn.update("accounts", ev["src"], lambda v: v - ev["amount"], guard=lambda v: v >= ev["amount"])
    txn.update("accounts", ev["dst"], lambda v: v + ev["amount"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--accounts", type=int, default=1_000)
    ap.add_argument("--theta", type=float, default=0.8)
    args = ap.parse_args()
    n = args.accounts
    rng = np.random.default_rng(0)
    keys = Keys(n, args.theta, rng)
    events = [ts.Event(transfer, {"src": int(s), "dst": int(d),
                                  "amount": int(a) if rng.random() > 0.1 else 10 ** 9})
              for s, d, a in zip(keys.draw(args.events), keys.draw(args.events),
                                 rng.integers(1, 500, args.events), strict=True)]
    events += sl.events(args.events // 4, n, theta=args.theta, abort=0.1, seed=1)

    def show(stats: ts.BatchStats):
        print(f"batch {stats.batch}: {stats.events} events, {stats.aborted} aborted, "
              f"{stats.events_per_s:,.0f} events/s, p99 {stats.latency_p99 * 1e3:.1f} ms, "
              f"{stats.decisions}")

    tables = {"accounts": np.full(n, 10_000, np.int64), "assets": np.full(n, 10_000, np.int64)}
    store = ts.Store(tables)
    with shoal.Pilot(2) as pilot, tempfile.TemporaryDirectory() as ckpt:
        report = ts.Engine(store, pilot=pilot, scheduler="adaptive", punctuation=4096,
                           checkpoint=ckpt, on_batch=show).run(events)
    oracle = ts.Store(tables)
    expected = ts.Engine(oracle, scheduler="serial", punctuation=4096).run(events)
    same = all(np.array_equal(store.snapshot()[k], oracle.snapshot()[k]) for k in tables)
    assert same and report.aborted == expected.aborted
    assert dict(report.outputs) == dict(expected.outputs)
    deposits = sum(ev["amount"] for seq, (fn, ev) in enumerate(events)
                   if fn is sl.deposit and seq not in report.aborted)
    total = int(store.snapshot()["accounts"].sum())
    assert total == n * 10_000 + deposits
    print(f"{len(events)} events, {len(report.aborted)} aborted; throughput "
          f"{report.throughput:,.0f} events/s; latency p50 {report.latency['p50'] * 1e3:.1f} ms, "
          f"p99 {report.latency['p99'] * 1e3:.1f} ms")
    print(f"equal to the serial oracle; money conserved: {total}")
    store.close()
    oracle.close()


if __name__ == "__main__":
    main()
