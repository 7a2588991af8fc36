"""The TPG scheduler's three decisions and the adaptive choice: pure policy, no I/O.

MorphStream (SIGMOD 2023) adapts, per batch, *granularity* (schedule single
operations, or whole per-key operation chains), *exploration* (structured:
each worker walks its operations in timestamp order and waits at the first
unmet dependency; non-structured: it runs whichever of its chains is ready)
and *abort handling* (eager: an operation waits until the transactions it
reads from have decided, and a failing guard marks its transaction aborted at
once so its other operations never run; lazy: operations read speculatively
as if every transaction commits, and a batch that saw an abort re-runs its
tail from the first aborted transaction eagerly).

``choose(shape, expected_abort_ratio)`` maps the measured shape of a batch
(built on the workers, ``tpg.Shape``) and the abort ratio measured on the
previous batch to the three decisions:

* abort: lazy when fewer than half an abort is expected in the batch (no
  guards at all in a first batch); a lazy batch that does abort pays a redo of
  its tail, so at any real abort rate eager wins.
* granularity: chains only when abort is lazy (with eager abort every
  multi-key transaction is a two-way chain dependency: a cycle), the chain
  graph is acyclic (GS's random reads usually make it cyclic: fall back to
  operations) and chains are long enough to be worth treating as a unit.
  Chains need the replicated plan (tpg.py) and operations the split one
  (split.py), and the plan is built before the batch's shape is known, so the
  engine plans a batch for chains when the *previous* batch's shape chose them
  (like the abort ratio, the previous batch predicts the next).
* exploration: non-structured when enough operations depend on another
  worker's partition that waiting in timestamp order would idle the worker;
  structured (cheaper bookkeeping) otherwise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Granularity(enum.Enum):
    OP = "op"
    CHAIN = "chain"


class Exploration(enum.Enum):
    STRUCTURED = "structured"
    NONSTRUCTURED = "nonstructured"


class AbortHandling(enum.Enum):
    EAGER = "eager"
    LAZY = "lazy"


@dataclass(frozen=True)
class TPG:
    """A fixed choice of the three decisions (``scheduler=ts.TPG(...)``); "adaptive" picks per batch."""

    granularity: Granularity | str = Granularity.OP
    exploration: Exploration | str = Exploration.NONSTRUCTURED
    abort: AbortHandling | str = AbortHandling.EAGER

    def __post_init__(self):
        object.__setattr__(self, "granularity", Granularity(self.granularity))
        object.__setattr__(self, "exploration", Exploration(self.exploration))
        object.__setattr__(self, "abort", AbortHandling(self.abort))
        if self.granularity is Granularity.CHAIN and self.abort is AbortHandling.EAGER:
            raise ValueError("chain granularity needs lazy abort handling: with eager abort every "
                             "multi-key transaction makes two chains wait on each other's decision")

    def __str__(self) -> str:
        return f"{self.granularity.value}/{self.exploration.value}/{self.abort.value}"


@dataclass(frozen=True)
class Shape:
    """What the workers measured of one batch's graph (identical on every worker)."""

    txns: int
    ops: int
    chains: int
    guarded: float       # fraction of transactions with a guard
    hot: float           # operations on the busiest key / all operations (skew)
    cross: float         # fraction of operations depending on another partition
    cyclic: bool | None  # chain graph has a cycle (None: not computed)


MIN_CHAIN = 2.0      # mean operations per chain below which chains are not worth it
CROSS_NS = 0.05      # cross-partition dependency ratio above which exploration is non-structured


def choose_abort(shape: Shape, expected_abort_ratio: float | None) -> AbortHandling:
    if expected_abort_ratio is None:  # first batch: only guards abort on purpose
        return AbortHandling.LAZY if shape.guarded == 0 else AbortHandling.EAGER
    return AbortHandling.LAZY if expected_abort_ratio * shape.txns < 0.5 else AbortHandling.EAGER


def choose(shape: Shape, expected_abort_ratio: float | None, cyclic=None) -> TPG:
    """The decisions for a batch of this shape.  ``cyclic``: a callable computing it on demand."""
    abort = choose_abort(shape, expected_abort_ratio)
    gran = Granularity.OP
    if abort is AbortHandling.LAZY and shape.chains and shape.ops / shape.chains >= MIN_CHAIN:
        is_cyclic = shape.cyclic if shape.cyclic is not None else (cyclic() if cyclic else True)
        if not is_cyclic:
            gran = Granularity.CHAIN
    expl = Exploration.NONSTRUCTURED if shape.cross > CROSS_NS else Exploration.STRUCTURED
    return TPG(gran, expl, abort)
