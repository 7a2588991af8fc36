"""Unbalanced Tree Search (UTS): a reference workload for dynamic load balancing.

UTS (Olivier, Huan, Liu, Prins, Dinan, Sadayappan, Tseng; LCPC 2006) counts the
nodes of an implicit tree whose shape is decided by a splittable random number
generator.  Nothing is stored: a node *is* its 20-byte RNG state, and its
children are derived from it, so any frontier of nodes is a self-contained unit
of work that can move between processes.  Some subtrees are tiny and some are
huge, and nobody can tell which before exploring them: the benchmark measures
how well a runtime balances work it cannot predict.

The RNG follows the reference C code (``rng/brg_sha1.c`` of the UTS distribution)
bit for bit, so the published tree sizes are a correctness check:

* ``rng_init(seed)``: SHA-1 of 16 zero bytes followed by the 4-byte big-endian
  seed;
* ``rng_spawn(state, i)``: SHA-1 of the parent's 20-byte state followed by the
  4-byte big-endian child index;
* ``rng_rand(state)``: the last 4 bytes of the state, big-endian,
  ``& 0x7fffffff``; ``to_prob(r) = r / 2**31``.

Tree types (``uts.c``): BINOMIAL (the root has ``floor(b0)`` children, every
other node has ``m`` children with probability ``q``, else none), GEOMETRIC
(geometric number of children with a mean ``b_i`` given by a shape function of
the depth), HYBRID (geometric above ``shift_depth * depth``, binomial below) and
BALANCED.  Non-root nodes never have more than ``MAX_NUM_CHILDREN`` (100).

Data flow of the parallel search (``search_parallel``)::

    driver --submit--> _search_task(frontier=[root])
        loop: expand up to `cutoff` nodes depth-first from the explicit stack;
              if nodes remain, cut the stack in two, spawn one half as a new
              _search_task, keep the other
        join the spawned children newest first, add up their TreeStats

Invariants: a stack entry is a node not yet counted; every node is counted by
exactly one task, so the sum of the tasks' TreeStats is the sequential answer
whoever stole what.

Which half to give away.  The bottom of a DFS stack holds the shallowest nodes,
whose subtrees are the largest (in a geometric tree like T1 by far): that is the
half a thief should get, and the spawned halves wait on the owner's deque where
an idle worker steals the oldest.  But a half nobody steals is run by its owner
inside a join, one Python frame level deeper, and if it again gives away its
heavy bottom half the chain of nested joins grows with every `cutoff` nodes (on
one worker, T1 would nest thousands of levels).  So a task gives away the bottom
half only while few search tasks are nested on this worker's stack
(``_BOTTOM_NESTING``); deeper it gives away the top half, which holds little
work, so chains stay short; at ``max_nesting`` it stops splitting and finishes
its frontier sequentially.  Both numbers come from the runtime:
``shoal.current_worker().nesting`` (tasks nested in joins on this worker's
stack) and ``.max_nesting``.  Measured on one worker, T1, T2, T4 and T5 nest at
most ~25 levels at any cutoff; T3, where either half holds half the work, ~34
at cutoff 8192 and ~60 at 2048.  The default cap is the
worker's ``max_nesting`` (what its raised recursion limit affords: 256).
In a binomial tree (T3) every stack entry has the same expected subtree size
(the process is near-critical, ``q*m = 0.999``), so either half is half the
work in expectation.

Granularity: ``cutoff`` nodes (4096 by default, ~2 ms of SHA-1 work) per spawn
keeps the spawn cost (pickling ~150 20-byte states) around one percent while a
thief finds work on the deque every couple of milliseconds (the speed-up over
cutoffs: docs/benchmarks.md, UTS T3); with the
nesting cap of 40 we first used, long T3 join chains stopped splitting and
left the other worker idle for up to 0.6 s of a 1 s run.

Alternatives rejected: one task per node, or one per child of the root (static
decomposition: T3 puts 2.38 of its 4.11 million nodes under one of the root's
2000 children, so no static split of the root can beat sequential by more than
4.11/2.38, whatever the worker count -- the benchmark runner measures it); capping the *spawn generation* instead of the live
nesting (a stolen task restarts at nesting 1 on its thief and may split again,
a generation cap would forbid it); reclaiming unstolen halves with
``Future.cancel`` (a worker-local future does not tell whether a thief is
running it); returning leftover frontiers to the driver (every split would take
a round trip through one process).

This module uses only shoal's public API (``shoal.spawn`` and a pilot's
``submit``), so it runs unchanged on every backend.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import lru_cache
from struct import Struct
from typing import Callable, NamedTuple

import shoal

__all__ = [
    "DEFAULT",
    "DEFAULT_CUTOFF",
    "DERIVED",
    "MAX_NUM_CHILDREN",
    "PRESETS",
    "PUBLISHED",
    "T1",
    "T1L",
    "T1S",
    "T1XS",
    "T2",
    "T3",
    "T3L",
    "T3S",
    "T3XS",
    "T4",
    "T5",
    "GeoShape",
    "Node",
    "TreeStats",
    "TreeType",
    "UTSParams",
    "children",
    "count_parallel",
    "count_sequential",
    "num_children",
    "rng_init",
    "rng_rand",
    "rng_spawn",
    "root",
    "search_from",
    "search_parallel",
    "search_sequential",
    "to_prob",
]

MAX_NUM_CHILDREN = 100  # uts.h: cap on children (a binomial root is exempt)
POS_MASK = 0x7FFFFFFF
_TWO_31 = 2147483648.0

# ---------------------------------------------------------------------------
# the splittable SHA-1 random number generator (rng/brg_sha1.c)
# ---------------------------------------------------------------------------

_sha1 = hashlib.sha1
_rand_word = Struct(">16xI").unpack  # bytes 16..19 of a digest, big-endian
# 4-byte big-endian child indices, built once: a binomial root can have b0 children
_INDEX: list[bytes] = [i.to_bytes(4, "big") for i in range(4096)]


def _index(i: int) -> bytes:
    return _INDEX[i] if i < len(_INDEX) else (i & 0xFFFFFFFF).to_bytes(4, "big")


def rng_init(seed: int) -> bytes:
    """Root state: SHA-1 over 16 zero bytes and the 4-byte big-endian seed."""
    return _sha1(bytes(16) + (seed & 0xFFFFFFFF).to_bytes(4, "big")).digest()


def rng_spawn(state: bytes, i: int) -> bytes:
    """State of child ``i``: SHA-1 over the parent's 20 bytes and big-endian ``i``."""
    return _sha1(state + _index(i)).digest()


