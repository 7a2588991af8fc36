"""Running a batch across hosts: key groups, waves, and the exchange between them.

On a pilot whose workers are on other hosts nothing of the one-host engine
works: the store and the batch area are shared memory of the driver's host,
the claim files are in its /tmp, and tasks wait on each other by spinning on
shared bytes.  This runner shares no memory, path, pid or fd with any host::

    driver: store (the committed copy), the batch's op_state/op_val/txn_abort
      │ 1. one task holds the batch's pickled events and the store's values (dask
      │    hands them to each worker that runs a group, worker to worker, once)
      │ 2. wave w: one task per key group, with the batch's state after wave w-1
      ▼
    worker (any host): the plan of the batch (built once per process, cached),
      runs every pending operation of its group that can run now, in timestamp
      order, one pass; returns what it ran (op, state, value), the transactions it
      aborted and their errors
      │
    driver: merges the groups' results into the batch state; another wave until
      no operation is pending; then installs, as the one-host engine does

**Key groups.** Key ``k`` of a table belongs to group ``k % groups`` (the
index within its table, so the same index of two tables is in one group: a
ledger transfer's account and asset), ``groups`` is fixed for the run (the
pilot's worker count at its start).  The plan decides, never the worker that
runs a task: a group's task may run anywhere and give the same result.

**Waves.** An operation depends only on earlier ones (its key's chain, the
versions it reads, its transaction's earlier operations, the decisions of
earlier transactions), so one pass over a group in timestamp order runs
everything whose inputs are known (an update that fails while an earlier one of
its transaction, in another group, is undecided waits instead: in serial order
that one may abort the transaction first, with a failed guard and no error);
what is left waits on another group's operation, known after the next exchange.  The earliest pending operation of
the batch is always runnable, so every wave runs at least one operation: a
batch takes at most as many waves as its longest chain of dependencies that
changes group; a wave that runs nothing is a bug and raises.  Abort handling
is eager (a transaction's decision is known before a later one reads past it):
lazy speculation would cost a redo round over the hosts.

**Hosts lost.** A wave is a pure function of the batch state before it: only
a task's returned result is merged, so a task lost with its host (dask re-runs
it elsewhere; a second death surfaces as ``shoal.WorkerLost``) is simply
submitted again, up to ``HOST_RETRIES`` times per batch, then the batch fails
with ``HostLost`` naming the host; the store is as of the last punctuation
(nothing is installed before a batch's last wave).  A wave that does not end
within ``stall_timeout`` fails the batch naming its groups.  Nothing waits
unbounded.

Rejected: a store slice and a batch area resident in each host's shared
memory, tasks pinned to their host.  The pilot places tasks by resources
only; a host's memory dies with the host, so recovery needs the driver's
committed copy anyway, re-sent; and segments left on a host by a driver that
died need a sweeper on every host.  Rejected too: the one-host engine's fine
grained hand-off (spinning on another partition's state byte) over the network
— one round trip per cross-group dependency instead of one per wave.  The
price of this design: each wave carries the batch's state arrays (9 bytes per
operation) to every group, and every group's process records the whole batch.
"""

from __future__ import annotations

import concurrent.futures as cf
import socket
import uuid
from dataclasses import dataclass

import numpy as np

import shoal

from . import tpg as _tpg
from .area import DONE, PENDING
from .result import BatchResult, install, settle
from .tpgrun import OpExec
from .txn import OnError, dumps_events, unpicklable

HOST_RETRIES = 3  # resubmissions of lost group tasks per batch before the batch fails
DECISIONS = "op/waves/eager"


class HostLost(RuntimeError):
    """The tasks of a key group were lost with their host more often than ``HOST_RETRIES``."""


class EventsUnavailable(RuntimeError):
    """A host cannot unpickle a batch's events (their functions' module is not there)."""


def key_groups(layout: dict, groups: int) -> np.ndarray:
    """The group of every key of the store: its index within its table, modulo ``groups``."""
    size = max((base + n for base, n in layout.values()), default=0)
    out = np.zeros(size, np.int64)
    for base, n in layout.values():
        out[base:base + n] = np.arange(n) % groups
    return out


@dataclass(frozen=True)
class Wave:
    """What a group's task needs besides the batch's inputs and state (small, picklable)."""

    run_id: str
    batch: int
    group: int
    groups: int
    layout: dict


