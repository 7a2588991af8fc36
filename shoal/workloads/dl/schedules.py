"""Pipeline schedules and the task graph of one training step.  Pure policy, no I/O.

Each (replica, stage) behaves like one pipeline device: it runs its operations in the
order its schedule gives, one after another (each op depends on the previous one).

* **GPipe**: ``F0 F1 ... F(M-1) B0 B1 ... B(M-1)``.
* **1F1B**: stage ``s`` of ``S`` first runs ``min(S-s-1, M)`` warm-up forwards, then
  alternates one forward and one backward, then drains the backwards.  It bounds the
  activations in flight per stage to ``S-s`` instead of ``M``.

Backwards run in micro-batch order in both, so a stage accumulates its gradient as
``g0 + g1 + ...`` in the same order whatever the schedule: GPipe and 1F1B give bitwise
equal parameters.  On the last stage a forward directly followed by its own backward
becomes one task (``FORWARD_BACKWARD``: forward, loss, backward without storing and
re-reading the activations).  The data dependencies are: ``F(s,m)`` after
``F(s-1,m)``; ``B(s,m)`` after ``B(s+1,m)``; each stage's first op after the previous
step's update of that stage (all its slices); the reduction tree after the replicas'
last backwards; the update after the root of the tree.

``step_graph`` emits the nodes in the order of a simulated clock (every device runs its
next op as soon as that op's inputs were produced in an earlier tick), which is a
topological order: the trainer submits in that order, so every dependency is a future
that exists already.  A schedule that cannot make progress raises ``PlanError`` instead
of hanging (M < S and M = 1 are fine: torchtitan#775, PiPPy#1064 hung there).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .plan import PlanError, Schedule, reduction_tree


class OpKind(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    FORWARD_BACKWARD = "forward_backward"  # last stage: forward, loss, backward in one task
    REDUCE = "reduce"  # one node of the replica reduction tree
    UPDATE = "update"  # optimizer step of one stage


@dataclass(frozen=True)
class Node:
    kind: OpKind
    replica: int  # -1 for REDUCE/UPDATE
    stage: int
    index: int  # micro-batch, tree node for REDUCE, parameter slice for UPDATE
    deps: tuple  # indices of earlier nodes of this step
    after_update: bool  # also depends on the previous step's UPDATE of this stage
    tick: int  # simulated time of the op (F and B take one tick each)
    operands: tuple = ()  # REDUCE / UPDATE: ("leaf", r) / ("node", k)


def stage_ops(schedule: Schedule, stages: int, micro: int, stage: int) -> list[tuple[str, int]]:
    """The order of forward ("F") and backward ("B") ops of one stage."""
    if schedule is Schedule.GPIPE:
        return [("F", m) for m in range(micro)] + [("B", m) for m in range(micro)]
    warm = min(stages - stage - 1, micro)
    ops = [("F", m) for m in range(warm)]
    for i in range(micro - warm):
        ops += [("F", warm + i), ("B", i)]
    ops += [("B", m) for m in range(micro - warm, micro)]
    return ops


def slots(schedule: Schedule, stages: int, micro: int, stage: int) -> int:
    """Activation buffers stage ``stage`` needs: the micro-batches it can have in flight.

    Micro-batch ``m`` uses buffer ``m % slots``: its stored layer inputs, its output (read
    by the next stage) and the gradient of its output.  The schedule orders every reuse
    after the last use of the buffer's previous micro-batch ``m - slots``: stage ``s``
    runs ``F(m)`` after ``B(m - slots)`` (1F1B: ``slots = S - s``, the warm-up plus one);
    the next stage's ``F(m)`` and ``B(m)`` come before this stage's ``B(m)``; the next
    stage's ``B(m + slots)`` needs this stage's ``F(m + slots)``, so it follows this
    stage's ``B(m)``.  tests/dl/test_dl_plan.py checks this on the graph for every small
    plan.  GPipe keeps all M micro-batches in flight."""
    schedule = Schedule(schedule)
    if schedule is Schedule.GPIPE:
        return micro
    return min(micro, stages - stage)


def _device_ops(schedule, stages, micro, s):
    ops = stage_ops(schedule, stages, micro, s)
    if s != stages - 1:
        return [(OpKind.FORWARD if k == "F" else OpKind.BACKWARD, m) for k, m in ops]
    out, i = [], 0
    while i < len(ops):  # fuse F(m) B(m) on the last stage
        k, m = ops[i]
        if k == "F" and i + 1 < len(ops) and ops[i + 1] == ("B", m):
            out.append((OpKind.FORWARD_BACKWARD, m))
            i += 2
        else:
            out.append((OpKind.FORWARD if k == "F" else OpKind.BACKWARD, m))
            i += 1
    return out


def step_graph(replicas: int, stages: int, micro: int, schedule: Schedule,
               chunks: int = 1, fuse_update: bool = False) -> list[Node]:
    """All tasks of one step, in a topological (submission) order.

    The update of each stage is ``chunks`` tasks, each on one contiguous slice of the
    stage's parameters (the optimizer is elementwise, so slicing changes no bit).  With
    ``fuse_update`` (at most 2 replicas: no reduction tree) there are no UPDATE nodes:
    the last op of each (replica, stage) — its backward of the last micro-batch — also
    updates the stage when it is the last of the stage's replicas to get there
    (``program.Program._arrive``), and the next step waits for those ops instead: one
    hop through the driver per step instead of two."""
    if fuse_update and replicas > 2:
        raise PlanError(f"fuse_update needs at most 2 replicas (no reduction tree), got {replicas}")
    schedule = Schedule(schedule)
    devices = {(r, s): _device_ops(schedule, stages, micro, s)
               for r in range(replicas) for s in range(stages)}
    for s in range(stages):
        backs = [m for k, m in devices[(0, s)] if k is not OpKind.FORWARD]
        if backs != list(range(micro)):
            raise PlanError(f"schedule {schedule.value}: stage {s} runs backwards in order {backs}")
    pos = {key: 0 for key in devices}
    done: dict[tuple, int] = {}  # (kind letter, r, s, m) -> node index
    tick_of: dict[int, int] = {}
    nodes: list[Node] = []
    remaining = sum(len(v) for v in devices.values())
    tick = 0
    while remaining:
        ready = []
        for (r, s), ops in devices.items():
            if pos[(r, s)] == len(ops):
                continue
            kind, m = ops[pos[(r, s)]]
            needs = []
            if kind in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD) and s > 0:
                needs.append(("F", r, s - 1, m))
            if kind is OpKind.BACKWARD:
                needs.append(("F", r, s, m))
                if s < stages - 1:
                    needs.append(("B", r, s + 1, m))
            if kind is OpKind.FORWARD_BACKWARD and s < stages - 1:  # pragma: no cover - never fused
                needs.append(("B", r, s + 1, m))
            if all(n in done and tick_of[done[n]] < tick for n in needs):
                ready.append(((r, s), kind, m, [done[n] for n in needs]))
        if not ready:
            stuck = {k: v[pos[k]] for k, v in devices.items() if pos[k] < len(v)}
            raise PlanError(f"schedule {schedule.value} with stages={stages}, micro_batches={micro} "
                            f"cannot progress; waiting ops: {stuck}")
        for (r, s), kind, m, deps in ready:
            chain = [] if pos[(r, s)] == 0 else [done[("last", r, s)]]
            idx = len(nodes)
            nodes.append(Node(kind, r, s, m, tuple(sorted(set(deps + chain))), pos[(r, s)] == 0, tick))
            tick_of[idx] = tick
            if kind in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD):
                done[("F", r, s, m)] = idx
            if kind in (OpKind.BACKWARD, OpKind.FORWARD_BACKWARD):
                done[("B", r, s, m)] = idx
            done[("last", r, s)] = idx
            pos[(r, s)] += 1
            remaining -= 1
        tick += 1
    if fuse_update:
        return nodes
    tree, root = reduction_tree(replicas)
    for s in range(stages):
        ref: dict = {("leaf", r): done[("last", r, s)] for r in range(replicas)}
        for k, (a, b) in enumerate(tree):
            idx = len(nodes)
            nodes.append(Node(OpKind.REDUCE, -1, s, k, (ref[a], ref[b]), False, tick, (a, b)))
            ref[("node", k)] = idx
        for k in range(chunks):
            nodes.append(Node(OpKind.UPDATE, -1, s, k, tuple(ref[o] for o in root), False, tick,
                              tuple(root)))
    return nodes


def ideal_bubble(stages: int, micro: int) -> float:
    """The idle fraction of a synchronous pipeline with equal stage times: (S-1)/(M+S-1)."""
    return (stages - 1) / (micro + stages - 1)
