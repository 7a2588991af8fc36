"""Pure helpers of the all-pairs skeleton: tile geometry, Z order, the item cache, top-k merging.

Nothing here touches a pilot, a process or a file: every function takes plain
numbers (or a user callable it only calls) and returns plain data, so the
tiling and caching policy is tested without workers (docs/architecture.md: policy
is pure).  ``shoal.patterns.all_pairs`` carries the decisions out.

Geometry.  The pair matrix is ``n x m``.  A *region* is ``(kind, i0, i1, j0,
j1)``: a ``RECT`` covers every pair of rows ``[i0, i1)`` and columns ``[j0,
j1)``; a ``TRIANGLE`` (symmetric problems only, ``i0 == j0`` and ``i1 ==
j1``) covers the pairs ``i <= j`` of one diagonal block.  ``split`` cuts a
region into children in Z (Morton) order — top-left, top-right, bottom-left,
bottom-right; a triangle into its upper triangle, the rectangle right of it
and its lower triangle — at multiples of ``tile`` from the region's corner,
so every leaf is ``tile x tile`` except along the matrix's last row and
column of tiles.  Consecutive regions in Z order share rows or columns, which
is what makes a worker's cache hit.

Invariants: the children of a region partition its pairs exactly (no pair
twice, none lost), for every ``n``, ``m`` and ``tile``; a leaf has at most
``tile`` rows and ``tile`` columns.

Rejected: row strips (a strip of rows needs *every* column item, so nothing
is reused between strips and a cache must hold all of them); a flat list of
tiles handed out by the driver (no stealing of half a big tile, and a
round-robin placement scatters neighbouring tiles over workers, so each
worker loads every item).
"""

from __future__ import annotations

import enum
import math
import sys
from collections import OrderedDict

MIN_TILE = 8  # below this the per-task cost (~5 us spawn + run) rivals the pairs' work
MAX_TILE = 512  # above this a stolen leaf is too coarse to balance the end of a run
LEAVES_PER_WORKER = 16  # leaves per worker so stealing can even out uneven pair costs


class TileKind(enum.Enum):
    RECT = "rect"
    TRIANGLE = "triangle"


