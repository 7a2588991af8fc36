"""The workers view: pure derivation of rows and a one-minute history from monitor samples.

Input, once per interval: the backend's ``monitor()`` sample (local backend: pid,
CPU, NUMA node, generation and status words per worker, plus each worker's last
STATS reply with its counters) or, on backends without one, ``stats()``.
Output: one row per worker (state, tasks, busy %, steals by locality, ring
traffic, replacements) and per worker a history of busy fractions and steals,
which the page draws as the last minute's timeline.

Busy % comes from the workers' own ``idle_s``/``uptime_s`` counters (the time
they spent parked or spinning), differenced between two replies of the same
process; a worker that has not answered for two intervals while its status
words say it runs a task is 100% busy.  Nothing here is per task.

``Workers.update`` is pure apart from the state it keeps (no I/O, no clock):
the sampler thread passes ``now`` and the CPU percentages it measured.
"""

from __future__ import annotations

import collections
import enum

HISTORY_S = 60.0


class WorkerState(enum.Enum):
    BUSY = "busy"  # running a task
    IDLE = "idle"  # between tasks, looking for work
    STEALING = "stealing"  # asked every victim in vain, waiting for work
    PARKED = "parked"  # asleep on its doorbell
    STARTING = "starting"  # a new (replacement) process that has not answered yet
    STOPPED = "stopped"  # SIGSTOPped (the runtime notices and says so)
    DOWN = "down"  # no process: a restart failed, the runtime retries with backoff
    UNKNOWN = "unknown"  # no status words on this backend and no answer yet


def state_of(running: int, hungry: bool, parked: bool, busy: float | None,
             answered: bool, down: bool = False, stopped: bool = False) -> WorkerState:
    if down:
        return WorkerState.DOWN
    if stopped:
        return WorkerState.STOPPED
    if parked:
        return WorkerState.PARKED
    if running:
        return WorkerState.BUSY
    if hungry:
        return WorkerState.STEALING
    if not answered:
        return WorkerState.STARTING
    if busy is not None and busy >= 0.5:
        return WorkerState.BUSY
    return WorkerState.IDLE


class _Track:
    """What the view remembers about one worker slot between samples."""

    __slots__ = ("pid", "generation", "prev", "history", "replaced", "pids", "tasks_before")

    def __init__(self, keep: int):
        self.pid = 0
        self.generation = 0
        self.prev: dict | None = None  # last STATS reply used
        self.history: collections.deque = collections.deque(maxlen=keep)
        self.replaced = 0
        self.pids: list[int] = []
        self.tasks_before = 0  # tasks run by earlier processes of this slot


class Workers:
    """Rows and histories for the workers page: sampler thread only."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.keep = max(2, int(HISTORY_S / interval))
        self.tracks: dict[str, _Track] = {}

    def update(self, sample: dict, now: float, cpu_percent: dict[int, float] | None = None) -> list[dict]:
        cpu_percent = cpu_percent or {}
        rows = []
        for w in sample.get("workers", []):
            key = f"{w.get('dask_worker', '')}#{w.get('worker')}"
            track = self.tracks.get(key)
            if track is None:
                track = self.tracks[key] = _Track(self.keep)
            st = w.get("stats") if "stats" in w else (None if w.get("unresponsive") else w)
            pid = w.get("pid") or (st or {}).get("pid") or 0
            gen = w.get("generation", (st or {}).get("generation", 0))
            if track.pid and pid and pid != track.pid:
                track.replaced += 1
                track.pids.append(track.pid)
                track.tasks_before += (track.prev or {}).get("tasks_run", 0)
                track.prev = None
            track.pid, track.generation = pid or track.pid, gen
            if st is not None and st.get("pid") not in (None, pid):
                st = None  # an answer from the process this slot had before
            busy = steals = None
            fresh = st is not None and (track.prev is None or st is not track.prev)
            if st is not None and track.prev is not None and fresh:
                d_up = st.get("uptime_s", 0) - track.prev.get("uptime_s", 0)
                d_idle = st.get("idle_s", 0) - track.prev.get("idle_s", 0)
                if d_up > 0:
                    busy = min(1.0, max(0.0, 1.0 - d_idle / d_up))
                steals = (st.get("stolen_local", 0) + st.get("stolen_remote", 0)
                          - track.prev.get("stolen_local", 0) - track.prev.get("stolen_remote", 0))
            stale = st is None or (st.get("at") is not None and now - st["at"] > 2 * self.interval)
            running = w.get("running", 0)
            if busy is None and stale and running:
                busy = 1.0  # deep in a long task: it answers after it
            state = state_of(running, w.get("hungry", False), w.get("parked", False), busy,
                             st is not None, w.get("down", False), w.get("stopped", False))
            if busy is None and state is WorkerState.PARKED:
                busy = 0.0
            prev = track.prev
            if st is not None:
                track.prev = st
            track.history.append([round(now, 3), None if busy is None else round(busy, 3), steals or 0])
            cur = track.prev or {}
            rate = None
            if prev is not None and fresh and st is not None:
                d_up = st.get("uptime_s", 0) - prev.get("uptime_s", 0)
                msgs = (st.get("messages_in", 0) + st.get("messages_out", 0)
                        - prev.get("messages_in", 0) - prev.get("messages_out", 0))
                rate = round(msgs / d_up, 1) if d_up > 0 else None
            rows.append({
                "worker": w.get("worker"), "dask_worker": w.get("dask_worker"),
                "host": w.get("host"), "pid": pid,
                "cpu": w.get("cpu", cur.get("cpu")), "node": w.get("node", cur.get("node")),
                "state": state.value, "tasks": cur.get("tasks_run", 0),
                "tasks_total": track.tasks_before + cur.get("tasks_run", 0),
                "busy": None if busy is None else round(100 * busy, 1),
                "cpu_percent": cpu_percent.get(pid),
                "queued": cur.get("queued", 0),
                "stolen_local": cur.get("stolen_local", 0), "stolen_remote": cur.get("stolen_remote", 0),
                "messages_in": cur.get("messages_in", 0), "messages_out": cur.get("messages_out", 0),
                "ring_msgs_per_s": rate,
                "replaced": track.replaced, "previous_pids": list(track.pids[-5:]),
                "history": list(track.history),
            })
        # grouped by host (then dask worker, then shoal worker): a host's workers side by side
        rows.sort(key=lambda r: (r["host"] or "", r["dask_worker"] or "", r["worker"] or 0))
        return rows


def hosts_of(rows: list[dict]) -> dict[str, list[str]]:
    """``{host: [its dask workers' addresses]}`` of the rows (dask pilots; hosts sorted)."""
    out: dict[str, set] = {}
    for r in rows:
        if r.get("dask_worker"):
            out.setdefault(r.get("host") or "?", set()).add(r["dask_worker"])
    return {h: sorted(out[h]) for h in sorted(out)}


def totals(rows: list[dict]) -> dict:
    """Steals by locality and ring traffic over all workers."""
    busy = [r["busy"] for r in rows if r["busy"] is not None]
    return {
        "tasks": sum(r["tasks_total"] for r in rows),
        "stolen_local": sum(r["stolen_local"] for r in rows),
        "stolen_remote": sum(r["stolen_remote"] for r in rows),
        "messages": sum(r["messages_in"] + r["messages_out"] for r in rows),
        "ring_msgs_per_s": round(sum(r["ring_msgs_per_s"] or 0 for r in rows), 1),
        "replaced": sum(r["replaced"] for r in rows),
        "busy": round(sum(busy) / len(busy), 1) if busy else None,
    }
