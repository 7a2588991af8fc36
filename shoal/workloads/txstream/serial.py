"""The serial oracle: apply the transactions one by one, in stream order, in this process.

This is the Semantics paragraph of the issue written as a loop, and nothing
else: record the transaction, apply its updates in declaration order against
the committed state plus the transaction's own earlier writes (an overlay),
and on a failed guard or an error drop the overlay.  Every other scheduler is
tested for exact equality against it.
"""

from __future__ import annotations

import numpy as np

from .result import BatchResult
from .txn import Guarded, OnError, apply, describe, key_name, record_or_error


def run_serial(flat: np.ndarray, layout: dict, events: list, seq0: int,
               on_error: OnError) -> BatchResult:
    """Apply ``events`` (``Event`` tuples) to ``flat`` in place."""
    n = len(events)
    txn_start = np.zeros(n + 1, np.int64)
    vals: list[int] = []
    committed = np.zeros(n, bool)
    errors: dict = {}
    for t, (fn, ev) in enumerate(events):
        ops, err = record_or_error(fn, ev, layout)
        outs = [0] * len(ops)
        if err is None:
            overlay: dict = {}
            ok = True
            for i, (gid, f, g, reads) in enumerate(ops):
                vs = [overlay[gid] if gid in overlay else int(flat[gid])]
                for r in reads:
                    vs.append(overlay[r] if r in overlay else int(flat[r]))
                try:
                    new = apply(f, g, vs)
                except Guarded:
                    ok = False
                    break
                except Exception as exc:
                    errors[t] = describe(exc, f"update {i} ({key_name(layout, gid)})")
                    ok = False
                    break
                overlay[gid] = new
                outs[i] = new
            if ok:
                for gid, v in overlay.items():
                    flat[gid] = v
                committed[t] = True
        else:
            errors[t] = err
        vals.extend(outs)
        txn_start[t + 1] = len(vals)
        if t in errors and on_error is OnError.STOP:
            break  # the engine raises; nothing after the failing event matters
    return BatchResult(txn_start, np.asarray(vals, np.int64), committed, errors, "serial")
