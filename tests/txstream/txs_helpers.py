"""Helpers shared by the txstream tests: run a stream under a scheduler, compare with "serial"."""

from __future__ import annotations

import numpy as np

from shoal.workloads import txstream as ts

FIXED = [ts.TPG("op", "structured", "eager"), ts.TPG("op", "nonstructured", "eager"),
         ts.TPG("op", "structured", "lazy"), ts.TPG("op", "nonstructured", "lazy"),
         ts.TPG("chain", "structured", "lazy"), ts.TPG("chain", "nonstructured", "lazy")]
SCHEDULERS = ["adaptive", "2pl", "partitioned", *FIXED]


def run(tables: dict, events, scheduler, pilot=None, punctuation=64, **kw):
    store = ts.Store(tables)
    try:
        rep = ts.Engine(store, pilot=pilot, scheduler=scheduler, punctuation=punctuation,
                        **kw).run(events)
        return store.snapshot(), rep
    finally:
        store.close()


def assert_same(a, b, what=""):
    snap_a, rep_a = a
    snap_b, rep_b = b
    assert snap_a.keys() == snap_b.keys()
    for k in snap_a:
        assert np.array_equal(snap_a[k], snap_b[k]), f"{what}: table {k} differs"
    assert rep_a.aborted == rep_b.aborted, f"{what}: abort sets differ"
    assert dict(rep_a.outputs) == dict(rep_b.outputs), f"{what}: outputs differ"
    assert rep_a.errors.keys() == rep_b.errors.keys(), f"{what}: error sets differ"