def default_tile(n: int, m: int, *, workers: int, cache_bytes: int, item_bytes: int,
                 symmetric: bool) -> int:
    """The leaf tile edge: the smallest of what the cache, the balance and MAX_TILE allow.

    * cache: a leaf needs ``2 * tile`` items; keep that within a quarter of the
      cache, so the neighbouring leaf's items (Z order) are still there;
    * balance: at least ``LEAVES_PER_WORKER`` leaves per worker;
    * cost: at least ``MIN_TILE`` (unless the cache forbids it), at most ``MAX_TILE``.
    """
    if n <= 0 or m <= 0:
        return 1
    cap_items = max(2, cache_bytes // max(1, item_bytes))
    by_cache = max(1, cap_items // 8)
    pairs = n * (n + 1) // 2 if symmetric else n * m
    by_balance = int(math.sqrt(pairs / (LEAVES_PER_WORKER * max(1, workers))))
    tile = min(by_cache, max(MIN_TILE, by_balance), MAX_TILE)
    return max(1, tile)


def _cut(lo: int, hi: int, tile: int) -> int:
    """Split point of ``[lo, hi)``: half of its tiles (rounded up) from ``lo``."""
    tiles = -(-(hi - lo) // tile)
    return lo + (-(-tiles // 2)) * tile


def split(region: tuple, tile: int) -> list[tuple]:
    """The children of ``region`` in Z order, or ``[]`` when it is a leaf."""
    kind, i0, i1, j0, j1 = region
    if kind is TileKind.TRIANGLE:
        if i1 - i0 <= tile:
            return []
        mid = _cut(i0, i1, tile)
        return [
            (TileKind.TRIANGLE, i0, mid, i0, mid),
            (TileKind.RECT, i0, mid, mid, i1),
            (TileKind.TRIANGLE, mid, i1, mid, i1),
        ]
    rows = [(i0, i1)] if i1 - i0 <= tile else [(i0, _cut(i0, i1, tile)), (_cut(i0, i1, tile), i1)]
    cols = [(j0, j1)] if j1 - j0 <= tile else [(j0, _cut(j0, j1, tile)), (_cut(j0, j1, tile), j1)]
    if len(rows) == 1 and len(cols) == 1:
        return []
    return [(TileKind.RECT, a, b, c, d) for a, b in rows for c, d in cols]


def pairs_in(region: tuple) -> int:
    kind, i0, i1, j0, j1 = region
    h = i1 - i0
    return h * (h + 1) // 2 if kind is TileKind.TRIANGLE else h * (j1 - j0)


def morton(i: int, j: int) -> int:
    """Interleave the bits of ``i`` (odd positions) and ``j`` (even): the Z-order key."""
    key, bit = 0, 0
    while i or j:
        key |= (j & 1) << (2 * bit) | (i & 1) << (2 * bit + 1)
        i, j, bit = i >> 1, j >> 1, bit + 1
    return key


def blocks(n: int, m: int, size: int, symmetric: bool) -> list[tuple]:
    """The whole matrix as regions of edge ``size`` (the last ones smaller), in Z order."""
    if n <= 0 or m <= 0:
        return []
    out = []
    for bi in range(-(-n // size)):
        for bj in range(-(-m // size)):
            if symmetric and bj < bi:
                continue
            i0, i1 = bi * size, min(n, (bi + 1) * size)
            j0, j1 = bj * size, min(m, (bj + 1) * size)
            kind = TileKind.TRIANGLE if symmetric and bi == bj else TileKind.RECT
            out.append((morton(bi, bj), (kind, i0, i1, j0, j1)))
    out.sort(key=lambda kv: kv[0])
    return [r for _, r in out]


def sizeof(value) -> int:
    """Bytes a loaded item holds, for the cache's budget (numpy: ``nbytes``; else a shallow guess)."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes + 112
    if isinstance(value, (str, bytes, bytearray)):
        return sys.getsizeof(value)
    if isinstance(value, (list, tuple)):  # one level deep: enough for records of scalars
        return sys.getsizeof(value) + sum(sys.getsizeof(v) for v in value)
    return sys.getsizeof(value)


class ItemCache:
    """An LRU map of loaded items bounded by bytes; one per worker process (owner only)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self.entries: OrderedDict = OrderedDict()  # key -> (value, nbytes)
        self.hits = self.misses = self.evictions = 0

    def get(self, key, load):
        """The value for ``key``: cached (a hit), else ``load()`` stored (a miss)."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
            self.hits += 1
            return entry[0]
        self.misses += 1
        value = load()
        self.put(key, value)
        return value

    def put(self, key, value) -> None:
        size = sizeof(value)
        old = self.entries.pop(key, None)
        if old is not None:
            self.used -= old[1]
        if size > self.capacity:
            return  # bigger than the whole cache: used once, never kept
        self.entries[key] = (value, size)
        self.used += size
        self.shrink(self.capacity)

    def shrink(self, capacity: int) -> None:
        while self.used > capacity and self.entries:
            _, (_, size) = self.entries.popitem(last=False)
            self.used -= size
            self.evictions += 1

    def __contains__(self, key) -> bool:
        return key in self.entries

    def drop(self, predicate) -> None:
        """Forget every key for which ``predicate(key)`` is true (a finished run's items)."""
        for key in [k for k in self.entries if predicate(k)]:
            self.used -= self.entries.pop(key)[1]


def merge_topk(rows, cols, vals, k: int, largest: bool):
    """Keep, for each row, the ``k`` best ``(col, val)`` candidates; ties go to the smaller col.

    Arrays in, arrays out (numpy), rows grouped in ascending order, each group
    best first.  NaN counts as the worst value.
    """
    import numpy as np

    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    vals = np.asarray(vals, dtype=np.float64)
    if rows.size == 0:
        return rows, cols, vals
    score = -vals if largest else vals.copy()
    score[np.isnan(score)] = np.inf
    order = np.lexsort((cols, score, rows))
    rows, cols, vals = rows[order], cols[order], vals[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    rank = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
    keep = rank < k
    return rows[keep], cols[keep], vals[keep]
