"""Driving one search from the driver: validate, submit, wait, report.

The engine (engine.py) runs inside workers; this module is the driver's
side: it makes the Control array (per machine), the stop flag and the incumbent
cell, submits the root task — or, on a pilot of several machines, splits the top
of the tree into groups (multinode.py; later the runtime's balancer moves spawned
subtrees to machines that run dry), or runs checkpointed chunks (checkpoint.py) — turns an
interruption into the stop flag, and builds ``SearchStats`` from the merged
``Tally``.
"""

from __future__ import annotations

import math
import sys
import time

import shoal

from .._portable import portable
from .._progress import Both, State, Ticker, progress_text
from .checkpoint import resume_initial, run_checkpointed
from .control import NODES, SPAWNED, STARTED, StopFlag, make_control, stop_all, wait_all
from .engine import task
from .model import (
    Coordination,
    Goal,
    SearchSpec,
    SearchStats,
    Tally,
    check_picklable,
    coordination_of,
    floor_float,
)
from .multinode import run_split

PROGRESS_S = 1.0  # seconds between two progress lines


class ProgressLine:
    """``progress=``: a line every ``PROGRESS_S`` with the nodes visited, nodes/s and the
    incumbent (``progress_text``, shoal's one progress-line format), read from Control's NODES column and the incumbent cell (driver only).

    ``True`` writes to stderr when it is a terminal (else nothing: logs of batch jobs
    stay clean), ``"always"`` to stderr anyway, a file-like object to it.  On a pilot of
    several machines the count is this machine's.
    """

    def __init__(self, out, ctl, cell, negate: bool):
        self.out, self.ctl, self.cell, self.negate = out, ctl, cell, negate
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.t0 = self.last_t = time.monotonic()
        self.last_nodes = 0
        self.next = self.t0 + PROGRESS_S
        self.lines = 0

    @staticmethod
    def make(progress, ctl, cell, negate: bool):
        if progress is False or progress is None:
            return None
        if progress is True:
            return ProgressLine(sys.stderr, ctl, cell, negate) if sys.stderr.isatty() else None
        if progress == "always":
            return ProgressLine(sys.stderr, ctl, cell, negate)
        if callable(getattr(progress, "write", None)):
            return ProgressLine(progress, ctl, cell, negate)
        raise ValueError(f"progress must be True, False, 'always' or a file-like object, "
                         f"got {progress!r}")

    def wait_s(self) -> float:
        return max(0.0, self.next - time.monotonic())

    def tick(self, final: bool = False, failed: bool = False) -> None:
        """A line when one is due; ``final``: the last one, always written and ended by a
        newline on a terminal (ends with "(done)", or "(failed)" when the search raised:
        the traceback then starts on a line of its own)."""
        now = time.monotonic()
        if now < self.next and not final:
            return
        nodes = int(self.ctl.array[:, NODES].sum())
        dt = now - self.last_t
        rate = (nodes - self.last_nodes) / dt if dt > 0 else 0.0
        if final:
            rate = nodes / max(now - self.t0, 1e-9)
        self.last_t, self.last_nodes, self.next = now, nodes, now + PROGRESS_S
        fields = ()
        if self.cell is not None:
            v = self.cell.value
            fields = (("incumbent", f"{_signed(v, self.negate):g}" if math.isfinite(v) else "none yet"),)
        state = (State.FAILED if failed else State.DONE) if final else None
        line = progress_text("search", nodes, "nodes", rate=rate, fields=fields,
                             elapsed=now - self.t0, state=state)
        if self.tty:
            self.out.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()
        self.lines += 1


def validate(pilot, children, coordination, spawn_depth: int, budget: int) -> Coordination:
    coord = coordination_of(coordination)
    if not callable(children):
        raise TypeError(f"children must be a function node -> iterable of nodes, got {children!r}")
    # (a bool is an int to isinstance: spawn_depth=True and budget=True ran as 1, where
    # kernel_depth=True and checkpoint_interval=True were refused)
    if not _count_ok(spawn_depth, 0):
        raise ValueError(f"spawn_depth must be an int >= 0, got {spawn_depth!r}")
    if not _count_ok(budget, 1):
        raise ValueError(f"budget must be an int >= 1 (backtracks before a split), got {budget!r}")
    if not hasattr(pilot, "submit") or not hasattr(pilot, "workers"):
        raise TypeError(f"the first argument must be a shoal.Pilot, got {pilot!r}")
    return coord


