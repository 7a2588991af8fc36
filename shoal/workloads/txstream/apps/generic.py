"""A generic transaction, fully described by its event: for random (Hypothesis) streams and bad input.

``ev = {"ops": [[table, key, kind, operand, guard_min, [[table, key], ...]], ...]}``

kinds: ``add`` (v + operand + sum(reads)), ``avg`` ((v + sum(reads)) // (1 + len(reads))),
``set`` (operand - sum(reads) % 7), ``raise`` (ValueError when v % 3 == 0, else add),
``float`` (returns v + 0.5: a non-integer result).  ``guard_min``: None, or the
update aborts its transaction unless v >= guard_min.
"""

from __future__ import annotations

from functools import partial


def _add(a, v, *o):
    return v + a + sum(o)


def _avg(a, v, *o):
    return (v + sum(o)) // (len(o) + 1)


def _set(a, v, *o):
    return a - sum(o) % 7


def _raise(a, v, *o):
    if v % 3 == 0:
        raise ValueError(f"refusing value {v}")
    return v + a + sum(o)


def _float(a, v, *o):
    return v + 0.5


def _guard(m, v, *o):
    return v >= m


KINDS = {"add": _add, "avg": _avg, "set": _set, "raise": _raise, "float": _float}


def program(txn, ev):
    for table, key, kind, a, gmin, reads in ev["ops"]:
        txn.update(table, key, partial(KINDS[kind], a),
                   guard=None if gmin is None else partial(_guard, gmin),
                   reads=[tuple(r) for r in reads])
