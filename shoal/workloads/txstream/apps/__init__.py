"""MorphStream's benchmark applications, with seeded Zipf generators.

Each app module has ``tables(n_keys)`` (the initial store), ``events(n, ...)``
(a list of ``Event``: the stream) and ``plain(tables, events)`` (a plain serial
Python loop applying the same transactions to lists: the benchmark's
baseline, and a second oracle the tests compare "serial" with).

Parameters, as in MorphStream: ``n_keys`` (state size), ``theta`` (Zipf skew
of key choice, 0 = uniform), ``abort`` (fraction of transactions built to
abort), ``length`` (accesses per transaction), ``multi_partition`` (fraction
of transactions whose keys fall in different partitions of ``partitions``:
key % partitions), ``complexity`` (busy-wait microseconds per state access).
"""

from . import generic, gs, ob, sl, tp
from .zipf import Keys

APPS = {"sl": sl, "gs": gs, "tp": tp, "ob": ob}

__all__ = ["APPS", "Keys", "generic", "gs", "ob", "sl", "tp"]