class _Arrays:
    """The batch state and base values in this process, seen as ``OpExec`` reads a ``Job``."""

    def __init__(self, layout: dict, state: np.ndarray, vals: np.ndarray, abort: np.ndarray,
                 base: np.ndarray):
        self.layout = layout
        self._views = {"op_state": state, "op_val": vals, "txn_abort": abort}
        self.flat = _Base(base)

    def view(self, name: str) -> np.ndarray:
        return self._views[name]


class _Base:
    def __init__(self, array: np.ndarray):
        self.array = array


_PLANS: dict = {}  # (run_id, batch) -> (plan, {group: its operations}): one batch per process


def _plan_of(w: Wave, blob: bytes):
    import pickle

    key = (w.run_id, w.batch)
    entry = _PLANS.get(key)
    if entry is None:
        _PLANS.clear()
        try:
            events = pickle.loads(blob)
        except Exception as exc:  # an event function's module is not on this host
            raise EventsUnavailable(
                f"txstream: batch {w.batch}: its events do not unpickle on host "
                f"{socket.gethostname()!r}: {type(exc).__name__}: {exc} (the modules of the "
                "event functions must be importable on every host: install them there or put "
                "them on the shared filesystem and PYTHONPATH)") from exc
        plan = _tpg.build(events, w.layout, 1)
        entry = _PLANS[key] = (plan, {})
    plan, mine = entry
    if w.group not in mine:
        groups = key_groups(w.layout, w.groups)
        mine[w.group] = np.flatnonzero(groups[plan.gid_array] == w.group).tolist()
    return plan, mine[w.group]


def hold(blob: bytes, base: np.ndarray) -> tuple:
    """The task whose result is a batch's inputs: dask keeps it on a worker and hands it to
    the workers that run the batch's groups, so the driver sends it once per batch."""
    return blob, base


def wave_task(w: Wave, inputs: tuple, state: tuple | None) -> dict:
    """One wave of one key group: run every pending operation of the group whose inputs are
    known (one pass in timestamp order); return what ran.  ``state`` is ``(op_state, op_val,
    txn_abort)`` after the previous wave, None for the first wave (nothing ran yet)."""
    blob, base = inputs
    plan, mine = _plan_of(w, blob)
    if state is None:
        st = np.zeros(plan.n_ops, np.int8)
        val = np.zeros(plan.n_ops, np.int64)
        abort = np.zeros(plan.n_txn, np.int8)
    else:
        st, val, abort = (np.array(a) for a in state)  # writable copies
    before = abort.copy()
    ex = OpExec(plan, _Arrays(w.layout, st, val, abort, np.asarray(base)), eager=True)
    ran = []
    op_txn, txn_start, run, errors = plan.op_txn, plan.txn_start, ex.run, ex.errors
    for o in mine:
        if st[o] != PENDING:
            continue
        t = op_txn[o]
        ahead = PENDING in st[txn_start[t]:o]  # an earlier update of t is not decided yet
        aborting = abort[t]
        if not run(o):
            continue
        if ahead and st[o] != DONE and not aborting:
            # a failure ahead of an undecided earlier update: in serial order that one may
            # abort t first (a failed guard: no error), so this one waits (undone: it wrote
            # only its state, t's abort flag and maybe t's error)
            st[o] = PENDING
            abort[t] = 0
            errors.pop(t, None)
            continue
        ran.append(o)
    ops = np.asarray(ran, np.int64)
    out = {"group": w.group, "host": socket.gethostname(), "ops": ops, "state": st[ops],
           "vals": val[ops], "aborted": np.flatnonzero(abort != before), "errors": ex.errors}
    if state is None:
        out.update(n_ops=plan.n_ops, txn_start=plan.start_array, gid=plan.gid_array,
                   bad=plan.bad if w.group == 0 else {}, digest=_digest(plan))
    return out


def _digest(plan) -> str:
    """What a process recorded of the batch (every operation's key and transaction)."""
    import hashlib

    h = hashlib.sha256(np.ascontiguousarray(plan.start_array, np.int64).tobytes())
    h.update(np.ascontiguousarray(plan.gid_array, np.int64).tobytes())
    return h.hexdigest()


