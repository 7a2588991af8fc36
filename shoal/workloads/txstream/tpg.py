"""The task precedence graph of one batch, built whole on every worker (never on the driver).

Data flow: the driver puts the batch's pickled events in shared memory; every
task unpickles them and calls ``build`` — records every transaction (the
event functions are deterministic declarations, so every worker gets the
same operations, numbered 0..n-1 in timestamp order: transaction by
transaction, update by update) and derives, with numpy, the graph's edges:

* temporal: ``prev[o]``, the previous operation on o's key (a per-key
  *operation chain* is the list of a key's operations in timestamp order);
* parametric: for each read of key j by operation o, ``prev_read`` = the last
  operation on j before o (the version o must see), -1 for the batch's base
  value;
* logical: the operations of one transaction are ``txn_start[t] ..
  txn_start[t+1]-1``; they commit or abort together.

Chains are dealt to partitions (one per worker) longest first, in snake
order, so a skewed (Zipf) batch's hot chains spread out.  The plan is
identical in every process, so no partition map is ever sent.

Replicated, and used for chain granularity only: a chain runs where all its
closures are, so the worker running it must have recorded every transaction
touching its keys — here, all of them.  Operation granularity uses split
planning (split.py: each worker records 1/workers of the batch).  The driver's
share of planning is one pickle of the batch either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .policy import Shape
from .txn import record_or_error


@dataclass
class Plan:
    n_txn: int
    n_ops: int
    txn_start: list        # n_txn + 1 offsets
    op_txn: list
    op_gid: list
    op_fn: list
    op_guard: list
    op_reads: list         # per op: tuple of (prev_read_op, gid)
    prev: list             # per op: previous op on the same key, -1 = base value
    chains: list           # per chain: list of ops in timestamp order
    chain_deps: list | None  # per chain: chains whose keys it reads (lazy chain scheduling)
    part_of_chain: np.ndarray
    nparts: int
    bad: dict              # txn -> message: declaration failed (no operations)
    shape: Shape
    gid_array: np.ndarray
    start_array: np.ndarray
    # the reads of op o, flat: read_prev/read_gid[read_start[o]:read_start[o + 1]] (OpExec)
    read_start: list = None
    read_prev: list = None
    read_gid: list = None
    _topo: list | None = None
    _cyclic: bool | None = None

    def part_ops(self, p: int) -> list:
        """Partition p's operations in timestamp order."""
        chain_of = [c for c in range(len(self.chains)) if self.part_of_chain[c] == p]
        ops = [o for c in chain_of for o in self.chains[c]]
        ops.sort()
        return ops

    def part_chains(self, p: int) -> list:
        return [c for c in range(len(self.chains)) if self.part_of_chain[c] == p]

    def topo(self) -> list | None:
        """Chains in a topological order of the read dependencies; None when there is a cycle."""
        if self._cyclic is None:
            self._topo = _kahn(len(self.chains), self.chain_deps)
            self._cyclic = self._topo is None
        return self._topo

    def cyclic(self) -> bool:
        self.topo()
        return bool(self._cyclic)


