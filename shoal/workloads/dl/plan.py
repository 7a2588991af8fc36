"""``dl.Plan``: how one training step is cut into tasks.  Pure policy, no I/O.

A plan fixes everything that decides the arithmetic, so the same plan gives bitwise the
same parameters on 1, 2 or 16 workers and on any backend:

* **replicas** ``R``: each batch is split into ``R`` contiguous shards (``np.array_split``
  boundaries of the batch rows; the last batch of an epoch may be shorter);
* **micro_batches** ``M``: each shard is split again into ``M`` contiguous micro-batches;
  a micro-batch may be empty (a short last batch) and then adds zero gradients;
* **stages** ``S``: the layers are cut into ``S`` contiguous pipeline stages, either given
  (``shards=[[0, 1], [2, 3, 4]]``: layer indices per stage) or balanced by measured layer
  cost (``partition``).  The cut changes which task computes what, never the arithmetic,
  so two cuts of one model give bitwise equal parameters too;
* the **reduction tree** over replicas (``reduction_tree``): pairs ``(0,1), (2,3), ...``
  level by level, fixed by ``R`` alone; the last pair is summed by the optimizer step;
* the gradient of each (replica, stage) is accumulated over micro-batches 0, 1, ... in order.

Rejected: reducing in completion order (fast, but not reproducible: the order
of floating-point sums would depend on timing, pytorch#36871); shards sized by worker
count (results would change with the pilot).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


class Schedule(enum.Enum):
    GPIPE = "gpipe"  # all forwards of a stage, then all backwards
    ONE_F_ONE_B = "1f1b"  # warm-up forwards, then one forward / one backward, then cool-down


class PlanError(ValueError):
    """A plan that cannot run this model (the message names the plan field)."""


def _int_field(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PlanError(f"Plan.{name} must be an int >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Plan:
    replicas: int = 1
    stages: int | None = None  # None: 1, or len(shards) when shards are given
    micro_batches: int = 1
    schedule: str | Schedule = Schedule.ONE_F_ONE_B
    shards: tuple | None = field(default=None)  # explicit layer indices per stage

    def __post_init__(self):
        object.__setattr__(self, "replicas", _int_field("replicas", self.replicas))
        object.__setattr__(self, "micro_batches", _int_field("micro_batches", self.micro_batches))
        try:
            object.__setattr__(self, "schedule", Schedule(self.schedule))
        except ValueError:
            choices = ", ".join(repr(k.value) for k in Schedule)
            raise PlanError(f"Plan.schedule={self.schedule!r} is unknown; choose one of {choices}") from None
        shards = self.shards
        if shards is not None:
            if not isinstance(shards, (list, tuple)) or not shards:
                raise PlanError(f"Plan.shards must be a non-empty list of layer-index lists, got {shards!r}")
            norm = []
            for k, stage in enumerate(shards):
                if not isinstance(stage, (list, tuple, range)) or not len(stage):
                    raise PlanError(f"Plan.shards[{k}] must be a non-empty list of layer indices, got {stage!r}")
                for i in stage:
                    if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                        raise PlanError(f"Plan.shards[{k}] holds {i!r}, not a layer index")
                norm.append(tuple(int(i) for i in stage))
            shards = tuple(norm)
            object.__setattr__(self, "shards", shards)
            if self.stages is not None and _int_field("stages", self.stages) != len(shards):
                raise PlanError(f"Plan.stages={self.stages} but Plan.shards has {len(shards)} stages")
            object.__setattr__(self, "stages", len(shards))
        else:
            object.__setattr__(self, "stages", 1 if self.stages is None else _int_field("stages", self.stages))

    def describe(self) -> dict:
        return {"replicas": self.replicas, "stages": self.stages, "micro_batches": self.micro_batches,
                "schedule": self.schedule.value,
                "shards": None if self.shards is None else [list(s) for s in self.shards]}


def check_shards(shards, n_layers: int) -> list[list[int]]:
    """Explicit stages must cover layers 0..n-1 once each, in order, contiguously."""
    flat = [i for stage in shards for i in stage]
    if flat != list(range(n_layers)):
        for k, stage in enumerate(shards):
            bad = [i for i in stage if not 0 <= i < n_layers]
            if bad:
                raise PlanError(f"Plan.shards[{k}] names layer {bad[0]}, but the model has "
                                f"{n_layers} layers (0..{n_layers - 1})")
        raise PlanError(f"Plan.shards must list layers 0..{n_layers - 1} once each, in order, "
                        f"split into contiguous stages; got {[list(s) for s in shards]}")
    return [list(s) for s in shards]


def partition(costs, stages: int) -> list[list[int]]:
    """Cut layers with these costs into ``stages`` contiguous non-empty groups, minimising the
    most expensive group (dynamic programming; ties go to the earliest cut)."""
    n = len(costs)
    if stages > n:
        raise PlanError(f"Plan.stages={stages} but the model has only {n} layers "
                        "(every stage needs at least one)")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1][i], prefix[j] - prefix[i])
                if v < best[k][j] - 1e-15:
                    best[k][j], cut[k][j] = v, i
    bounds, j = [], n
    for k in range(stages, 0, -1):
        i = cut[k][j]
        bounds.append(list(range(i, j)))
        j = i
    return bounds[::-1]


def splits(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``np.array_split`` boundaries of rows ``lo..hi`` into ``parts`` contiguous pieces."""
    n = hi - lo
    q, r = divmod(n, parts)
    out, start = [], lo
    for k in range(parts):
        stop = start + q + (1 if k < r else 0)
        out.append((start, stop))
        start = stop
    return out


def micro_batches(lo: int, hi: int, replicas: int, micro: int) -> list[list[tuple[int, int]]]:
    """Rows of each (replica, micro-batch) of the batch ``lo..hi``: ``[r][m] -> (start, stop)``."""
    return [splits(a, b, micro) for a, b in splits(lo, hi, replicas)]


def max_micro_rows(batch_size: int, replicas: int, micro: int) -> int:
    shard = -(-batch_size // replicas)
    return -(-shard // micro)


def reduction_tree(replicas: int):
    """The fixed pairwise tree over replica gradients.

    Returns ``(nodes, root)``: ``nodes[k] = (left, right)`` summed into tree node ``k``,
    operands being ``("leaf", r)`` or ``("node", k)``; ``root`` is the list of one or two
    operands the optimizer step sums itself."""
    ops = [("leaf", r) for r in range(replicas)]
    nodes = []
    while len(ops) > 2:
        nxt = []
        for i in range(0, len(ops) - 1, 2):
            nodes.append((ops[i], ops[i + 1]))
            nxt.append(("node", len(nodes) - 1))
        if len(ops) % 2:
            nxt.append(ops[-1])
        ops = nxt
    return nodes, ops
