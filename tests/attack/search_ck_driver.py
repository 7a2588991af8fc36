"""A driver process for tests/attack/test_search_break.py: one checkpointed search whose root
holds a frozenset of strings (their pickle follows hash order, which changes per process).

    python search_ck_driver.py N CHECKPOINT OUT

Counts every subset of N names (2**N nodes) with ``backtracking.count``; writes
``{"count": ..., "resumed": bool}`` as JSON to OUT.
"""

from __future__ import annotations

import json
import os
import sys

import shoal
from shoal.patterns import backtracking


def children(node):
    left, last = node
    return [(left - {v}, v) for v in sorted(left) if v > last]


def main() -> None:
    n, ck, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    root = (frozenset(f"name{i:03d}" for i in range(n)), "")
    resumed = os.path.exists(ck)
    with shoal.Pilot(2) as pilot:
        count = backtracking.count(pilot, root, children, checkpoint=ck, checkpoint_interval=0.05)
    with open(out, "w") as f:
        json.dump({"count": int(count), "resumed": resumed}, f)


if __name__ == "__main__":
    main()
