"""The search skeletons' data model: options, what a task is given (``SearchSpec``), what it
returns (``Tally``) and what the user gets (``SearchStats``); plus the checks of user
values and the path helpers (``kids_of``, ``replay``) shared by the engine and the
drivers.
"""

from __future__ import annotations

import enum
import math
import numbers
import pickle
import reprlib
from dataclasses import dataclass, field
from itertools import islice

import shoal

__all__ = ["Coordination", "SearchError", "SearchStats"]

_UNKNOWN = object()  # where(): the node is not at hand
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80


class Coordination(enum.Enum):
    """How a search is split into tasks (see the module docstring)."""

    SEQUENTIAL = "sequential"
    DEPTH_BOUNDED = "depth-bounded"
    BUDGET = "budget"
    STACK_STEALING = "stack-stealing"
    INDEXED = "indexed"


class Goal(enum.Enum):
    COUNT = "count"
    FIND = "find"
    OPTIMISE = "optimise"


class SearchError(shoal.ShoalError):
    """A user function (children, accept, goal, objective, bound) failed at a node; names its path."""


class _Stopped(Exception):
    """Internal: the stop flag is set; unwind this task."""


def coordination_of(value) -> Coordination:
    if isinstance(value, Coordination):
        return value
    try:
        return Coordination(value)
    except ValueError:
        choices = ", ".join(repr(c.value) for c in Coordination)
        raise ValueError(f"unknown coordination={value!r}; choose one of {choices}") from None


def number(value, what: str, path, node=_UNKNOWN) -> float:
    """``value`` if it is a real number (not NaN), else a TypeError naming it and the node.
    Integers come back as exact Python ints, other reals as floats."""
    t = type(value)
    if t is int or t is float:
        if value != value:
            raise TypeError(f"{what} returned NaN at {where(path, node)}; it must return a number")
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)  # numpy ints exactly: float() rounds past 2**53, up as often as down
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        f = float(value)
        if f != f:  # numpy's NaN is a Real too
            raise TypeError(f"{what} returned NaN at {where(path, node)}; it must return a number")
        return f
    raise TypeError(f"{what} returned {value!r} ({t.__name__}) at {where(path, node)}; "
                    "it must return a real number (int or float)")


def floor_float(value) -> float:
    """The largest float64 not above ``value`` (a real number, not NaN): what an exact value
    (an int past 2**53, a Fraction) may publish in a float64 incumbent cell.  ``float()``
    rounds to the nearest, which can be *above* the value (2**60+200 -> 2**60+256) and
    would prune a node that beats the true value; a cell that is never above the values it
    stands for can only under-prune (branch_and_bound's docstring, "Pruning rule")."""
    f = float(value)
    exact = int(value) if isinstance(value, numbers.Integral) else value  # numpy ints: exactly
    if f > exact:
        f = math.nextafter(f, -math.inf)
    return f


def below(value) -> float:
    """The largest float64 strictly below ``value``: ``b <= below(g)`` implies ``b < g`` for
    every real ``b`` (and is equivalent for floats), so one non-strict limit can express
    "strictly below the global incumbent" (engine.Explorer._limits)."""
    f = floor_float(value)
    if f == (int(value) if isinstance(value, numbers.Integral) else value):
        f = math.nextafter(f, -math.inf)
    return f


def describe(node) -> str:
    """A short repr of a user's node for error messages."""
    try:
        text = _repr.repr(node)
    except Exception as exc:
        text = f"<{type(node).__name__}: repr() raised {exc!r}>"
    return text if len(text) <= 160 else text[:157] + "..."


def where(path, node=_UNKNOWN, spec=None) -> str:
    """"node path P (node N)" for an error message.  ``path``: a tuple or a function
    computing it; a ``node`` not at hand is re-derived from the root through ``spec``
    (error paths only), and left out when that fails."""
    p = _p(path)
    if node is _UNKNOWN and spec is not None:
        try:
            node = replay(spec, p)
        except Exception:
            node = _UNKNOWN
    if node is _UNKNOWN:
        return f"node path {p}"
    return f"node path {p} (node {describe(node)})"


def check_picklable(node, path, why: str, *, subtree: bool = False) -> None:
    """SearchError unless ``node`` pickles; ``subtree``: it travels as a split-off subtree,
    which ``coordination='indexed'`` would send as a path instead (the root, a solution and
    the incumbent travel under every coordination, so that advice is not given for them)."""
    try:
        pickle.dumps(node, 5)
    except Exception:
        try:
            import cloudpickle

            cloudpickle.dumps(node)
        except Exception as exc:
            advice = "make nodes picklable" + (", or use coordination='indexed'" if subtree else "")
            raise SearchError(f"the node at path {path} cannot be pickled ({why}): {exc!r}; "
                              f"{advice}") from None


