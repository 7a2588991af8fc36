"""Grep&Sum (GS): one write of the average of a key and ``length - 1`` read keys."""

from __future__ import annotations

import numpy as np

from ..txn import Event, spin
from .zipf import Keys


def tables(n_keys: int) -> dict:
    return {"table": np.arange(n_keys, dtype=np.int64) * 7 % 1000}


def grep_sum(txn, ev):
    k, c, ok = ev["keys"], ev["c"], ev["ok"]
    txn.update("table", k[0], lambda v, *o: (spin(c * (1 + len(o))), (v + sum(o)) // (len(o) + 1))[1],
               guard=None if ok else (lambda v, *o: False), reads=[("table", x) for x in k[1:]])


def events(n: int, n_keys: int = 10_000, *, theta: float = 0.0, abort: float = 0.0,
           complexity: float = 0.0, length: int = 5, multi_partition: float = 0.5,
           partitions: int = 2, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    keys = Keys(n_keys, theta, rng, partitions)
    return [Event(grep_sum, {"keys": keys.group(length, rng.random() < multi_partition),
                             "c": complexity, "ok": bool(rng.random() >= abort)})
            for _ in range(n)]


def plain(t: dict, evs) -> None:
    tab = t["table"]
    for _, ev in evs:
        if not ev["ok"]:
            continue
        k = ev["keys"]
        o = [tab[x] for x in k[1:]]
        spin(ev["c"] * len(k))
        tab[k[0]] = (tab[k[0]] + sum(o)) // len(k)