def same_plans(results: list, batch_no: int) -> None:
    """Every group's process recorded the same transactions, else a ValueError (operation
    numbers would mean other operations in other processes: a silently wrong store)."""
    seen = {}
    for r in results:
        seen.setdefault(r["digest"], []).append(r["group"])
    if len(seen) > 1:
        raise ValueError(f"txstream: batch {batch_no}: key groups {sorted(seen.values())} "
                         "recorded different transactions in their processes: an event's fn "
                         "must declare the same accesses every time it is called with the same "
                         "ev (no randomness, no state of its own)")


class HostRunner:
    """The driver's side (``Engine`` uses it when the pilot's workers are on other hosts)."""

    def __init__(self, engine):
        self.e = engine
        self.pilot = engine.pilot
        self.groups = max(1, int(self.pilot.workers))
        self.run_id = uuid.uuid4().hex
        self.hosts: set = set()  # where the last batch's group tasks ran
        self.waves = 0           # how many waves the last batch took

    def close(self) -> None:
        pass

    def run_batch(self, batch: list, seq0: int, batch_no: int) -> BatchResult:
        e, n = self.e, len(batch)
        try:
            blob = dumps_events(batch)
        except Exception as exc:
            raise unpicklable(batch, seq0, exc) from exc
        base = e.store.flat.copy()
        self.hosts, self.waves, lost = set(), 0, 0
        inputs = self.pilot.submit(hold, blob, base)
        waves = [Wave(self.run_id, batch_no, g, self.groups, e.store.layout)
                 for g in range(self.groups)]
        state = None
        meta = None
        while True:
            self.waves += 1
            results, inputs, lost = self._wave(waves, inputs, state, blob, base, lost, batch_no)
            if meta is None:
                same_plans(results, batch_no)
                meta = results[0]
                n_ops = meta["n_ops"]
                st = np.zeros(n_ops, np.int8)
                val = np.zeros(n_ops, np.int64)
                abort = np.zeros(n, np.int8)
                errors: dict = {}
            ran = 0
            for r in results:
                st[r["ops"]] = r["state"]
                val[r["ops"]] = r["vals"]
                abort[r["aborted"]] = 1
                errors.update(r["errors"])
                ran += len(r["ops"])
            if not (st == PENDING).any():
                break
            if ran == 0:
                raise RuntimeError(f"txstream: wave {self.waves} of batch {batch_no} ran no "
                                   "operation across hosts (scheduler bug)")
            state = (st, val, abort)
        txn_start = np.asarray(meta["txn_start"], np.int64)
        committed, cm = settle(txn_start, st, abort, dict(meta["bad"]), errors)
        if not (errors and e.on_error is OnError.STOP):
            install(e.store.flat, np.asarray(meta["gid"], np.int64), val, cm)
        return BatchResult(txn_start, val, committed, errors, DECISIONS, None)

    def _wave(self, waves: list, inputs, state, blob, base, lost: int, batch_no: int):
        """One wave's results (in group order); lost tasks submitted again (a fresh inputs
        task too: it may have been lost with the same host)."""
        todo = list(range(len(waves)))
        results: dict = {}
        while todo:
            futs = {g: self.pilot.submit(wave_task, waves[g], inputs, state) for g in todo}
            done, pending = cf.wait(list(futs.values()), timeout=self.e.stall_timeout)
            if pending:
                for f in pending:
                    f.cancel()
                late = sorted(g for g, f in futs.items() if f in pending)
                raise TimeoutError(
                    f"txstream: batch {batch_no}, wave {self.waves}: key groups {late} did not "
                    f"finish within stall_timeout={self.e.stall_timeout:g} s (a host cut off "
                    "or overloaded?); the store is as of the last punctuation")
            todo = []
            for g, f in futs.items():
                try:
                    results[g] = f.result()
                except shoal.WorkerLost as exc:
                    lost += 1
                    if lost > HOST_RETRIES:
                        raise HostLost(
                            f"txstream: batch {batch_no}: tasks lost with their host "
                            f"{lost} times (last: {exc}); the store is as of the last "
                            "punctuation") from exc
                    todo.append(g)
            if todo:
                inputs = self.pilot.submit(hold, blob, base)
        for r in results.values():
            self.hosts.add(r["host"])
        return [results[g] for g in range(len(waves))], inputs, lost
