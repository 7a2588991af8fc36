"""Event functions for tests/txstream/test_txstream_attack.py (module-level: workers import them)."""

from __future__ import annotations


def _add(d):
    return lambda v, *r: v + d + sum(r) % 7


def _at_least(th):
    return lambda v, *r: v + sum(r) >= th


def hostile(txn, ev):
    """ev: [(table, key, delta, guard threshold or None, reads)]: the same hot keys again and
    again inside one transaction, guards that read other keys, reads of keys updated later."""
    for table, key, d, th, reads in ev:
        txn.update(table, key, _add(d), guard=None if th is None else _at_least(th),
                   reads=[tuple(r) for r in reads])


def touch(txn, ev):
    txn.update("t", 0, lambda v: v + 1)
