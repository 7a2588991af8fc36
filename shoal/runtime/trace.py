"""Chrome trace-event recording (opens in Perfetto or chrome://tracing).

Each worker keeps its own ``Tracer`` (a list of events, no I/O while running)
and dumps it to ``<path>.w<endpoint>`` when it stops; the driver merges the
parts into ``<path>`` with one named track per worker (``merge``).  With
tracing off the worker holds ``None`` and pays one ``is not None`` test per
task: nothing measurable.

Timestamps are ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux, shared by all
processes of the machine), written in microseconds as the format wants.
Rejected: sending events through the rings while running (competes with tasks
for ring space and the driver's attention).
"""

from __future__ import annotations

import json
import os
import time

import shoal._durable as durable


class Tracer:
    """Event buffer of one worker: owner only."""

    __slots__ = ("ep", "events")

    def __init__(self, ep: int):
        self.ep = ep
        self.events: list = []

    def span(self, name: str, t0: float, t1: float, cat: str = "task") -> None:
        self.events.append(
            {"name": name, "cat": cat, "ph": "X", "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6,
             "pid": 1, "tid": self.ep}
        )

    def instant(self, name: str, cat: str = "steal") -> None:
        self.events.append(
            {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": time.perf_counter() * 1e6,
             "pid": 1, "tid": self.ep}
        )

    def dump(self, path: str) -> None:
        durable.write_atomic(path, [json.dumps(self.events).encode()], "trace part")


def merge(path: str, endpoints: list[int]) -> int:
    """Merge the workers' parts into one trace file; returns the number of events."""
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "shoal pilot"}},
    ]
    for ep in endpoints:
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": ep,
                       "args": {"name": f"worker {ep}"}})
        part = f"{path}.w{ep}"
        try:
            with open(part) as f:
                events.extend(json.load(f))
            os.unlink(part)
        except (OSError, ValueError):
            continue  # a worker that died leaves no part
    durable.write_atomic(path, [json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode()],
                         "trace")
    return len(events)