@dataclass(frozen=True)
class SearchSpec:
    """Everything a search task needs (pickled with every stolen task)."""

    root: object
    children: object
    goal: Goal
    control: object  # SharedArray.per_node: Control (control.py)
    coordination: Coordination = Coordination.STACK_STEALING
    accept: object = None  # COUNT: which nodes count; FIND: the goal
    objective: object = None
    bound: object = None
    negate: bool = False  # minimise: values are negated inside
    cell: object = None  # BestCell.for_pilot (always "max" of the possibly negated values)
    stop: object = None  # control.StopFlag: set once the search must stop, on every machine
    reserve: bool = False  # several machines: keep subtrees on offer for the balancer
    initial: float = -math.inf
    target: float | None = None  # FIND: a goal is objective >= target; bound < target prunes
    kernel: object = None  # COUNT: node -> the count of its subtree, for nodes at ...
    kernel_depth: int = 0  # ... this depth (root 0) and below
    prune_level: bool = False
    ordered: bool = False
    spawn_depth: int = 2
    budget: int = 10_000
    per_depth: bool = False
    collect: bool = False  # COUNT: keep accepted nodes (solutions())


@dataclass
class Tally:
    """What a task found; tasks' tallies merge up the join tree."""

    count: int = 0
    nodes: int = 0
    pruned: int = 0
    tasks: int = 1
    splits: int = 0
    per_depth: list = field(default_factory=list)
    best: float = -math.inf
    best_path: tuple | None = None
    best_node: object = None
    t_first: float | None = None
    t_best: float | None = None
    updates: int = 0
    found: tuple | None = None  # (path, node)
    t_hit: float | None = None
    found_nodes: list | None = None

    def merge(self, o: Tally) -> None:
        self.count += o.count
        self.nodes += o.nodes
        self.pruned += o.pruned
        self.tasks += o.tasks
        self.splits += o.splits
        self.updates += o.updates
        if o.per_depth:
            pd = self.per_depth
            if len(pd) < len(o.per_depth):
                pd.extend([0] * (len(o.per_depth) - len(pd)))
            for d, k in enumerate(o.per_depth):
                pd[d] += k
        if o.best_path is not None and (self.best_path is None or o.best > self.best
                                        or (o.best == self.best and o.best_path < self.best_path)):
            self.best, self.best_path, self.best_node = o.best, o.best_path, o.best_node
            self.t_best = o.t_best
        if o.t_first is not None and (self.t_first is None or o.t_first < self.t_first):
            self.t_first = o.t_first
        if o.found is not None and (self.found is None or o.t_hit < self.t_hit):
            self.found, self.t_hit = o.found, o.t_hit
        if o.found_nodes:
            if self.found_nodes is None:
                self.found_nodes = []
            self.found_nodes.extend(o.found_nodes)


@dataclass(frozen=True)
class SearchStats:
    """What a search did.  Times are seconds since the search began."""

    coordination: Coordination
    workers: int
    nodes: int  # nodes visited (B&B: bounded and not pruned)
    pruned: int = 0  # B&B: nodes cut by the bound (prune_level siblings not included)
    tasks: int = 1  # search tasks run
    splits: int = 0  # tasks spawned by the skeleton
    per_depth: tuple = ()  # nodes visited per depth (stats=True)
    steals_local: int = 0  # pilot.stats() deltas over the search
    steals_remote: int = 0
    elapsed_s: float = 0.0
    first_incumbent_s: float | None = None
    final_incumbent_s: float | None = None
    incumbent_updates: int = 0
    stop_latency_s: float | None = None  # find(): hit -> driver has the answer
    work_inflation: float | None = None  # B&B: nodes / reference_nodes when given
    exported: int = 0  # subtrees moved between machines on request (dask pilots)


# -- nodes named by paths ---------------------------------------------------------


def _p(path) -> tuple:
    """A path given as a tuple or as a function computing it (paths are built only for errors)."""
    return path() if callable(path) else path


def kids_of(children, node, path):
    """``iter(children(node))``, with errors that name the node's path."""
    try:
        kids = children(node)
    except _Stopped:
        raise
    except Exception as exc:
        raise SearchError(f"children() raised {exc!r} at {where(path, node)}") from exc
    try:
        return iter(kids)
    except TypeError:
        raise SearchError(f"children() returned a non-iterable {type(kids).__name__} "
                          f"at {where(path, node)}; return a list, tuple or generator") from None


def listing(children, node, path):
    """The children of ``node`` one by one, with errors (also raised inside a generator)
    that name its path."""
    it = kids_of(children, node, path)
    while True:
        try:
            child = next(it)
        except StopIteration:
            return
        except _Stopped:
            raise
        except Exception as exc:
            raise SearchError(f"children() raised {exc!r} at {where(path, node)}") from exc
        yield child


def replay(spec: SearchSpec, path: tuple):
    """The node at ``path``, re-derived by replaying ``children`` from the root (indexed)."""
    node = spec.root
    for depth, i in enumerate(path):
        it = kids_of(spec.children, node, path[:depth])
        try:
            node = next(islice(it, i, None))
        except StopIteration:
            raise SearchError(f"children() is not deterministic: node path {path[:depth + 1]} "
                              "no longer exists on replay; coordination='indexed' needs "
                              "children() to yield the same children in the same order") from None
    return node
