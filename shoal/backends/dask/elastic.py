"""The elastic pilot's policy: when a pilot of batch jobs (``jobs=(low, high)``) submits another
job, cancels a pending one, or gives a running one back.

Pure: ``decide(view, bounds)`` reads one snapshot and returns a ``Decision`` with a reason for
each action; the caller does the I/O (dask-jobqueue's ``scale``/``retire_workers``, sbatch,
scancel) and records the reasons (the pilot's event log, the journal).  No clock: ages and idle
times are in the snapshot, so Hypothesis drives it directly (tests/hpc/test_elastic_policy.py).

The rules, in order (the documented thresholds are ``Bounds.grow_after_s`` and
``Bounds.idle_after_s``):

1. **below the minimum** (running + pending < low): submit up to ``low``;
2. **grow** while a task has waited longer than ``grow_after_s``: submit as many jobs as the
   waiting tasks need (``ceil(waiting / slots_per_job)``), less the jobs already pending (they
   will take those tasks when they start), never past ``high``;
3. **cancel pending jobs when the work runs out**: nothing waits and no task runs beyond what
   the running jobs hold, so every pending job above the minimum is cancelled;
4. **shrink**: with nothing waiting, a running job idle for ``idle_after_s`` or more is given
   back, the longest-idle first, never below ``low`` (counting the pending ones as future
   capacity would let a queue of never-starting jobs empty the pilot: they do not count).

Never both grow and shrink in one decision: tasks that wait are a reason to keep every job.

Rejected: dask's ``adapt`` (it retires workers by memory and target duration, not by a node's
idle time, and does not say why; its decisions cannot be journaled); growing by one job per
period (a burst of 40 tasks on a 1:8 pilot would take 8 periods of queue wait to reach its
size); counting pending jobs toward ``low`` when shrinking (see rule 4).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

GROW_AFTER_S = 10.0  # a task waiting this long asks for another job
IDLE_AFTER_S = 60.0  # a job idle this long (and nothing waits) is given back


class Action(enum.Enum):
    SUBMIT = "submit"
    CANCEL = "cancel"  # a pending job: scancel
    RETIRE = "retire"  # a running job: its workers retire, then the job ends


@dataclasses.dataclass(frozen=True)
class Bounds:
    low: int
    high: int
    slots_per_job: int = 1  # tasks one job runs at once (its cores / a task's cores)
    grow_after_s: float = GROW_AFTER_S
    idle_after_s: float = IDLE_AFTER_S

    def __post_init__(self):
        if not (isinstance(self.low, int) and isinstance(self.high, int) and 0 <= self.low <= self.high
                and self.high >= 1):
            raise ValueError(f"jobs=({self.low!r}, {self.high!r}): need 0 <= low <= high and high >= 1")
        if self.slots_per_job < 1:
            raise ValueError(f"slots_per_job must be >= 1, got {self.slots_per_job!r}")


@dataclasses.dataclass(frozen=True)
class Job:
    """A running job: ``tasks`` it runs now, ``idle_s`` since its last task ended (or it
    started).  A job with tasks is never given back, whatever its ``idle_s`` says."""

    job_id: str
    idle_s: float = 0.0
    tasks: int = 0


@dataclasses.dataclass(frozen=True)
class View:
    """One snapshot: the waiting tasks' ages (seconds each has waited), the running jobs,
    the pending (submitted, not yet running) job ids."""

    waiting: Sequence[float] = ()
    running: Sequence[Job] = ()
    pending: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class Step:
    action: Action
    job_id: str | None  # None for SUBMIT
    reason: str


@dataclasses.dataclass(frozen=True)
class Decision:
    steps: tuple[Step, ...] = ()

    @property
    def submit(self) -> int:
        return sum(s.action is Action.SUBMIT for s in self.steps)

    @property
    def cancel(self) -> tuple[str, ...]:
        return tuple(s.job_id for s in self.steps if s.action is Action.CANCEL)

    @property
    def retire(self) -> tuple[str, ...]:
        return tuple(s.job_id for s in self.steps if s.action is Action.RETIRE)


def decide(view: View, bounds: Bounds) -> Decision:
    """What to do now (module doc); an empty Decision when nothing should change."""
    running, pending = list(view.running), list(view.pending)
    total = len(running) + len(pending)
    waiting = len(view.waiting)
    steps: list[Step] = []
    if total < bounds.low:
        n = bounds.low - total
        steps += [Step(Action.SUBMIT, None, f"{total} jobs, below the minimum {bounds.low}")] * n
        total += n
    oldest = max(view.waiting, default=0.0)
    if waiting and oldest >= bounds.grow_after_s:
        need = math.ceil(waiting / bounds.slots_per_job) - len(pending) - len(steps)
        n = max(0, min(need, bounds.high - total))
        if n:
            why = (f"{waiting} tasks waiting, the oldest for {oldest:.0f} s (>= {bounds.grow_after_s:g} s); "
                   f"{len(running)} running and {len(pending)} pending jobs")
            steps += [Step(Action.SUBMIT, None, why)] * n
        return Decision(tuple(steps))
    if waiting:
        return Decision(tuple(steps))  # tasks wait, not yet for long: keep every job
    keep = bounds.low
    # pending jobs beyond what the minimum still needs are cancelled: the work ran out
    still_needed = max(0, keep - len(running))
    for job_id in pending[still_needed:]:
        steps.append(Step(Action.CANCEL, job_id, "no task waits: the work ran out"))
    room = len(running) - keep
    idle = sorted((j for j in running if not j.tasks and j.idle_s >= bounds.idle_after_s),
                  key=lambda j: -j.idle_s)
    for job in idle[:max(0, room)]:
        steps.append(Step(Action.RETIRE, job.job_id,
                          f"idle for {job.idle_s:.0f} s (>= {bounds.idle_after_s:g} s) and no task waits"))
    return Decision(tuple(steps))


def parse_jobs(value) -> tuple[int, int]:
    """``jobs=4`` -> (4, 4); ``jobs=(1, 8)`` or ``"1:8"`` (``shoal run --jobs 1:8``) -> (1, 8)."""
    if isinstance(value, str):
        low, sep, high = value.partition(":")
        try:
            pair = (int(low), int(high)) if sep else (int(low), int(low))
        except ValueError:
            raise ValueError(f"jobs={value!r}: give a count (4) or a range low:high (1:8)") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif isinstance(value, tuple | list) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        pair = (value[0], value[1])
    else:
        raise ValueError(f"jobs={value!r}: give a count (4) or a range (1, 8)")
    Bounds(*pair)
    return pair


__all__ = ["Action", "Bounds", "Job", "View", "Step", "Decision", "decide", "parse_jobs",
           "GROW_AFTER_S", "IDLE_AFTER_S"]
