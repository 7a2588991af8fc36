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

The machine's load average and its 2-process ceiling (benchmarks/run.py's
``parallel_ceiling``: 2.0 on an idle 2-core machine) are printed before and
after: on a shared 2-core box every ratio moves with them.  ``--quick`` runs a
small stream (a check that the script works, not a measurement).

``--across-hosts tcp://scheduler:port`` runs, instead, the engine across the
hosts of a dask cluster (docs/txstream.md, "Across hosts"; e.g. the cluster of
``scripts/testbed up --hosts 3 --dask``) against the plain loop and the serial
oracle, with the waves each batch took.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import run as bench_run  # noqa: E402  (benchmarks/run.py: parallel_ceiling)

import shoal  # noqa: E402
from shoal.workloads import txstream as ts  # noqa: E402
from shoal.workloads.txstream.apps import gs, sl  # noqa: E402

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


def cpu_costs(n: int = 10240) -> None:
    """The engine's own cost per event in CPU time (``time.process_time``: robust to a loaded
    machine), one process running both partitions of a 2-partition GS batch at 0 us."""
    import pickle
    import tempfile

    import numpy as np

    from shoal.workloads.txstream import tpg, tpgrun
    from shoal.workloads.txstream.area import Area, Job

    evs = gs.events(n, 10_000, seed=1)
    store = ts.Store(gs.tables(10_000))
    blob = pickle.dumps(evs, 5)
    from shoal.workloads.txstream.area import owned

    halves = [pickle.dumps([evs[t] for t in owned(p, n, 2)], 5) for p in (0, 1)]  # the slices
    slices = [(0, len(halves[0])), (len(halves[0]), len(halves[1]))]
    best: dict = {}

    def keep(k, v):
        best[k] = min(best.get(k, 1e9), v)

    pt = time.process_time
    for rep in range(3):
        t0 = pt()
        pickle.loads(blob)
        keep("unpickle the batch", pt() - t0)
        t0 = pt()
        tpg.build(evs, store.layout, 2)
        keep("replicated plan (tpg.build, whole batch)", pt() - t0)
        for mode in ("split", "replicated"):
            area = Area(store.size)
            area.ensure(ops=4 * n, txns=n + 1, nbytes=sum(map(len, halves)))
            area.inbox.array[:slices[1][0] + slices[1][1]] = np.frombuffer(b"".join(halves), np.uint8)
            area.reset()
            job = Job("tpg", area.state, area.fields, area.inbox, store.shared, store.layout, 2,
                      rep, 1, slices, tempfile.mkdtemp(), f"{mode}{rep}",
                      tpg=ts.TPG("op", "structured", "lazy"), extra={"mode": mode, "n": n})
            t0 = pt()
            tpgrun.tpg_task(job, 0)
            keep(f"{mode}: one task, both partitions, plan + run", pt() - t0)
            if mode == "split":
                from shoal.workloads.txstream.split import Global

                t0 = pt()
                Global(job, n)
                keep("split: graph assembly from the shared arrays", pt() - t0)
            area.close()
        tables = {k: v.tolist() for k, v in gs.tables(10_000).items()}
        t0 = pt()
        gs.plain(tables, evs)
        keep("plain loop", pt() - t0)
    store.close()
    print(f"\n## engine cost, CPU time per event (GS, 0 us, {n} events, one process)")
    for k, v in best.items():
        print(f"{k:58}{v / n * 1e6:8.2f} us")
    g = best["split: graph assembly from the shared arrays"]
    split_w = (best["split: one task, both partitions, plan + run"] - g) / 2 + g
    rep_run = (best["replicated: one task, both partitions, plan + run"]
               - best["replicated plan (tpg.build, whole batch)"] - best["unpickle the batch"])
    rep_w = best["unpickle the batch"] + best["replicated plan (tpg.build, whole batch)"] + rep_run / 2
    print(f"{'derived: per worker of 2, split planning':58}{split_w / n * 1e6:8.2f} us")
    print(f"{'derived: per worker of 2, replicated planning':58}{rep_w / n * 1e6:8.2f} us")


def across_hosts(args) -> None:
    """The engine on a dask cluster whose workers are on other hosts: key groups in waves."""
    print(f"\n## across hosts ({args.across_hosts}), punctuation {args.punctuation}")
    print(f"{'row':40}{'plain s':>9}{'serial s':>10}{'hosts s':>9}{'x plain':>9}"
          f"{'waves/batch':>13}  hosts")
    with shoal.Pilot(backend="dask", address=args.across_hosts, workers=1) as pilot:
        for title, app, params in (("GS theta=0, 10 us/access", gs, {"complexity": 10}),
                                   ("GS theta=1.0, 10 us/access", gs,
                                    {"theta": 1.0, "complexity": 10}),
                                   ("SL theta=0.75, 10 us/access", sl,
                                    {"theta": 0.75, "complexity": 10}),
                                   ("GS theta=0, 0 us/access", gs, {})):
            evs = app.events(args.events, 10_000, seed=1, **params)
            plain = _plain(app, 10_000, evs)
            serial = _engine(app, 10_000, evs, "serial", None, args.punctuation)[0]
            store = ts.Store(app.tables(10_000))
            try:
                t0 = time.perf_counter()
                rep = ts.Engine(store, pilot=pilot, punctuation=args.punctuation).run(evs)
                dt = time.perf_counter() - t0
            finally:
                store.close()
            waves = [b.waves for b in rep.batches]
            hosts = sorted({h for b in rep.batches for h in b.hosts})
            print(f"{title:40}{plain:9.3f}{serial:10.3f}{dt:9.3f}{plain / dt:9.2f}"
                  f"{sum(waves) / len(waves):13.1f}  {','.join(hosts)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=20480)
    ap.add_argument("--punctuation", type=int, default=10240)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--across-hosts", metavar="ADDRESS", default=None,
                    help="a dask scheduler whose workers are on other hosts")
    args = ap.parse_args()
    if args.quick:
        args.events, args.punctuation = 1024, 512
    print(f"load average before: {os.getloadavg()}  (cores: {os.cpu_count()})")
    print(f"2-process ceiling before: {bench_run.parallel_ceiling():.2f} (2.00 = two idle cores)",
          flush=True)
    if args.across_hosts:
        across_hosts(args)
        print(f"\nload average after: {os.getloadavg()}")
        print(f"2-process ceiling after: {bench_run.parallel_ceiling():.2f}")
        return
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
    cpu_costs(1024 if args.quick else 10240)
    print(f"\nload average after: {os.getloadavg()}")
    print(f"2-process ceiling after: {bench_run.parallel_ceiling():.2f}")


if __name__ == "__main__":
    main()
