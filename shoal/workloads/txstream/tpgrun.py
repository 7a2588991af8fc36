"""Running one batch's TPG on a worker: the task the TPG scheduler submits, once per worker.

Each task claims partitions (``area.drive``) and runs them.  Planning is split
(``_split_task`` with ``split.SplitRunner``: each partition records its own
transactions, the graph is assembled in shared memory) unless the batch is
planned for chain granularity (``tpg.build``: the whole plan in every task,
cached per process).  The decisions are a fixed ``TPG``, or ``policy.choose``
on the measured shape: deterministic, so every task picks the same.

One operation ``o`` of transaction ``t`` runs when every version it needs is
known.  The version of key k "as of o" is found by walking k's chain back
from the last operation before o (``prev``/``prev_read``):

* eager: a predecessor of t itself must be DONE (else t is aborting: o is
  SKIPPED); a predecessor of another transaction counts once that transaction
  has decided — committed (all its operations DONE: read it) or aborted (skip
  it, walk on);
* lazy: any DONE predecessor counts (speculation); FAILED ones are skipped.

No chain walk ever goes forward in timestamp order, so the earliest pending
operation of the batch is always runnable: whatever order the runners take,
the batch finishes (the deadlock-freedom argument; ``drive`` adds that every
partition is held by a running task).

Runners: ``OpStructured`` walks its partition's operations in timestamp order
and stops at the first blocked one; ``OpFree`` (non-structured) runs, past a
blocked one, any of the next operations whose inputs are ready; ``ChainStructured``/``ChainFree`` treat a chain as
the unit: it starts once every chain it reads from is done, then runs without
a single check (lazy only; the chain graph must be acyclic).
"""

from __future__ import annotations

import time

import numpy as np

from . import tpg as _tpg
from .area import DONE, FAILED, PENDING, SKIPPED, Job, drive, load_events
from .policy import AbortHandling, Exploration, Granularity, choose
from .txn import Guarded, apply, describe, key_name

_NOT_READY = object()
_ABORTING = object()
_CACHE: dict = {}  # (run_id, batch) -> plan: the redo phase of a batch reuses it


def load_plan(job: Job):
    key = (job.run_id, job.batch)
    plan = _CACHE.get(key)
    if plan is None:
        _CACHE.clear()
        events = load_events(job)
        plan = _tpg.build(events, job.layout, job.nparts)
        _CACHE[key] = plan
    return plan


class OpExec:
    """Runs single operations of one plan against the shared arrays."""

    def __init__(self, plan, job: Job, eager: bool):
        self.plan = plan
        self.job = job
        self.eager = eager
        a = job.view
        self.st = memoryview(a("op_state"))
        self.val = memoryview(a("op_val"))
        self.abort = memoryview(a("txn_abort"))
        self.base = memoryview(job.flat.array)
        self.decided = bytearray(plan.n_txn)  # 1: known committed (local cache)
        self.blocked_on = -1  # after run() returned False: a PENDING operation it waits for
        self.errors: dict = {}

    def committed(self, t):
        """True / False (aborted) / None (undecided) for transaction t."""
        if self.decided[t]:
            return True
        if self.abort[t]:
            return False
        st = self.st
        ts = self.plan.txn_start
        for x in range(ts[t], ts[t + 1]):
            s = st[x]
            if s != DONE:
                if s == PENDING:
                    self.blocked_on = x
                    return None
                return False
        self.decided[t] = 1
        return True

    def version(self, q, gid, t):
        """The value of key gid seen by an operation of t whose predecessor there is q."""
        st, val, prev, otx = self.st, self.val, self.plan.prev, self.plan.op_txn
        if self.eager:
            while q >= 0:
                s = st[q]
                if s == PENDING:
                    self.blocked_on = q
                    return _NOT_READY
                if otx[q] == t:
                    return val[q] if s == DONE else _ABORTING
                if s == DONE:
                    c = self.committed(otx[q])
                    if c is None:
                        return _NOT_READY
                    if c:
                        return val[q]
                q = prev[q]
        else:
            while q >= 0:
                s = st[q]
                if s == DONE:
                    return val[q]
                if s == PENDING:
                    self.blocked_on = q
                    return _NOT_READY
                q = prev[q]
        return self.base[gid]

    def run(self, o) -> bool:
        """Run operation o if its inputs are known; False if it must wait."""
        plan = self.plan
        t = plan.op_txn[o]
        if self.eager and self.abort[t]:
            self.st[o] = SKIPPED
            return True
        q = plan.prev[o]
        v = self.base[plan.op_gid[o]] if q < 0 else self.version(q, plan.op_gid[o], t)
        if v is _NOT_READY:
            return False
        vals = [v]
        rs = plan.read_start
        a, b = rs[o], rs[o + 1]
        if b > a:
            rp, rg, base = plan.read_prev, plan.read_gid, self.base
            for j in range(a, b):
                q = rp[j]
                w = base[rg[j]] if q < 0 else self.version(q, rg[j], t)
                if w is _NOT_READY:
                    return False
                if w is _ABORTING:
                    v = w
                    break
                vals.append(w)
        if v is _ABORTING:
            self.abort[t] = 1
            self.st[o] = SKIPPED
            return True
        try:
            new = apply(plan.op_fn[o], plan.op_guard[o], vals)
        except Guarded:
            self.abort[t] = 1
            self.st[o] = FAILED
            return True
        except Exception as exc:
            k = o - plan.txn_start[t]
            self.errors[t] = describe(exc, f"update {k} ({key_name(self.job.layout, plan.op_gid[o])})")
            self.abort[t] = 1
            self.st[o] = FAILED
            return True
        self.val[o] = new
        self.st[o] = DONE
        return True


