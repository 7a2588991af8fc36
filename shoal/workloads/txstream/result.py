"""What one batch produces, whatever the scheduler: the shape the driver merges.

``BatchResult``: ``txn_start`` (n+1 offsets into ``vals``: transaction t wrote
``vals[txn_start[t]:txn_start[t+1]]``, one value per declared update, in
order), ``committed`` (bool per transaction), ``errors`` (transaction index
-> message) and the scheduling ``decisions`` used (for the stats record).
Arrays, not per-event Python objects: the driver keeps outputs as one segment
per batch (``Outputs`` below) and never loops over events in Python.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .area import DONE


@dataclass
class BatchResult:
    txn_start: np.ndarray
    vals: np.ndarray
    committed: np.ndarray
    errors: dict = field(default_factory=dict)
    decisions: str = ""
    redo_from: int | None = None  # lazy abort: the first transaction re-run eagerly


def settle(txn_start: np.ndarray, state: np.ndarray, txn_abort: np.ndarray, bad: dict,
           errors: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(committed per transaction, committed per operation)`` of a finished batch: not
    aborted and not a failed declaration (``bad``, merged into ``errors``); every operation of
    a committed transaction must have run."""
    committed = txn_abort == 0
    committed[list(bad)] = False
    errors.update(bad)
    n = len(txn_start) - 1
    cm = committed[np.repeat(np.arange(n), np.diff(txn_start))]
    if not (state[cm] == DONE).all():
        raise RuntimeError("txstream: a committed transaction has an operation that did not "
                           "run (scheduler bug)")
    return committed, cm


def install(flat: np.ndarray, gid: np.ndarray, vals: np.ndarray, cm: np.ndarray) -> None:
    """Write the last committed version of every key the batch wrote into the store."""
    idx = np.flatnonzero(cm)
    if len(idx):
        keys, first = np.unique(gid[idx][::-1], return_index=True)
        flat[keys] = vals[idx[::-1][first]]


class Outputs(Mapping):
    """``outputs[seq]``: the tuple of values the transaction's updates wrote, or None if aborted."""

    def __init__(self):
        self._first: list[int] = []  # first seq of each segment
        self._segs: list[tuple] = []  # (txn_start, vals, committed)
        self._n = 0

    def add(self, seq0: int, txn_start, vals, committed) -> None:
        if self._first and seq0 < self._first[-1] + len(self._segs[-1][2]):
            raise ValueError("output segments must be added in stream order")
        self._first.append(seq0)
        self._segs.append((np.asarray(txn_start), np.asarray(vals), np.asarray(committed, bool)))
        self._n += len(committed)

    def __getitem__(self, seq):
        i = bisect.bisect_right(self._first, seq) - 1
        if i < 0 or not isinstance(seq, (int, np.integer)):
            raise KeyError(seq)
        start, vals, committed = self._segs[i]
        t = seq - self._first[i]
        if t >= len(committed):
            raise KeyError(seq)
        if not committed[t]:
            return None
        return tuple(vals[start[t]:start[t + 1]].tolist())

    def __iter__(self):
        for first, (_, _, committed) in zip(self._first, self._segs, strict=True):
            yield from range(first, first + len(committed))

    def __len__(self):
        return self._n

    def segments(self):
        return [(f, *s) for f, s in zip(self._first, self._segs, strict=True)]
