"""Worker health as pure bookkeeping: endpoints without a process, and stopped workers.

The local backend's pump thread carries the decisions out (starts processes, reads
``/proc``, logs); this module only remembers and decides, so it never blocks and a
test can drive it with made-up times.

* **Down endpoints.** A worker that died is *down* until its replacement runs.
  Tasks are not placed on a down endpoint while a live one exists.  A failed start
  (no free fds, ENOMEM, the pids limit) is retried after a delay that doubles from
  ``first_delay`` up to ``max_delay``; every failure is counted and kept for
  ``stats()``.  Rejected: giving up after N attempts (the pilot would shrink for
  good after a transient ENOMEM) and retrying at once (a busy loop in the pump).
* **Stopped workers.** With work outstanding the pump looks every ``every`` seconds
  at each worker's process state; ``saw`` turns the states into "now stopped" /
  "runs again" events, once per change, so a SIGSTOPped worker is reported once
  and not every round.  The backend then places nothing on a stopped worker and
  takes back the tasks queued to it (``shoal/backends/local/stopped.py``); the
  task it runs stays with it, and the report says why that one's ``result()`` waits.

Owner: the driver's pump thread; ``lost``, ``start_failed`` and ``started`` are
called with the backend's lock held (submit reads ``down`` under it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Change(enum.Enum):
    STOPPED = "stopped"
    RUNS_AGAIN = "runs again"


@dataclass
class Down:
    """An endpoint without a process: when to try again, and why the last try failed."""

    retry_at: float = 0.0
    delay: float = 0.0
    tries: int = 0
    why: str | None = None


class Health:
    def __init__(self, every: float = 2.0, first_delay: float = 0.05, max_delay: float = 5.0):
        self.every = every
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.down: dict[int, Down] = {}
        self.restart_failures = 0
        self.stopped: dict[int, int] = {}  # endpoint -> pid seen stopped
        self.next_check = 0.0

    # -- down endpoints ---------------------------------------------------------------

    def lost(self, ep: int) -> None:
        """``ep``'s process died: down until a replacement runs."""
        self.down.setdefault(ep, Down())

    def start_failed(self, ep: int, why: str, now: float) -> Down:
        entry = self.down.get(ep) or Down()
        delay = min(self.max_delay, max(self.first_delay, entry.delay * 2))
        self.down[ep] = entry = Down(now + delay, delay, entry.tries + 1, why)
        self.restart_failures += 1
        return entry

    def started(self, ep: int) -> bool:
        """A process runs on ``ep`` again; True if starting it had failed before."""
        entry = self.down.pop(ep, None)
        return entry is not None and entry.tries > 0

    def due(self, now: float) -> list[int]:
        return [ep for ep, d in self.down.items() if d.retry_at <= now]

    def wake_in(self, now: float) -> float | None:
        """Seconds until the next retry is due (None: nothing to retry)."""
        if not self.down:
            return None
        return max(0.0, min(d.retry_at for d in self.down.values()) - now)

    def live(self, endpoints) -> list[int]:
        return [ep for ep in endpoints if ep not in self.down]

    # -- stopped workers --------------------------------------------------------------

    def check_due(self, now: float) -> bool:
        if now < self.next_check:
            return False
        self.next_check = now + self.every
        return True

    def saw(self, ep: int, pid: int, state: str | None) -> Change | None:
        """A worker's process state (``/proc``'s letter; T/t: stopped): what changed."""
        if state in ("T", "t"):
            if self.stopped.get(ep) != pid:
                self.stopped[ep] = pid
                return Change.STOPPED
            return None
        if self.stopped.pop(ep, None) is not None:
            return Change.RUNS_AGAIN
        return None


def proc_state(pid: int) -> str | None:
    """The one-letter state of a process (``T``: stopped) from /proc; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return None