def rng_rand(state: bytes) -> int:
    """The state's random number: its last 4 bytes, big-endian, as a positive int31."""
    return _rand_word(state)[0] & POS_MASK


def to_prob(r: int) -> float:
    """Map a positive int31 onto [0, 1) as the reference does (``r / 2**31``)."""
    return r / _TWO_31


# ---------------------------------------------------------------------------
# tree parameters
# ---------------------------------------------------------------------------


class TreeType(Enum):
    """The ``-t`` option of the reference code."""

    BINOMIAL = 0
    GEOMETRIC = 1
    HYBRID = 2
    BALANCED = 3


class GeoShape(Enum):
    """The ``-a`` option: how a geometric tree's mean branching factor varies with depth."""

    LINEAR = 0  # b_i = b0 * (1 - i/d)
    EXPDEC = 1  # b_i = b0 * i ** (-log b0 / log d)
    CYCLIC = 2  # b_i = b0 ** sin(2 pi i / d), no children below depth 5d
    FIXED = 3  # b_i = b0 above depth d, 0 from there on


@dataclass(frozen=True)
class UTSParams:
    """The parameters of one UTS tree; the defaults are the reference code's defaults.

    Field names follow the paper; the comments give the reference command-line flags.
    """

    tree_type: TreeType = TreeType.GEOMETRIC  # -t
    b0: float = 4.0  # -b: root branching factor (and geometric mean b_0)
    seed: int = 0  # -r: root seed (rootId)
    depth: int = 6  # -d: gen_mx, the depth parameter of the shape functions
    shape: GeoShape = GeoShape.LINEAR  # -a
    q: float = 15.0 / 64.0  # -q: binomial probability of a non-leaf node
    m: int = 4  # -m: binomial number of children of a non-leaf node
    shift_depth: float = 0.5  # -f: hybrid switch from geometric to binomial
    name: str = field(default="", compare=False)

    _FLAGS = {"t": "tree_type", "b": "b0", "r": "seed", "d": "depth", "a": "shape",
              "q": "q", "m": "m", "f": "shift_depth"}

    @classmethod
    def from_args(cls, args: str, name: str = "") -> UTSParams:
        """Parse the reference command line, e.g. ``"-t 0 -b 2000 -q 0.124875 -m 8 -r 42"``.

        A flag given twice keeps its last value, as getopt does.
        """
        words = shlex.split(args)
        if len(words) % 2:
            raise ValueError(f"UTS arguments must be flag/value pairs: {args!r}")
        kw: dict = {}
        for flag, value in zip(words[::2], words[1::2], strict=True):
            key = cls._FLAGS.get(flag.lstrip("-"))
            if key is None or not flag.startswith("-"):
                raise ValueError(f"unknown UTS flag {flag!r} in {args!r}")
            if key == "tree_type":
                kw[key] = TreeType(int(value))
            elif key == "shape":
                kw[key] = GeoShape(int(value))
            elif key in ("seed", "depth", "m"):
                kw[key] = int(value)
            else:
                kw[key] = float(value)
        return cls(name=name, **kw)

    def to_args(self) -> str:
        """The reference command line for this tree (all flags, defaults included)."""
        return (f"-t {self.tree_type.value} -a {self.shape.value} -d {self.depth} "
                f"-b {self.b0:g} -r {self.seed} -q {self.q!r} -m {self.m} "
                f"-f {self.shift_depth!r}")

    def with_(self, **changes) -> UTSParams:
        """A copy with some fields changed (the name is dropped unless given)."""
        changes.setdefault("name", "")
        return replace(self, **changes)

    @classmethod
    def preset(cls, name: str) -> UTSParams:
        """One of ``PRESETS`` by name (``"T1"``, ``"T3"``, ``"T3XS"``, ...)."""
        try:
            return PRESETS[name.upper()]
        except KeyError:
            raise KeyError(f"unknown UTS preset {name!r}; known: {', '.join(PRESETS)}") from None

    def __str__(self) -> str:
        return f"{self.name or 'UTS'}({self.to_args()})"

    def __reduce__(self):
        """Unpickled parameters are interned: every task a worker runs on one tree shares
        one object.  ``children``/``num_children`` look up the tree's child counter in an
        lru_cache per node, and an equal copy per task (each spawned or stolen task
        unpickles its own) made that lookup compare field by field: ~25% of the per-node
        time of a user's own loop over ``children``."""
        return (_interned, (self.tree_type, self.b0, self.seed, self.depth, self.shape,
                            self.q, self.m, self.shift_depth, self.name))


