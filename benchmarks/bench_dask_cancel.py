"""Cost of the Executor's polling and cancel calls on a dask pilot (LocalCluster, 2 dask
workers of 1 thread), and how long they take with one dask worker SIGSTOPped.

    python benchmarks/bench_dask_cancel.py [--futures 2000] [--cancels 200]

Prints, in one run: ``running()`` per call over pending futures (a local read since the
nodes push STARTED; before, one cluster round trip per call), ``cancel()`` per pending
future against ``pilot.cancel_many`` per future (one claim round for all), and with one
dask worker stopped: ``running()`` of a task on the other worker and
``shutdown(wait=False, cancel_futures=True)`` (before: 30 s each).  Wall and driver CPU
seconds; the machine may be shared, so read the ratios of the same run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

import shoal


def block(gate: str) -> int:
    while not os.path.exists(gate):
        time.sleep(0.01)
    return 1


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--futures", type=int, default=2000)
    ap.add_argument("--cancels", type=int, default=200)
    args = ap.parse_args()
    from distributed import LocalCluster

    print(f"load: {os.getloadavg()}", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-dask-cancel-")
    gate = os.path.join(tmp, "gate")
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address="127.0.0.1:0")
    try:
        pilot = shoal.Pilot(backend="dask", cluster=cluster, workers=1)
        futs = [pilot.submit(block, gate) for _ in range(args.futures)]
        deadline = time.monotonic() + 60
        while sum(f.running() for f in futs[:4]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(3.0)  # the submits settle first (before: the slow running() sweep did that)
        n, wall, cpu = _timed(lambda: sum(f.running() for f in futs))
        print(f"running() over {len(futs)} futures ({n} running): "
              f"{wall / len(futs) * 1e6:.1f} us/call wall, {cpu / len(futs) * 1e6:.1f} us/call CPU",
              flush=True)
        k = args.cancels
        one, wall1, cpu1 = _timed(lambda: sum(f.cancel() for f in futs[-k:]))
        if not hasattr(pilot, "cancel_many"):  # an older shoal (before/after runs)
            pilot.cancel_many = lambda fs: [f.cancel() for f in fs]
        many, wall2, cpu2 = _timed(lambda: sum(pilot.cancel_many(futs[-2 * k:-k])))
        print(f"cancel() of {k} pending: {wall1 / k * 1e3:.2f} ms/future wall "
              f"({cpu1 / k * 1e3:.2f} CPU), {one} cancelled", flush=True)
        print(f"cancel_many of {k} pending: {wall2 / k * 1e3:.3f} ms/future wall "
              f"({cpu2 / k * 1e3:.3f} CPU), {many} cancelled; "
              f"cancel() loop / cancel_many = {wall1 / max(wall2, 1e-9):.1f}x", flush=True)
        # one dask worker stopped
        pids = pilot._backend.client.run(os.getpid)
        victim = sorted(pids.values())[0]
        os.kill(victim, signal.SIGSTOP)
        try:
            running = [f for f in futs[:4] if f.running()]
            _, wall, _ = _timed(lambda: [f.running() for f in running])
            print(f"one dask worker stopped: running() of the running tasks: {wall:.3f} s "
                  f"for {len(running)} calls", flush=True)
            _, wall, _ = _timed(lambda: pilot.shutdown(wait=False, cancel_futures=True))
            print(f"one dask worker stopped: shutdown(wait=False, cancel_futures=True): "
                  f"{wall:.2f} s; cancelled {sum(f.cancelled() for f in futs)} of {len(futs)}",
                  flush=True)
        finally:
            os.kill(victim, signal.SIGCONT)
        open(gate, "w").close()
        pilot.shutdown(wait=True)
        print(f"load: {os.getloadavg()}", flush=True)
    finally:
        open(gate, "a").close()
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
