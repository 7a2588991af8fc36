"""The two baselines MorphStream is measured against, on the same pilot and shared memory.

``"2pl"`` — ordered two-phase locking.  Transaction t runs on partition
``t % workers``; it takes a lock on every key it touches (updates and reads)
and runs in place on the store.  Locks are granted in stream order: key k's
counter (``Area.lock[k]``) is the number of earlier transactions on k that
released it, so t holds k when the counter equals t's rank among k's
transactions.  Growing phase: all locks; shrinking phase: all released at
commit/abort (counter + 1, written only by the holder).  Waits only ever go to
earlier transactions: no deadlock.

``"partitioned"`` — S-Store/H-Store style.  Keys are dealt to partitions by
``key % workers`` within each table; a partition runs the transactions
touching it one by one in stream order.  A multi-partition transaction is
run by its lowest partition (the coordinator) once every other partition it
touches has stopped at it (``Area.lock[p]`` = the position of partition p's
cursor); they go on when the coordinator marks it done (``txn_done``).

Both apply a transaction's updates to an overlay and write the store only at
commit, so an aborted transaction leaves no trace.  Recording is replicated
on every task, as for the TPG (tpg.py says why).
"""

from __future__ import annotations

from .area import DONE, FAILED, Job, drive, load_events
from .txn import Guarded, apply, describe, key_name, record_or_error

_CACHE: dict = {}


class TxnPlan:
    def __init__(self, events, layout, nparts, partitioned):
        self.ops, self.keys, self.bad, self.txn_start = [], [], {}, [0]
        gids = []
        for t, (fn, ev) in enumerate(events):
            ops, err = record_or_error(fn, ev, layout)
            if err is not None:
                self.bad[t] = err
            self.ops.append(ops)
            ks = set()
            for gid, _, _, rg in ops:
                ks.add(gid)
                ks.update(rg)
                gids.append(gid)
            self.keys.append(sorted(ks))
            self.txn_start.append(len(gids))
        self.gids = gids
        self.n_txn, self.n_ops = len(events), len(gids)
        if partitioned:
            bases = sorted(b for b, _ in layout.values())

            def part(g):
                lo = 0
                for b in bases:
                    if b <= g:
                        lo = b
                return (g - lo) % nparts

            self.parts = [sorted({part(g) for g in ks}) for ks in self.keys]
            self.lists: list = [[] for _ in range(nparts)]
            self.pos: list = [{} for _ in range(self.n_txn)]
            for t, ps in enumerate(self.parts):
                for p in ps:
                    self.pos[t][p] = len(self.lists[p])
                    self.lists[p].append(t)
        else:
            count: dict = {}
            self.ranks = []
            for ks in self.keys:
                r = []
                for k in ks:
                    c = count.get(k, 0)
                    r.append((k, c))
                    count[k] = c + 1
                self.ranks.append(r)


def load(job: Job) -> TxnPlan:
    key = (job.run_id, job.batch)
    plan = _CACHE.get(key)
    if plan is None:
        _CACHE.clear()
        events = load_events(job)
        plan = TxnPlan(events, job.layout, job.nparts, job.kind == "partitioned")
        _CACHE[key] = plan
    return plan


class _InPlace:
    def __init__(self, plan: TxnPlan, job: Job):
        self.plan, self.job = plan, job
        a = job.view
        self.flat = memoryview(job.flat.array)
        self.st = memoryview(a("op_state"))
        self.val = memoryview(a("op_val"))
        self.abort = memoryview(a("txn_abort"))
        self.lock = memoryview(job.view("lock"))
        self.done = memoryview(a("txn_done"))
        self.errors: dict = {}

    def run_txn(self, t) -> None:
        flat, val, st = self.flat, self.val, self.st
        start = self.plan.txn_start[t]
        overlay: dict = {}
        for i, (gid, f, g, rg) in enumerate(self.plan.ops[t]):
            vs = [overlay[gid] if gid in overlay else flat[gid]]
            for r in rg:
                vs.append(overlay[r] if r in overlay else flat[r])
            try:
                new = apply(f, g, vs)
            except Guarded:
                self.abort[t] = 1
                st[start + i] = FAILED
                return
            except Exception as exc:
                self.errors[t] = describe(exc, f"update {i} ({key_name(self.job.layout, gid)})")
                self.abort[t] = 1
                st[start + i] = FAILED
                return
            overlay[gid] = new
            val[start + i] = new
        for gid, v in overlay.items():
            flat[gid] = v
        for o in range(start, self.plan.txn_start[t + 1]):
            st[o] = DONE


class TwoPL:
    def __init__(self, ex: _InPlace, p: int):
        self.ex = ex
        self.txns = [t for t in range(p, ex.plan.n_txn, ex.job.nparts) if t not in ex.plan.bad]
        self.i = 0
        self.finished = not self.txns

    def step(self) -> bool:
        ex, lock, ranks, txns = self.ex, self.ex.lock, self.ex.plan.ranks, self.txns
        start = self.i
        while self.i < len(txns):
            t = txns[self.i]
            if not all(lock[k] == r for k, r in ranks[t]):  # growing phase: all or wait
                break
            ex.run_txn(t)
            for k, _ in ranks[t]:  # shrinking phase
                lock[k] += 1
            self.i += 1
        self.finished = self.i == len(txns)
        return self.i > start


class Partition:
    def __init__(self, ex: _InPlace, p: int):
        self.ex, self.p = ex, p
        self.txns = ex.plan.lists[p]
        self.i = 0
        self.finished = not self.txns

    def step(self) -> bool:
        ex, p, lock, done = self.ex, self.p, self.ex.lock, self.ex.done
        parts, pos = ex.plan.parts, ex.plan.pos
        start = self.i
        while self.i < len(self.txns):
            t = self.txns[self.i]
            lock[p] = self.i  # "partition p stands at its i-th transaction"
            ps = parts[t]
            if len(ps) > 1:
                if p == ps[0]:
                    if not all(lock[q] == pos[t][q] for q in ps[1:]):
                        break
                    ex.run_txn(t)
                    done[t] = 1
                elif not done[t]:
                    break
            else:
                ex.run_txn(t)
            self.i += 1
        lock[p] = self.i
        self.finished = self.i == len(self.txns)
        return self.i > start


def locking_task(job: Job, slot: int) -> dict:
    plan = load(job)
    if plan.n_ops > job.view("op_state").shape[0] or plan.n_txn >= job.view("txn_abort").shape[0]:
        return {"need_ops": plan.n_ops, "need_txns": plan.n_txn + 1}
    ex = _InPlace(plan, job)
    cls = Partition if job.kind == "partitioned" else TwoPL

    def make(p):
        if p == 0:
            job.view("meta_gid")[:plan.n_ops] = plan.gids
            job.view("meta_start")[:plan.n_txn + 1] = plan.txn_start
        return cls(ex, p)

    parts = drive(job, slot, make)
    return {"parts": parts, "errors": ex.errors, "bad": plan.bad if 0 in parts else {},
            "n_ops": plan.n_ops, "n_txn": plan.n_txn, "decisions": job.kind, "shape": None}