_INTERNED: dict[tuple, UTSParams] = {}


def _interned(*fields) -> UTSParams:
    """The one UTSParams of this process with these fields (name included)."""
    params = _INTERNED.get(fields)
    if params is None:
        if len(_INTERNED) > 1024:
            _INTERNED.clear()  # many distinct trees: a bound, not a cache policy
        params = _INTERNED[fields] = UTSParams(*fields)
    return params


class Node(NamedTuple):
    """A tree node: its RNG state and its depth (the root has height 0)."""

    state: bytes
    height: int


@dataclass(frozen=True)
class TreeStats:
    """What a search finds: node count, leaf count, deepest height (root = 0)."""

    nodes: int = 0
    leaves: int = 0
    max_depth: int = 0

    def __add__(self, other: TreeStats) -> TreeStats:
        return TreeStats(self.nodes + other.nodes, self.leaves + other.leaves,
                         max(self.max_depth, other.max_depth))


def _published(args: str, name: str) -> UTSParams:
    return UTSParams.from_args(args, name=name)


# The reference trees.  Sizes from the UTS distribution's sample_trees.sh (UTS 2.1,
# also in BOTS inputs/uts/test.input for T3); the default tree's 1732 nodes /
# 1050 leaves from the verifyStats() table of the STAPL port of UTS.
T1 = _published("-t 1 -a 3 -d 10 -b 4 -r 19", "T1")
T2 = _published("-t 1 -a 2 -d 16 -b 6 -r 502", "T2")
T3 = _published("-t 0 -b 2000 -q 0.124875 -m 8 -r 42", "T3")
T4 = _published("-t 2 -a 0 -d 16 -b 6 -r 1 -q 0.234375 -m 4 -r 1", "T4")
T5 = _published("-t 1 -a 0 -d 20 -b 4 -r 34", "T5")
T1L = _published("-t 1 -a 3 -d 13 -b 4 -r 29", "T1L")
T3L = _published("-t 0 -b 2000 -q 0.200014 -m 5 -r 7", "T3L")
DEFAULT = UTSParams(name="DEFAULT")

