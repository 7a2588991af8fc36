"""One-way messages/s between two processes: shoal rings vs multiprocessing.

Usage::

    python benchmarks/ring_bench.py [--messages 200000] [--size 64] [--json]

A producer process sends ``--messages`` payloads of ``--size`` bytes; this
process receives them.  Compared in one run:

* ``ring native pop`` / ``ring native pop_many``: a RingMatrix ring with the C
  helper; the consumer spins briefly and then parks on its Doorbell, the
  producer rings the doorbell after every push (as the runtime does).
* ``ring pure pop`` / ``ring pure pop_many``: the same with ``native=False``.
* ``mp.Queue``: ``multiprocessing.Queue`` put/get (a lock, a feeder thread and
  pickling per message).
* ``mp.Pipe``: ``Connection.send_bytes`` / ``recv_bytes`` (one syscall each way).

Process start-up is not timed: the producer attaches, reports ready, waits for
a go signal; the clock runs from go until the last message is received.  Every
run checks the message count.  Ratios are against ``mp.Queue``; quote ratios,
not absolute rates (small noisy machines).

``run(messages, size) -> list[dict]`` is the entry point for benchmarks/run.py.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # a source checkout without installing
    sys.path.insert(0, str(HERE.parent))

from shoal.queues import EMPTY, Push, RingMatrix, _impl  # noqa: E402

_READY, _GO = 1, 2  # status words of endpoint 1: [0] = child ready, [1] = go


# -- shoal rings -----------------------------------------------------------------------


def _ring_producer(spec: dict, messages: int, size: int) -> None:
    matrix = RingMatrix.attach(spec)
    status = matrix.status(1)
    ring, bell = matrix.ring(1, 0), matrix.doorbell(0)
    payload = b"x" * size
    status[0] = _READY
    while status[1] != _GO:
        time.sleep(0.0002)
    push, wake, full = ring.push, bell.ring, Push.FULL
    for _ in range(messages):
        while push(payload) is full:
            os.sched_yield()
        wake()
    del push, wake
    matrix.close()


def bench_ring(messages: int, size: int, native: bool, batch: bool) -> float:
    """Seconds to receive ``messages`` through one ring (producer in a child process)."""
    capacity = max(1 << 20, 1 << (4 * (size + 64) - 1).bit_length())
    with RingMatrix(2, capacity, native=native) as matrix:
        env = dict(os.environ, SHOAL_PURE="0" if native else "1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", json.dumps(matrix.spec()), str(messages), str(size)],
            pass_fds=matrix.fds(),
            env=env,
        )
        try:
            status = matrix.status(1)
            deadline = time.monotonic() + 60
            while status[0] != _READY:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError("ring producer did not start")
                time.sleep(0.001)
            ring, bell = matrix.ring(1, 0), matrix.doorbell(0)
            pop, pop_many, readable = ring.pop, ring.pop_many, ring.readable
            got = spins = 0
            t0 = time.perf_counter()
            status[1] = _GO
            while got < messages:
                if batch:
                    n = len(pop_many(256))
                else:
                    n = 0 if pop() is EMPTY else 1
                if n:
                    got += n
                    spins = 0
                else:
                    spins += 1
                    if spins > 200:
                        bell.park(readable, 0.1)
                        spins = 0
            elapsed = time.perf_counter() - t0
            del pop, pop_many, readable
        finally:
            if child.wait(60) != 0:
                raise RuntimeError(f"ring producer exited {child.returncode}")
    return elapsed


# -- multiprocessing peers ---------------------------------------------------------------


def _queue_producer(q, ready, go, messages: int, size: int) -> None:
    payload = b"x" * size
    ready.set()
    go.wait()
    for _ in range(messages):
        q.put(payload)


def _pipe_producer(conn, ready, go, messages: int, size: int) -> None:
    payload = b"x" * size
    ready.set()
    go.wait()
    send = conn.send_bytes
    for _ in range(messages):
        send(payload)
    conn.close()


def bench_mp(messages: int, size: int, kind: str) -> float:
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    if kind == "queue":
        q = ctx.Queue()
        proc = ctx.Process(target=_queue_producer, args=(q, ready, go, messages, size))
        receive = q.get
    else:
        recv_conn, send_conn = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_pipe_producer, args=(send_conn, ready, go, messages, size))
        receive = recv_conn.recv_bytes
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError(f"{kind} producer did not start")
        t0 = time.perf_counter()
        go.set()
        for _ in range(messages):
            receive()
        elapsed = time.perf_counter() - t0
    finally:
        proc.join(60)
        if kind == "queue":
            q.close()
            q.join_thread()
        else:
            recv_conn.close()
            send_conn.close()
    if proc.exitcode != 0:
        raise RuntimeError(f"{kind} producer exited {proc.exitcode}")
    return elapsed


# -- driver ------------------------------------------------------------------------------


def run(messages: int = 200_000, size: int = 64) -> list[dict]:
    """Messages/s for every transport; ``ratio`` is against multiprocessing.Queue."""
    cases = []
    if _impl.NATIVE_AVAILABLE:
        cases += [
            ("ring native pop", lambda: bench_ring(messages, size, True, False)),
            ("ring native pop_many", lambda: bench_ring(messages, size, True, True)),
        ]
    cases += [
        ("ring pure pop", lambda: bench_ring(messages, size, False, False)),
        ("ring pure pop_many", lambda: bench_ring(messages, size, False, True)),
        ("mp.Queue", lambda: bench_mp(messages, size, "queue")),
        ("mp.Pipe", lambda: bench_mp(messages, size, "pipe")),
    ]
    rows = []
    for name, fn in cases:
        seconds = fn()
        rows.append({"transport": name, "messages": messages, "size": size,
                     "seconds": round(seconds, 4), "msgs_per_s": round(messages / seconds)})
    base = next(r["msgs_per_s"] for r in rows if r["transport"] == "mp.Queue")
    for r in rows:
        r["ratio_vs_mp_queue"] = round(r["msgs_per_s"] / base, 2)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'transport':<22} {'size B':>7} {'msgs/s':>12} {'x mp.Queue':>11}"]
    for r in rows:
        lines.append(f"{r['transport']:<22} {r['size']:>7} {r['msgs_per_s']:>12,} {r['ratio_vs_mp_queue']:>10.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages per transport")
    parser.add_argument("--size", type=int, default=64, help="payload bytes")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--child", nargs=3, metavar=("SPEC", "N", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec, n, size = args.child
        _ring_producer(json.loads(spec), int(n), int(size))
        return 0
    rows = run(args.messages, args.size)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
