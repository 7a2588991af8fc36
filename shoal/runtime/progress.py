"""The progress board: skeletons and workloads publish records by topic; monitors read them.

Data flow::

    search / all-pairs / training / stream driver loop
        └─ shoal.publish("search", {"nodes": 1.2e6, "incumbent": 42, ...})  (~2 per second)
              └─ BOARD: per topic a bounded deque of records (newest last), a sequence number
                    ├─ the dashboard's progress page (reads snapshots, renders every number)
                    └─ subscribers (the terminal progress line of a long skeleton call)

A record is a flat mapping of field name to a JSON scalar (int, float, str, bool,
None); the board adds ``t`` (epoch seconds) unless given and ``seq`` (one counter
across topics).  The dashboard draws every numeric field as a line over time and
shows the latest value of every field, so a new workload needs no dashboard code.

Invariants: any thread may publish; readers get copies; a topic keeps its last
``KEEP`` records, so a board costs bounded memory whatever runs.  Publishing is
per *sample* (a driver loop's tick), never per task; it is a process-local
append, so it costs the same whether or not anybody watches.  A record published
inside a task stays on that worker's board (no page reads it): publish from the
driver, where the skeleton's loop runs.

Rejected: per-task events to the dashboard (the runtime's hot path would pay for a
page nobody may be watching); a schema per topic (every workload would need
dashboard code); a pub/sub over the rings (records come from the driver anyway).
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping

KEEP = 600  # records kept per topic (5 minutes at 2 per second)
_SCALARS = (int, float, str, bool, type(None))


def check_record(topic, record) -> dict:
    """A validated copy of ``record``; TypeError/ValueError naming the culprit otherwise."""
    if not isinstance(topic, str) or not topic.strip():
        raise TypeError(f"publish(): topic must be a non-empty str, got {topic!r}")
    if not isinstance(record, Mapping):
        raise TypeError(f"publish({topic!r}, ...): record must be a mapping of field -> number/str, "
                        f"got {type(record).__name__}")
    out = {}
    for key, value in record.items():
        if not isinstance(key, str):
            raise TypeError(f"publish({topic!r}, ...): field names must be str, got {key!r}")
        if hasattr(value, "item") and not isinstance(value, _SCALARS):  # numpy scalars
            value = value.item()
        if not isinstance(value, _SCALARS):
            raise TypeError(f"publish({topic!r}, ...): field {key!r} is a {type(value).__name__}; "
                            "records hold int, float, str, bool or None")
        if isinstance(value, float) and not math.isfinite(value):
            value = None  # JSON has no inf/nan: an unknown value
        out[key] = value
    return out


class Board:
    """Records by topic, newest last; any thread."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._lock = threading.Lock()
        self._topics: dict[str, collections.deque] = {}
        self._seq = itertools.count(1)
        self._subscribers: list[Callable[[str, dict], None]] = []

    def publish(self, topic: str, record: Mapping) -> None:
        rec = check_record(topic, record)
        rec.setdefault("t", time.time())
        with self._lock:
            rec["seq"] = next(self._seq)
            q = self._topics.get(topic)
            if q is None:
                q = self._topics[topic] = collections.deque(maxlen=self.keep)
            q.append(rec)
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(topic, rec)
            except Exception:  # a broken monitor never breaks the work it watches
                pass

    def topics(self) -> list[str]:
        with self._lock:
            return list(self._topics)

    def records(self, topic: str, since: int = 0) -> list[dict]:
        """Copies of ``topic``'s records with ``seq > since``, oldest first."""
        with self._lock:
            return [dict(r) for r in self._topics.get(topic, ()) if r["seq"] > since]

    def snapshot(self, last: int | None = None) -> dict[str, list[dict]]:
        """Every topic's records (the newest ``last`` of each), oldest first."""
        with self._lock:
            out = {}
            for topic, q in self._topics.items():
                recs = list(q) if last is None else list(q)[-last:]
                out[topic] = [dict(r) for r in recs]
            return out

    def subscribe(self, fn: Callable[[str, dict], None]) -> Callable[[], None]:
        """Call ``fn(topic, record)`` on every publish (in the publisher's thread); returns
        the function that unsubscribes."""
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def clear(self) -> None:
        with self._lock:
            self._topics.clear()


BOARD = Board()


def publish(topic: str, record: Mapping | None = None, /, **fields) -> None:
    """Publish one progress record under ``topic`` to this process's board.

    ``shoal.publish("train", {"epoch": 3, "loss": 0.41})`` or
    ``shoal.publish("train", epoch=3, loss=0.41)``.  Values are int, float, str,
    bool or None; call it per sample (a few times a second at most), not per task.
    """
    if record is None:
        record = fields
    elif fields:
        record = {**record, **fields}
    BOARD.publish(topic, record)