# Small trees for fast tests and --quick benchmarks: T1 with a smaller depth, T3's
# binomial distribution with a 500-child root and other seeds (kept heavy-tailed:
# T3S puts 97.6 % of its nodes under one root child, 1024 levels deep).  Their sizes
# were computed with this module and cross-checked sequential vs parallel; they
# are regression values, not published ones -- the published checks are
# DEFAULT and T1..T5 (PUBLISHED below).
T1XS = T1.with_(depth=6, name="T1XS")
T1S = T1.with_(depth=8, name="T1S")
T3XS = T3.with_(b0=500, seed=10, name="T3XS")
T3S = T3.with_(b0=500, seed=11, name="T3S")

PRESETS: dict[str, UTSParams] = {
    p.name: p for p in (DEFAULT, T1, T2, T3, T4, T5, T1L, T3L, T1XS, T1S, T3XS, T3S)
}

# name -> (nodes, leaves, max depth) as published; None where not published
PUBLISHED: dict[str, TreeStats] = {
    "DEFAULT": TreeStats(1732, 1050, 6),
    "T1": TreeStats(4130071, 3305118, 10),
    "T2": TreeStats(4117769, 2342762, 81),
    "T3": TreeStats(4112897, 3599034, 1572),
    "T4": TreeStats(4132453, 3108986, 134),
    "T5": TreeStats(4147582, 2181318, 20),
    "T1L": TreeStats(102181082, 81746377, 13),
    "T3L": TreeStats(111345631, 89076904, 17844),
}

# name -> stats computed by this module (regression values for the small presets)
DERIVED: dict[str, TreeStats] = {
    "T1XS": TreeStats(16000, 12839, 6),
    "T1S": TreeStats(257042, 205878, 8),
    "T3XS": TreeStats(101045, 88476, 265),
    "T3S": TreeStats(841733, 736578, 1024),
}

# ---------------------------------------------------------------------------
# the tree: number of children per node (uts.c: uts_numChildren)
# ---------------------------------------------------------------------------


def _geo_log1mp(params: UTSParams, depth: int) -> float:
    """``log(1 - p)`` of the geometric distribution at ``depth``; 0.0 means no children."""
    b0, gen_mx, shape = params.b0, params.depth, params.shape
    b_i = b0
    if depth > 0:
        if shape is GeoShape.EXPDEC:
            b_i = b0 * math.pow(depth, -math.log(b0) / math.log(gen_mx))
        elif shape is GeoShape.CYCLIC:
            if depth > 5 * gen_mx:
                b_i = 0.0
            else:
                b_i = math.pow(b0, math.sin(2.0 * 3.141592653589793 * depth / gen_mx))
        elif shape is GeoShape.FIXED:
            b_i = b0 if depth < gen_mx else 0.0
        else:  # LINEAR
            b_i = b0 * (1.0 - depth / gen_mx)
    if b_i <= 0.0:  # p >= 1: log(1 - p) is -inf (or NaN) in C and the count is 0
        return 0.0
    p = 1.0 / (1.0 + b_i)
    return math.log(1.0 - p)


