"""Streaming Ledger (SL): deposits and guarded transfers between accounts and assets.

Tables ``accounts`` and ``assets``.  A deposit adds to one account and one
asset; a transfer moves ``amount`` from src to dst in both tables, guarded by
src having enough (a failing guard aborts the whole transfer).  Money is
conserved: sum(accounts) = initial + committed deposits.
"""

from __future__ import annotations

import numpy as np

from ..txn import Event, spin
from .zipf import Keys

INITIAL = 10_000


def tables(n_keys: int) -> dict:
    return {"accounts": np.full(n_keys, INITIAL, np.int64), "assets": np.full(n_keys, INITIAL, np.int64)}


def transfer(txn, ev):
    c, amt = ev["c"], ev["amount"]
    for table in ("accounts", "assets"):
        txn.update(table, ev["src"], lambda v: (spin(c), v - amt)[1], guard=lambda v: v >= amt)
        txn.update(table, ev["dst"], lambda v: (spin(c), v + amt)[1])


def deposit(txn, ev):
    c = ev["c"]
    txn.update("accounts", ev["acct"], lambda v: (spin(c), v + ev["amount"])[1])
    txn.update("assets", ev["asset"], lambda v: (spin(c), v + ev["value"])[1])


def events(n: int, n_keys: int = 10_000, *, theta: float = 0.0, abort: float = 0.0,
           complexity: float = 0.0, multi_partition: float = 0.5, partitions: int = 2,
           deposits: float = 0.5, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    keys = Keys(n_keys, theta, rng, partitions)
    out = []
    for _ in range(n):
        if rng.random() < deposits:
            a, b = keys.group(2, rng.random() < multi_partition)
            out.append(Event(deposit, {"acct": a, "asset": b, "amount": int(rng.integers(1, 100)),
                                       "value": int(rng.integers(1, 100)), "c": complexity}))
        else:
            s, d = keys.group(2, rng.random() < multi_partition)
            amt = int(rng.integers(1, 100))
            if rng.random() < abort:
                amt = 10 ** 12  # more than any balance: the guard fails
            out.append(Event(transfer, {"src": s, "dst": d, "amount": amt, "c": complexity}))
    return out


def plain(t: dict, evs) -> None:
    """The baseline: a plain loop over Python lists."""
    acc, ast = t["accounts"], t["assets"]
    for fn, ev in evs:
        c = ev["c"]
        if fn is deposit:
            spin(c)
            acc[ev["acct"]] += ev["amount"]
            spin(c)
            ast[ev["asset"]] += ev["value"]
        else:
            amt, s, d = ev["amount"], ev["src"], ev["dst"]
            if acc[s] >= amt:
                spin(c)
                acc[s] -= amt
                spin(c)
                acc[d] += amt
                if ast[s] >= amt:
                    spin(c)
                    ast[s] -= amt
                    spin(c)
                    ast[d] += amt
                else:  # undo: the whole transfer aborts
                    acc[d] -= amt
                    acc[s] += amt
