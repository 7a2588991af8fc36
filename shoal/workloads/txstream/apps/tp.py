"""Toll Processing (TP): position reports update a road segment's speed and count; the toll reads both."""

from __future__ import annotations

import numpy as np

from ..txn import Event, spin
from .zipf import Keys


def tables(n_keys: int) -> dict:
    return {"speed": np.full(n_keys, 60, np.int64), "count": np.zeros(n_keys, np.int64),
            "toll": np.zeros(n_keys, np.int64)}


def _toll(speed, count):
    return 0 if speed >= 40 or count <= 50 else 2 * (count - 50) ** 2 // 100


def report(txn, ev):
    seg, car, c = ev["seg"], ev["car"], ev["c"]
    txn.update("speed", seg, lambda v: (spin(c), (7 * v + ev["speed"]) // 8)[1],
               guard=lambda v: ev["speed"] >= 0)
    txn.update("count", seg, lambda v: (spin(c), v + 1)[1])
    txn.update("toll", car, lambda v, s, n: (spin(c * 3), v + _toll(s, n))[1],
               reads=[("speed", seg), ("count", seg)])


def events(n: int, n_keys: int = 10_000, *, theta: float = 0.0, abort: float = 0.0,
           complexity: float = 0.0, multi_partition: float = 0.5, partitions: int = 2,
           seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    keys = Keys(n_keys, theta, rng, partitions)
    out = []
    for _ in range(n):
        seg, car = keys.group(2, rng.random() < multi_partition)
        speed = int(rng.integers(0, 100)) if rng.random() >= abort else -1  # -1: invalid report
        out.append(Event(report, {"seg": seg, "car": car, "speed": speed, "c": complexity}))
    return out


def plain(t: dict, evs) -> None:
    sp, cnt, toll = t["speed"], t["count"], t["toll"]
    for _, ev in evs:
        if ev["speed"] < 0:
            continue
        seg, c = ev["seg"], ev["c"]
        spin(c)
        sp[seg] = (7 * sp[seg] + ev["speed"]) // 8
        spin(c)
        cnt[seg] += 1
        spin(3 * c)
        toll[ev["car"]] += _toll(sp[seg], cnt[seg])