@lru_cache(maxsize=64)
def _child_counter(params: UTSParams) -> Callable[[bytes, int], int]:
    """A function (state, height) -> number of children, specialised for ``params``."""
    ttype = params.tree_type
    thresh = params.q * _TWO_31  # rand < thresh  <=>  rand / 2**31 < q, exactly
    m = min(params.m, MAX_NUM_CHILDREN)
    root_bf = min(math.floor(params.b0), math.ceil(params.b0))
    log, floor, rand_word = math.log, math.floor, _rand_word
    geo_table: dict[int, float] = {}

    def geo(state: bytes, height: int) -> int:
        try:
            log1mp = geo_table[height]
        except KeyError:
            log1mp = geo_table[height] = _geo_log1mp(params, height)
        if log1mp == 0.0:
            return 0
        u = (rand_word(state)[0] & POS_MASK) / _TWO_31
        return min(floor(log(1.0 - u) / log1mp), MAX_NUM_CHILDREN)

    def binomial(state: bytes, height: int) -> int:
        if height == 0:
            return root_bf
        return m if (rand_word(state)[0] & POS_MASK) < thresh else 0

    if ttype is TreeType.BINOMIAL:
        return binomial
    if ttype is TreeType.GEOMETRIC:
        return geo
    if ttype is TreeType.HYBRID:
        shift = params.shift_depth * params.depth

        def hybrid(state: bytes, height: int) -> int:
            if height < shift:
                return geo(state, height)
            return m if (rand_word(state)[0] & POS_MASK) < thresh else 0

        return hybrid
    b = int(params.b0)  # BALANCED: no cap, as in the reference

    def balanced(state: bytes, height: int) -> int:
        return b if height < params.depth else 0

    return balanced


def root(params: UTSParams) -> Node:
    """The root node of the tree described by ``params``."""
    return Node(rng_init(params.seed), 0)


def num_children(params: UTSParams, node: Node) -> int:
    """How many children ``node`` has (uts_numChildren, with the reference's caps)."""
    return _child_counter(params)(node.state, node.height)


def children(params: UTSParams, node: Node) -> list[Node]:
    """The children of ``node``, in index order."""
    state, h = node.state, node.height + 1
    return [Node(_sha1(state + _index(i)).digest(), h)
            for i in range(num_children(params, node))]


# ---------------------------------------------------------------------------
# depth-first expansion of an explicit stack: the sequential kernel
# ---------------------------------------------------------------------------


def _expand(params: UTSParams, stack: list, budget: int) -> TreeStats:
    """Count nodes depth-first from ``stack`` until it is empty or ``budget`` are counted.

    ``stack`` holds uncounted nodes as (state, height) tuples, newest last; it is
    consumed in place and what is left is the unexplored frontier.
    """
    if params.tree_type is TreeType.BINOMIAL:
        return _expand_binomial(params, stack, budget)
    return _expand_generic(params, stack, budget)


def _expand_generic(params: UTSParams, stack: list, budget: int) -> TreeStats:
    count = _child_counter(params)
    sha1, index = _sha1, _INDEX
    pop, push = stack.pop, stack.append
    nodes = leaves = max_depth = 0
    while stack and nodes < budget:
        state, height = pop()
        nodes += 1
        if height > max_depth:
            max_depth = height
        k = count(state, height)
        if k == 0:
            leaves += 1
            continue
        height += 1
        if k > len(index):  # only a balanced tree or a huge binomial root gets here
            for i in range(k):
                push((sha1(state + _index(i)).digest(), height))
            continue
        for b in index[:k]:
            push((sha1(state + b).digest(), height))
    return TreeStats(nodes, leaves, max_depth)


def _expand_binomial(params: UTSParams, stack: list, budget: int) -> TreeStats:
    """The binomial kernel: a child is a leaf iff its own rand >= q, so test it at birth.

    87.5 % of T3's nodes are leaves; counting them where they are generated
    skips a push and a pop for each (markedly faster than the generic kernel).
    """
    thresh = params.q * _TWO_31
    m = min(params.m, MAX_NUM_CHILDREN)
    root_bf = min(math.floor(params.b0), math.ceil(params.b0))
    idx_m = _INDEX[:m]
    sha1, rand_word = _sha1, _rand_word
    pop, push = stack.pop, stack.append
    nodes = leaves = max_depth = 0
    while stack and nodes < budget:
        state, height = pop()
        nodes += 1
        if height == 0:
            k = root_bf
            indices = _INDEX[:k] if k <= len(_INDEX) else [_index(i) for i in range(k)]
        else:
            k = m if (rand_word(state)[0] & POS_MASK) < thresh else 0
            indices = idx_m
        if height > max_depth:
            max_depth = height
        if k == 0:
            leaves += 1
            continue
        height += 1
        if height > max_depth:
            max_depth = height
        for b in indices:
            child = sha1(state + b).digest()
            if (rand_word(child)[0] & POS_MASK) < thresh:
                push((child, height))  # a non-leaf (m > 0 children): expand later
            else:
                nodes += 1  # a leaf: counted now, never pushed
                leaves += 1
    return TreeStats(nodes, leaves, max_depth)