def _count_ok(value, least: int) -> bool:
    """``value`` is an int (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_count(value, name: str, least: int, what: str = "") -> int:
    """``value`` as an int when it is one of at least ``least``, else a ValueError naming it."""
    if not _count_ok(value, least):
        raise ValueError(f"{name} must be an int >= {least}{what}, got {value!r}")
    return value


def _steals(pilot) -> tuple[int, int, int]:
    """(steals inside a machine, between NUMA nodes, tasks lent between machines) so far."""
    st = pilot.stats()
    ws = st.get("workers", [])
    return (sum(w.get("stolen_local", 0) for w in ws), sum(w.get("stolen_remote", 0) for w in ws),
            st.get("driver", {}).get("moved", 0))


def drive(pilot, root, children, goal: Goal, *, coordination, stats: bool,
          reference_nodes: int | None = None, **spec_kw) -> tuple[Tally, SearchStats]:
    """Run one search to the end on ``pilot``; (merged Tally, SearchStats).

    An exception in the driver while waiting (KeyboardInterrupt) or in a task
    sets the stop flag, so every task unwinds at its next poll; the driver
    waits up to ``STOP_WAIT_S`` for that before re-raising.
    """
    progress = spec_kw.pop("progress", False)
    ck = spec_kw.pop("checkpoint", None)  # a checkpoint.SearchCheckpoint
    check_picklable(root, (), "the root is sent to a worker")
    resumed = ck.load() if ck is not None else None  # takes the checkpoint's writer lock
    # Control is per node (who is hungry *here*); the incumbent and the stop flag are
    # cells, which on a pilot of several machines are kept in step across them
    try:
        ctl = make_control(pilot)
    except BaseException:
        if ck is not None:
            ck.close()
        raise
    owned = [ctl] + ([ck] if ck is not None else [])
    try:
        stop = StopFlag.for_pilot(pilot)
        owned.append(stop)
        cell = None
        if goal is Goal.OPTIMISE:
            # a float never above the exact initial (an int past 2**53): model.floor_float
            cell = shoal.BestCell.for_pilot(
                pilot, "max", initial=floor_float(resume_initial(spec_kw["initial"], resumed)))
            owned.append(cell)
        split = (pilot.nodes > 1 and coordination is not Coordination.SEQUENTIAL
                 and ck is None)
        for key in ("accept", "objective", "bound", "kernel"):
            if spec_kw.get(key) is not None:
                spec_kw[key] = portable(spec_kw[key])
        spec = SearchSpec(root=root, children=portable(children), goal=goal, control=ctl,
                    cell=cell, stop=stop, reserve=split,
                    coordination=coordination, per_depth=stats, **spec_kw)
        before = _steals(pilot) if split or stats else (0, 0, 0)
        # the terminal line (progress=) and the dashboard's records (shoal.publish, always)
        ticker = Ticker("search", _sampler(ctl, cell, goal, coordination, reference_nodes,
                                           bool(spec_kw.get("negate"))),
                        rates=("nodes",))
        prog = Both(ProgressLine.make(progress, ctl, cell, bool(spec_kw.get("negate"))), ticker)
        t0 = time.monotonic()
        try:
            if ck is not None:
                tally = run_checkpointed(pilot, spec, ck, resumed,
                                         lambda pending: stop_all(ctl, stop, pending), prog)
            elif split:
                tally = run_split(pilot, spec, ctl, stop, prog)
            else:
                tally = wait_all([pilot.submit(task, spec, root, ())], ctl, stop, prog)
        except BaseException:
            # the last line says so and ends (a terminal's "\r" line was left open, and the
            # traceback started on it), the dashboard's record says "failed", not "running"
            prog.tick(final=True, failed=True)
            raise
        t_end = time.monotonic()
        prog.tick(final=True)
        after = _steals(pilot) if split or stats else (0, 0, 0)
    finally:
        for obj in owned:
            obj.close()

    def rel(t):
        return None if t is None else max(0.0, t - t0)

    st = SearchStats(
        coordination=coordination, workers=pilot.workers, nodes=tally.nodes,
        pruned=tally.pruned, tasks=tally.tasks, splits=tally.splits,
        per_depth=tuple(tally.per_depth), steals_local=after[0] - before[0],
        steals_remote=after[1] - before[1], elapsed_s=t_end - t0,
        first_incumbent_s=rel(tally.t_first), final_incumbent_s=rel(tally.t_best),
        incumbent_updates=tally.updates,
        stop_latency_s=None if tally.t_hit is None else max(0.0, t_end - tally.t_hit),
        work_inflation=(tally.nodes / reference_nodes) if reference_nodes else None,
        exported=after[2] - before[2],
    )
    return tally, st


def _sampler(ctl, cell, goal: Goal, coordination, reference_nodes, negate: bool):
    """The search's progress record for the dashboard, read from Control and the
    incumbent cell (driver; no message)."""
    def sample() -> dict:
        a = ctl.array
        nodes = int(a[:, NODES].sum())
        rec = {"goal": goal.value, "coordination": coordination.value, "nodes": nodes,
               "tasks": int(a[:, STARTED].sum()),
               "frontier": max(0, int(a[:, SPAWNED].sum() - a[:, STARTED].sum()))}
        if cell is not None:
            rec["incumbent"] = _signed(cell.value, negate)
        if reference_nodes:
            rec["work_inflation"] = round(nodes / reference_nodes, 4)
        return rec
    return sample



def _signed(value: float, negate: bool) -> float:
    """An incumbent in the user's sign: ``minimise`` keeps values negated inside, and the
    negation of an optimum 0 is -0.0, which printed as "incumbent -0"."""
    return (-value if negate else value) + 0.0  # -0.0 + 0.0 == +0.0
