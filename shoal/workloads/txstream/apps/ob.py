"""Online Bidding (OB): bids (guarded by stock), price alterations and stock top-ups over several items."""

from __future__ import annotations

import numpy as np

from ..txn import Event, spin
from .zipf import Keys


def tables(n_keys: int) -> dict:
    return {"price": np.full(n_keys, 100, np.int64), "qty": np.full(n_keys, 20, np.int64)}


def bid(txn, ev):
    c = ev["c"]
    for item in ev["items"]:
        txn.update("qty", item, lambda v: (spin(c), v - ev["n"])[1], guard=lambda v: v >= ev["n"])


def alter(txn, ev):
    c = ev["c"]
    for item, p in zip(ev["items"], ev["prices"], strict=True):
        txn.update("price", item, lambda v, p=p: (spin(c), (v + p) // 2)[1])


def topup(txn, ev):
    c = ev["c"]
    for item in ev["items"]:
        txn.update("qty", item, lambda v: (spin(c), v + ev["n"])[1])


def events(n: int, n_keys: int = 10_000, *, theta: float = 0.0, abort: float = 0.0,
           complexity: float = 0.0, length: int = 2, multi_partition: float = 0.5,
           partitions: int = 2, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    keys = Keys(n_keys, theta, rng, partitions)
    out = []
    for _ in range(n):
        items = keys.group(length, rng.random() < multi_partition)
        r = rng.random()
        if r < 0.6:
            k = 10 ** 9 if rng.random() < abort else int(rng.integers(1, 3))
            out.append(Event(bid, {"items": items, "n": k, "c": complexity}))
        elif r < 0.8:
            out.append(Event(alter, {"items": items, "c": complexity,
                                     "prices": [int(x) for x in rng.integers(50, 150, len(items))]}))
        else:
            out.append(Event(topup, {"items": items, "n": int(rng.integers(1, 10)), "c": complexity}))
    return out


def plain(t: dict, evs) -> None:
    price, qty = t["price"], t["qty"]
    for fn, ev in evs:
        c = ev["c"]
        if fn is bid:
            new = {}
            ok = True
            for it in ev["items"]:
                v = new.get(it, qty[it])
                if v < ev["n"]:
                    ok = False
                    break
                spin(c)
                new[it] = v - ev["n"]
            if ok:
                for it, v in new.items():
                    qty[it] = v
        elif fn is alter:
            for it, p in zip(ev["items"], ev["prices"], strict=True):
                spin(c)
                price[it] = (price[it] + p) // 2
        else:
            for it in ev["items"]:
                spin(c)
                qty[it] += ev["n"]