def build(events: list, layout: dict, nparts: int) -> Plan:
    op_gid, op_fn, op_guard, op_rg, op_txn = [], [], [], [], []
    txn_start = [0]
    bad, guarded = {}, 0
    for t, (fn, ev) in enumerate(events):
        ops, err = record_or_error(fn, ev, layout)
        if err is not None:
            bad[t] = err
        g_any = False
        for gid, f, g, rg in ops:
            op_gid.append(gid)
            op_fn.append(f)
            op_guard.append(g)
            op_rg.append(rg)
            op_txn.append(t)
            g_any = g_any or g is not None
        guarded += g_any
        txn_start.append(len(op_gid))
    n_ops, n_txn = len(op_gid), len(events)
    gid = np.asarray(op_gid, np.int64)
    if n_ops == 0:
        shape = Shape(n_txn, 0, 0, guarded / max(n_txn, 1), 0.0, 0.0, False)
        return Plan(n_txn, 0, txn_start, op_txn, op_gid, op_fn, op_guard, [], [], [], [],
                    np.zeros(0, np.int64), nparts, bad, shape, gid,
                    np.asarray(txn_start, np.int64), [0], [], [])
    order = np.argsort(gid, kind="stable")
    sg = gid[order]
    new = np.empty(n_ops, bool)
    new[0] = True
    new[1:] = sg[1:] != sg[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n_ops)
    chain_sorted = np.cumsum(new) - 1
    chain_of = np.empty(n_ops, np.int64)
    chain_of[order] = chain_sorted
    prev_sorted = np.empty(n_ops, np.int64)
    prev_sorted[0] = -1
    prev_sorted[1:] = order[:-1]
    prev_sorted[new] = -1
    prev = np.empty(n_ops, np.int64)
    prev[order] = prev_sorted
    # parametric edges: the version each read sees
    nreads = np.fromiter((len(r) for r in op_rg), np.int64, n_ops)
    r_op = np.repeat(np.arange(n_ops), nreads)
    r_gid = np.fromiter((g for r in op_rg for g in r), np.int64, int(nreads.sum()))
    m = n_ops + 1
    combined = sg * m + order
    pos = sorted_search(combined, r_gid * m + r_op) - 1
    ok = (pos >= 0) & (sg[np.clip(pos, 0, None)] == r_gid)
    r_prev = np.where(ok, order[np.clip(pos, 0, None)], -1)
    # chains -> partitions: longest first, snake order
    lengths = ends - starts
    n_chains = len(starts)
    by_len = np.argsort(-lengths, kind="stable")
    r = np.arange(n_chains) % (2 * nparts)
    part_of_chain = np.empty(n_chains, np.int64)
    part_of_chain[by_len] = np.where(r < nparts, r, 2 * nparts - 1 - r)
    part_of_op = part_of_chain[chain_of]
    # shape: cross-partition dependencies (reads and multi-partition transactions)
    cross = np.zeros(n_ops, bool)
    has = r_prev >= 0
    np.logical_or.at(cross, r_op[has], part_of_op[r_prev[has]] != part_of_op[r_op[has]])
    ts = np.asarray(txn_start, np.int64)
    nonempty = ts[1:] > ts[:-1]
    if nonempty.any():
        lo = np.minimum.reduceat(part_of_op, ts[:-1][nonempty])
        hi = np.maximum.reduceat(part_of_op, ts[:-1][nonempty])
        multi = np.zeros(n_txn, bool)
        multi[np.flatnonzero(nonempty)] = lo != hi
        cross |= multi[np.asarray(op_txn, np.int64)]
    # chain read dependencies (for chain granularity)
    src = chain_of[r_prev[has]]
    dst = chain_of[r_op[has]]
    keep = src != dst
    deps: list = [[] for _ in range(n_chains)]
    if keep.any():
        pairs = np.unique(np.stack([dst[keep], src[keep]], 1), axis=0)
        for d, s in pairs.tolist():
            deps[d].append(s)
    shape = Shape(n_txn, n_ops, n_chains, guarded / max(n_txn, 1),
                  float(lengths.max()) / n_ops, float(cross.mean()), None)
    reads = []
    rp, rg = r_prev.tolist(), r_gid.tolist()
    i = 0
    for k in nreads.tolist():
        reads.append(tuple(zip(rp[i:i + k], rg[i:i + k], strict=True)))
        i += k
    chains = [order[a:b].tolist() for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    read_start = np.zeros(n_ops + 1, np.int64)
    np.cumsum(nreads, out=read_start[1:])
    return Plan(n_txn, n_ops, txn_start, op_txn, op_gid, op_fn, op_guard, reads, prev.tolist(),
                chains, deps, part_of_chain, nparts, bad, shape, gid, ts, read_start.tolist(),
                rp, rg)


def sorted_search(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``np.searchsorted(sorted_keys, queries, "left")``, with the queries sorted first: the
    binary searches then walk the keys in order, about twice as fast on a batch's reads."""
    if len(queries) < 2:
        return np.searchsorted(sorted_keys, queries, "left")
    order = np.argsort(queries, kind="stable")
    out = np.empty(len(queries), np.int64)
    out[order] = np.searchsorted(sorted_keys, queries[order], "left")
    return out


def _kahn(n: int, deps: list) -> list | None:
    """A topological order of chains 0..n-1 (deps[c] must come first), or None on a cycle."""
    indeg = [len(d) for d in deps]
    users: list = [[] for _ in range(n)]
    for c, ds in enumerate(deps):
        for d in ds:
            users[d].append(c)
    ready = [c for c in range(n) if indeg[c] == 0]
    out = []
    while ready:
        c = ready.pop()
        out.append(c)
        for u in users[c]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    return out if len(out) == n else None


def to_dot(plan: Plan, layout: dict | None = None) -> str:
    """The batch's graph in Graphviz DOT: one node per operation, clustered by transaction;
    temporal edges solid, parametric edges dashed, partitions as fill colours."""
    from .txn import key_name

    colours = ["#cfe8ff", "#ffe2c6", "#d9f2d0", "#f2d0ef"]
    lines = ["digraph tpg {", "  rankdir=LR; node [shape=box, style=filled, fontsize=10];"]
    chain_of = {o: c for c, ops in enumerate(plan.chains) for o in ops}
    for t in range(plan.n_txn):
        a, b = plan.txn_start[t], plan.txn_start[t + 1]
        lines.append(f'  subgraph cluster_t{t} {{ label="txn {t}"; style=dashed;')
        for o in range(a, b):
            key = key_name(layout, plan.op_gid[o]) if layout else f"key {plan.op_gid[o]}"
            fill = colours[int(plan.part_of_chain[chain_of[o]]) % len(colours)]
            guard = " (guard)" if plan.op_guard[o] is not None else ""
            lines.append(f'    o{o} [label="o{o}: {key}{guard}", fillcolor="{fill}"];')
        lines.append("  }")
    for o in range(plan.n_ops):
        if plan.prev[o] >= 0:
            lines.append(f"  o{plan.prev[o]} -> o{o};")
        for q, _ in plan.op_reads[o]:
            if q >= 0:
                lines.append(f"  o{q} -> o{o} [style=dashed];")
    lines.append("}")
    return "\n".join(lines)


def to_mermaid(plan: Plan, layout: dict | None = None) -> str:
    """The same graph as ``to_dot``, as a mermaid flowchart (renders on GitHub)."""
    from .txn import key_name

    chain_of = {o: c for c, ops in enumerate(plan.chains) for o in ops}
    lines = ["flowchart LR"]
    for t in range(plan.n_txn):
        lines.append(f'  subgraph t{t}["txn {t}"]')
        for o in range(plan.txn_start[t], plan.txn_start[t + 1]):
            key = key_name(layout, plan.op_gid[o]) if layout else f"key {plan.op_gid[o]}"
            guard = " guard" if plan.op_guard[o] is not None else ""
            part = int(plan.part_of_chain[chain_of[o]])
            lines.append(f'    o{o}["o{o} {key}{guard}"]:::p{part}')
        lines.append("  end")
    for o in range(plan.n_ops):
        if plan.prev[o] >= 0:
            lines.append(f"  o{plan.prev[o]} --> o{o}")
        for q, _ in plan.op_reads[o]:
            if q >= 0:
                lines.append(f"  o{q} -.-> o{o}")
    lines += ["  classDef p0 fill:#cfe8ff", "  classDef p1 fill:#ffe2c6"]
    return "\n".join(lines)


def example_batch():
    """The batch of docs/txstream.md's figure: three ledger events and two Grep&Sum events."""
    from .apps import gs, sl
    from .txn import Event

    evs = [Event(sl.transfer, {"src": 0, "dst": 1, "amount": 30, "c": 0}),
           Event(sl.deposit, {"acct": 1, "asset": 2, "amount": 5, "value": 5, "c": 0}),
           Event(sl.transfer, {"src": 1, "dst": 0, "amount": 10 ** 12, "c": 0}),
           Event(gs.grep_sum, {"keys": [1, 0], "c": 0, "ok": True}),
           Event(gs.grep_sum, {"keys": [0, 1, 2], "c": 0, "ok": True})]
    layout = {"accounts": (0, 4), "assets": (4, 4), "table": (8, 4)}
    return evs, layout


if __name__ == "__main__":  # python -m shoal.workloads.txstream.tpg: the docs' figure
    _evs, _layout = example_batch()
    print(to_mermaid(build(_evs, _layout, 2), _layout))