class OpStructured:
    """Structured: the partition's operations in timestamp order, stopping at the first that
    must wait.  ``wait``: the PENDING operation the head waited for last time; while it is
    still PENDING the head is not tried again (the same walk would stop at it: every state
    it passed on the way is final for the phase)."""

    def __init__(self, ex: OpExec, ops: list):
        self.ex, self.ops, self.i = ex, ops, 0
        self.wait = -1
        self.finished = not ops

    def step(self) -> bool:
        ex = self.ex
        if self.wait >= 0 and ex.st[self.wait] == PENDING:
            return False
        ops, run, i, n = self.ops, ex.run, self.i, len(self.ops)
        start = i
        ex.blocked_on = -1
        while i < n and run(ops[i]):
            i += 1
        self.wait = ex.blocked_on if i < n else -1
        self.i = i
        self.finished = i == n
        return i > start


class OpFree:
    """Non-structured: the partition's operations in timestamp order, but a blocked one does
    not stop the worker — it runs any of the ``WINDOW`` oldest operations not run yet
    (``todo``, ascending) whose inputs are ready.  The oldest pending operation is always in
    the window, so the partition finishes; a step costs O(``WINDOW``) however many later
    operations already ran.  An operation that had to wait is not tried again while the
    operation it waited for (``wait``) is PENDING (as in ``OpStructured``).  (Rejected:
    rescanning every chain after each step — with thousands of chains blocked on another
    worker that is O(chains) per operation; a window over positions rather than over the
    operations not run yet — every step then walked again over all the ones run since the
    oldest blocked one, which made skewed batches quadratic.)"""

    WINDOW = 64

    def __init__(self, ex: OpExec, ops: list):
        self.ex, self.ops = ex, ops
        self.todo: list = []   # positions in ops, ascending: the window
        self.next = 0          # the first position not in the window yet
        self.wait: dict = {}   # position -> the PENDING operation it waited for
        self.finished = not ops

    def step(self) -> bool:
        ops, todo, wait, n = self.ops, self.todo, self.wait, len(self.ops)
        ex = self.ex
        st, prev, run = ex.st, ex.plan.prev, ex.run
        nxt = self.next
        while len(todo) < self.WINDOW and nxt < n:
            todo.append(nxt)
            nxt += 1
        self.next = nxt
        keep = []
        for j in todo:
            w = wait.get(j, -1)
            if w >= 0 and st[w] == PENDING:
                keep.append(j)
                continue
            o = ops[j]
            p = prev[o]
            if p >= 0 and st[p] == PENDING:
                wait[j] = p
                keep.append(j)
                continue
            ex.blocked_on = -1
            if run(o):
                wait.pop(j, None)
            else:
                wait[j] = ex.blocked_on
                keep.append(j)
        progressed = len(keep) < len(todo)
        self.todo = keep
        self.finished = not keep and nxt == n
        return progressed


class ChainRunner:
    """Chain granularity (lazy): a chain runs whole once the chains it reads from are done."""

    def __init__(self, ex: OpExec, chains: list, structured: bool):
        self.ex = ex
        self.todo = list(chains)
        self.structured = structured
        self.done = memoryview(ex.job.view("chain_done"))
        self.finished = not self.todo

    def _ready(self, c) -> bool:
        done = self.done
        return all(done[d] for d in self.ex.plan.chain_deps[c])

    def _run(self, c) -> None:
        run = self.ex.run
        for o in self.ex.plan.chains[c]:
            if not run(o):  # cannot happen on an acyclic chain graph: a bug, not a wait
                raise RuntimeError(f"txstream: chain {c} found operation {o} blocked")
        self.done[c] = 1

    def step(self) -> bool:
        progressed = False
        if self.structured:
            while self.todo and self._ready(self.todo[0]):
                self._run(self.todo.pop(0))
                progressed = True
        else:
            left = []
            for c in self.todo:
                if self._ready(c):
                    self._run(c)
                    progressed = True
                else:
                    left.append(c)
            self.todo = left
        self.finished = not self.todo
        return progressed