def search_from(params: UTSParams, nodes) -> TreeStats:
    """Explore the subtrees under ``nodes`` (an iterable of Node) in this process.

    For static decompositions: ``search_from(p, children(p, root(p)))`` plus the
    root itself is the whole tree.
    """
    stack = [tuple(node) for node in nodes]
    total = TreeStats()
    while stack:
        total += _expand(params, stack, 1 << 62)
    return total


def search_sequential(params: UTSParams) -> TreeStats:
    """Explore the whole tree in this process (no recursion: an explicit stack)."""
    return search_from(params, [root(params)])


def count_sequential(params: UTSParams) -> int:
    """The number of nodes of the tree, counted in this process."""
    return search_sequential(params).nodes


# ---------------------------------------------------------------------------
# the parallel search: split the DFS stack every `cutoff` nodes, spawn one half
# ---------------------------------------------------------------------------

DEFAULT_CUTOFF = 4096  # nodes a task expands between two spawns (~2 ms of SHA-1)
_BOTTOM_NESTING = 16  # below this nesting give away the bottom half, above it the top


def _search_task(params: UTSParams, frontier: list, cutoff: int,
                 max_nesting: int | None) -> TreeStats:
    """One task: explore ``frontier``, spawning half of its stack every ``cutoff`` nodes."""
    w = shoal.current_worker()
    if w is None:  # run in the driver: spawn is submit there, so nothing nests
        nesting, limit = 1, 2 if max_nesting is None else max_nesting
    else:
        nesting, limit = w.nesting, w.max_nesting if max_nesting is None else max_nesting
    bottom = min(_BOTTOM_NESTING, limit // 2)
    stack = list(frontier)
    total = TreeStats()
    spawned = []
    while stack:
        total += _expand(params, stack, cutoff)
        if len(stack) > 1 and nesting < limit:
            half = len(stack) // 2
            if nesting < bottom:
                piece = stack[:half]  # the oldest, shallowest nodes: for a thief
                del stack[:half]
            else:
                piece = stack[half:]  # deep in a join chain: keep the heavy part
                del stack[half:]
            spawned.append(shoal.spawn(_search_task, params, piece, cutoff, max_nesting))
    for fut in reversed(spawned):  # newest first: the top of our own deque
        total += fut.result()
    return total


def search_parallel(pilot, params: UTSParams, *, cutoff: int = DEFAULT_CUTOFF,
                    max_nesting: int | None = None) -> TreeStats:
    """Explore the tree with ``pilot``'s workers; same result as ``search_sequential``.

    ``cutoff``: nodes a task expands between two spawns (the task granularity).
    ``max_nesting``: how many search tasks a worker may run nested in joins before
    it stops splitting (bounds the Python stack); by default the worker's own
    ``shoal.current_worker().max_nesting``.
    """
    if cutoff < 1 or (max_nesting is not None and max_nesting < 1):
        raise ValueError("cutoff and max_nesting must be >= 1")
    frontier = [tuple(root(params))]
    return pilot.submit(_search_task, params, frontier, cutoff, max_nesting).result()


def count_parallel(pilot, params: UTSParams, *, cutoff: int = DEFAULT_CUTOFF,
                   max_nesting: int | None = None) -> int:
    """The number of nodes of the tree, counted by ``pilot``'s workers with work stealing."""
    return search_parallel(pilot, params, cutoff=cutoff, max_nesting=max_nesting).nodes
