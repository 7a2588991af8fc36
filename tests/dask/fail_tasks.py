"""What tests/dask/test_dask_unresponsive.py reads of ``rt_tasks.marked_gate``'s marks."""

from __future__ import annotations

import os


def starts(marks: str) -> dict[str, list[int]]:
    """``{name: [pid of each start]}`` from a marks file (the test's side)."""
    out: dict[str, list[int]] = {}
    if not os.path.exists(marks):
        return out
    with open(marks) as f:
        for line in f:
            word, name, *rest = line.split()
            if word == "start":
                out.setdefault(name, []).append(int(rest[0]))
    return out