def tpg_task(job: Job, slot: int) -> dict:
    """One worker's share of a batch (or of its lazy-abort redo, ``job.start_txn > 0``)."""
    if job.extra.get("mode") == "split":
        return _split_task(job, slot)
    t0 = time.perf_counter()
    plan = load_plan(job)
    t_plan = time.perf_counter() - t0
    if plan.n_ops > job.view("op_state").shape[0] or plan.n_txn >= job.view("txn_abort").shape[0]:
        return {"need_ops": plan.n_ops, "need_txns": plan.n_txn + 1}
    redo = job.extra.get("redo", False)
    if redo:
        decision = choose(plan.shape, 1.0)  # eager, operation granularity
    elif job.tpg is not None:
        decision = job.tpg
    else:
        decision = choose(plan.shape, job.expected_abort, plan.cyclic)
    gran = decision.granularity
    if gran is Granularity.CHAIN and (plan.cyclic()):
        gran = Granularity.OP  # cyclic chain dependencies: fall back to operations
    eager = decision.abort is AbortHandling.EAGER or redo
    structured = decision.exploration is Exploration.STRUCTURED
    ex = OpExec(plan, job, eager)
    first_op = plan.txn_start[job.start_txn] if redo else 0
    topo_rank = None
    if gran is Granularity.CHAIN:
        topo_rank = {c: i for i, c in enumerate(plan.topo())}

    def make(p):
        if p == 0 and not redo:
            n = plan.n_ops
            job.view("meta_gid")[:n] = plan.gid_array
            job.view("meta_start")[:plan.n_txn + 1] = plan.start_array
        if gran is Granularity.CHAIN:
            chains = sorted(plan.part_chains(p), key=topo_rank.__getitem__)
            return ChainRunner(ex, chains, structured)
        if structured:
            return OpStructured(ex, [o for o in plan.part_ops(p) if o >= first_op])
        return OpFree(ex, [o for o in plan.part_ops(p) if o >= first_op])

    counters: dict = {}
    t1 = time.perf_counter()
    parts = drive(job, slot, make, counters)
    used = f"{gran.value}/{decision.exploration.value}/{'eager' if eager else 'lazy'}"
    return {"parts": parts, "errors": ex.errors, "bad": plan.bad if 0 in parts else {},
            "n_ops": plan.n_ops, "n_txn": plan.n_txn, "decisions": used,
            "shape": plan.shape if 0 in parts else None, "plan_s": t_plan,
            "run_s": time.perf_counter() - t1, "waits": counters.get("waits", 0)}


class _SplitTask:
    """A task's shared context for split planning (split.py): events, the graph, the decision."""

    def __init__(self, job: Job):
        self.job = job
        self.redo = job.extra.get("redo", False)
        self.n_txn = job.extra["n"]
        self.bad: dict = {}
        self.need: dict | None = None
        self._sized = None
        self.g = None
        self.ex = None
        self.decision = None
        self.first_op = 0
        self.times: dict = {}  # section (record, publish, assemble, run) -> (wall, CPU) s in this task

    def sized(self) -> bool:
        """After barrier 1: the global offsets, and whether the shared arrays are big enough."""
        if self._sized is None:
            job, n = self.job, self.n_txn
            self.starts = np.zeros(n + 1, np.int64)
            np.cumsum(job.view("txn_nops")[:n], out=self.starts[1:])
            self.rstarts = np.zeros(n + 1, np.int64)
            np.cumsum(job.view("txn_nreads")[:n], out=self.rstarts[1:])
            n_ops, n_reads = int(self.starts[-1]), int(self.rstarts[-1])
            self._sized = (n_ops <= job.view("op_state").shape[0]
                           and n_reads <= job.view("read_gid").shape[0])
            if not self._sized:
                self.need = {"need_ops": n_ops, "need_txns": n + 1, "need_reads": n_reads}
        return self._sized

    def graph(self):
        if self.g is None:
            from .split import Global

            job = self.job
            self.g = g = Global(job, self.n_txn)
            if self.redo:
                d = choose(g.shape, 1.0)
            elif job.tpg is not None:
                d = job.tpg
            else:
                d = choose(g.shape, job.expected_abort, lambda: True)  # chains: next batch
            self.decision = d
            self.eager = d.abort is AbortHandling.EAGER or self.redo
            self.ex = OpExec(g, job, self.eager)
            self.first_op = g.txn_start[job.start_txn] if self.redo else 0
        return self.g

    def runner(self, ops: list):
        if self.decision.exploration is Exploration.STRUCTURED:
            return OpStructured(self.ex, ops)
        return OpFree(self.ex, ops)


def _split_task(job: Job, slot: int) -> dict:
    from .split import SplitRunner

    task = _SplitTask(job)
    counters: dict = {}
    t1 = time.perf_counter()
    parts = drive(job, slot, lambda p: SplitRunner(task, p), counters)
    if task.need is not None:
        return task.need
    out = {"parts": parts, "errors": task.ex.errors if task.ex else {}, "bad": task.bad,
           "n_txn": task.n_txn, "plan_s": 0.0, "run_s": time.perf_counter() - t1,
           "waits": counters.get("waits", 0), "times": task.times}
    if task.g is not None:
        g, d = task.g, task.decision
        out["n_ops"] = g.n_ops
        out["decisions"] = f"op/{d.exploration.value}/{'eager' if task.eager else 'lazy'}"
        out["shape"] = g.shape
        lazy_next = not task.eager and g.shape.chains and g.shape.ops / g.shape.chains >= 2.0
        out["chain_hint"] = bool(lazy_next and 0 in parts and g.chain_ok())
    return out
