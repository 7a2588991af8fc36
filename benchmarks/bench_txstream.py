"""Transactional streams, one run, ratios: ``python benchmarks/bench_txstream.py [--events 20480]``.

Every row runs the same seeded stream through a plain serial Python loop
(the app's ``plain``: lists, no engine), the engine's ``"serial"`` oracle, and
the pilot schedulers (``"adaptive"`` TPG, ``"2pl"``, ``"partitioned"``) on a
pilot of ``--workers`` workers; it prints seconds and ratios against the
plain loop, "2pl" and "partitioned" measured in the same run, plus the p99
latency of a punctuation batch (arrival to commit) and what the adaptive
policy chose.  The issue's targets:

1. GS (1 write + 4 reads, 10 us per access), theta 0: >= 1.5x the plain loop;
   theta 1.0: never slower than it.
2. SL and GS at theta 0.75: TPG >= 1.2x "2pl"; 50% multi-partition:
   >= 1.3x "partitioned".
3. The 0 us complexity row: the engine's own cost per operation.

The machine's load average is printed before and after: on a shared 2-core
box every ratio moves with it.  ``--quick`` runs a small stream (a check that
the script works, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import time

import shoal
from shoal.workloads import txstream as ts
from shoal.workloads.txstream.apps import gs, sl

SCHEDS = ["serial", "adaptive", "2pl", "partitioned"]


def _plain(app, n_keys, evs) -> float:
    tables = {k: v.tolist() for k, v in app.tables(n_keys).items()}
    t0 = time.perf_counter()
    app.plain(tables, evs)
    return time.perf_counter() - t0


def _engine(app, n_keys, evs, sched, pilot, punct):
    store = ts.Store(app.tables(n_keys))
    try:
        t0 = time.perf_counter()
        rep = ts.Engine(store, pilot=pilot if sched != "serial" else None, scheduler=sched,
                        punctuation=punct).run(evs)
        dt = time.perf_counter() - t0
    finally:
        store.close()
    p99 = max(b.latency_p99 for b in rep.batches)
    choice = sorted({b.decisions for b in rep.batches})
    return dt, p99, ",".join(choice), len(rep.aborted)


def row(title, app, pilot, args, **params):
    n_keys = params.pop("n_keys", 10_000)
    evs = app.events(args.events, n_keys, seed=1, **params)
    plain = _plain(app, n_keys, evs)
    res = {s: _engine(app, n_keys, evs, s, pilot, args.punctuation) for s in SCHEDS}
    ops = len(evs)
    print(f"\n## {title}  ({args.events} events, {n_keys} keys, {params})")
    print(f"{'':14}{'seconds':>9}{'x plain':>9}{'x 2pl':>7}{'x part':>8}{'us/event':>9}"
          f"{'p99 batch s':>13}  choice")
    print(f"{'plain loop':14}{plain:9.3f}{1:9.2f}{'':7}{'':8}{plain / ops * 1e6:9.2f}")
    for s in SCHEDS:
        dt, p99, choice, aborted = res[s]
        print(f"{s:14}{dt:9.3f}{plain / dt:9.2f}{res['2pl'][0] / dt:7.2f}"
              f"{res['partitioned'][0] / dt:8.2f}{dt / ops * 1e6:9.2f}{p99:13.3f}  {choice}")
    return plain, res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=20480)
    ap.add_argument("--punctuation", type=int, default=10240)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.events, args.punctuation = 1024, 512
    print(f"load average before: {os.getloadavg()}  (cores: {os.cpu_count()})")
    with shoal.Pilot(args.workers) as pilot:
        _engine(gs, 100, gs.events(256, 100, seed=0), "adaptive", pilot, 128)  # warm-up
        row("GS theta=0, 10 us/access", gs, pilot, args, theta=0.0, complexity=10)
        row("GS theta=1.0, 10 us/access", gs, pilot, args, theta=1.0, complexity=10)
        row("GS theta=0.75, 10 us/access", gs, pilot, args, theta=0.75, complexity=10)
        row("SL theta=0.75, 10 us/access", sl, pilot, args, theta=0.75, complexity=10)
        row("SL theta=0.75, 50% multi-partition", sl, pilot, args, theta=0.75, complexity=10,
            multi_partition=0.5)
        row("GS theta=0.75, 50% multi-partition", gs, pilot, args, theta=0.75, complexity=10,
            multi_partition=0.5)
        row("GS theta=0, 0 us/access (the engine's own cost)", gs, pilot, args, theta=0.0,
            complexity=0)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
