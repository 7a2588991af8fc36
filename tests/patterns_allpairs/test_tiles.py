"""The pure tiling/caching policy of all_pairs (no workers): partitions, Z order, LRU, top-k."""

from __future__ import annotations

import random

import numpy as np
import pytest

from shoal.patterns import _tiles as T


def _leaves(region, tile):
    kids = T.split(region, tile)
    if not kids:
        return [region]
    return [leaf for k in kids for leaf in _leaves(k, tile)]


def _coverage(regions, n, m):
    seen = np.zeros((n, m), dtype=int)
    for kind, i0, i1, j0, j1 in regions:
        block = np.ones((i1 - i0, j1 - j0), dtype=int)
        if kind is T.TileKind.TRIANGLE:
            block = np.triu(block)
        seen[i0:i1, j0:j1] += block
    return seen


@pytest.mark.parametrize("seed", range(20))
def test_split_partitions_exactly(seed):
    rng = random.Random(seed)
    n, m, tile = rng.randint(1, 90), rng.randint(1, 90), rng.randint(1, 17)
    rect = _leaves((T.TileKind.RECT, 0, n, 0, m), tile)
    assert (_coverage(rect, n, m) == 1).all()
    tri = _leaves((T.TileKind.TRIANGLE, 0, n, 0, n), tile)
    assert np.array_equal(_coverage(tri, n, n), np.triu(np.ones((n, n), dtype=int)))
    for _, i0, i1, j0, j1 in rect + tri:
        assert 0 < i1 - i0 <= tile and 0 < j1 - j0 <= tile
        assert i0 % tile == 0 and j0 % tile == 0  # leaves sit on the tile grid
    assert sum(T.pairs_in(r) for r in tri) == n * (n + 1) // 2


def test_split_children_follow_z_order():
    kids = T.split((T.TileKind.RECT, 0, 32, 0, 32), 8)
    assert [(k[1], k[3]) for k in kids] == [(0, 0), (0, 16), (16, 0), (16, 16)]
    tri = T.split((T.TileKind.TRIANGLE, 0, 20, 0, 20), 8)
    assert [k[0] for k in tri] == [T.TileKind.TRIANGLE, T.TileKind.RECT, T.TileKind.TRIANGLE]
    assert T.split((T.TileKind.RECT, 0, 8, 0, 5), 8) == []


@pytest.mark.parametrize("symmetric", [False, True])
def test_blocks_cover_in_z_order(symmetric):
    n, m = (50, 50) if symmetric else (50, 37)
    regions = T.blocks(n, m, 8, symmetric)
    want = np.triu(np.ones((n, n), dtype=int)) if symmetric else np.ones((n, m), dtype=int)
    assert np.array_equal(_coverage(regions, n, m), want)
    keys = [T.morton(r[1] // 8, r[3] // 8) for r in regions]
    assert keys == sorted(keys)
    assert T.blocks(0, 5, 8, False) == []


def test_morton():
    assert [T.morton(i, j) for i in range(2) for j in range(2)] == [0, 1, 2, 3]
    assert T.morton(2, 0) == 8 and T.morton(0, 2) == 4 and T.morton(3, 3) == 15


def test_default_tile_follows_cache_balance_and_bounds():
    big_cache = dict(cache_bytes=1 << 30, item_bytes=100, symmetric=True)
    assert T.default_tile(10, 10, workers=2, **big_cache) == T.MIN_TILE
    assert T.default_tile(100_000, 100_000, workers=2, **big_cache) == T.MAX_TILE
    mid = T.default_tile(2000, 2000, workers=2, **big_cache)
    assert T.MIN_TILE < mid < T.MAX_TILE
    assert T.default_tile(2000, 2000, workers=8, **big_cache) < mid  # more workers, smaller tiles
    assert T.default_tile(2000, 2000, workers=2, cache_bytes=1000, item_bytes=100, symmetric=True) == 1
    assert T.default_tile(0, 5, workers=2, **big_cache) == 1


def test_item_cache_lru_by_bytes():
    c = T.ItemCache(capacity=3 * (T.sizeof(b"x" * 100)))
    loads = []

    def loader(k):
        return lambda: loads.append(k) or b"x" * 100

    for k in [1, 2, 3, 1, 4, 2]:  # 4 evicts 2 (1 was used after 2), then 2 comes back, evicting 3
        c.get(k, loader(k))
    assert loads == [1, 2, 3, 4, 2]
    assert (c.hits, c.misses, c.evictions) == (1, 5, 2)
    assert 3 not in c and 1 in c and 4 in c and 2 in c
    assert c.used <= c.capacity
    c.put("huge", b"y" * 10_000)  # bigger than the cache: not kept, nothing evicted
    assert "huge" not in c and c.evictions == 2
    c.drop(lambda k: k in (1, 2))
    assert list(c.entries) == [4] and c.used == T.sizeof(b"x" * 100)


def test_sizeof():
    assert T.sizeof(np.zeros(100)) >= 800
    assert T.sizeof("abc" * 100) >= 300
    assert T.sizeof([1.0] * 50) > T.sizeof([1.0])


@pytest.mark.parametrize("largest", [False, True])
def test_merge_topk_against_sorting(largest):
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 6, 200)
    cols = rng.integers(0, 50, 200)
    vals = rng.integers(0, 5, 200).astype(float)  # many ties
    vals[::17] = np.nan
    r, c, v = T.merge_topk(rows, cols, vals, 3, largest)
    for row in range(6):
        cand = sorted(((np.inf if np.isnan(x) else (-x if largest else x)), cc, x)
                      for rr, cc, x in zip(rows, cols, vals, strict=True) if rr == row)[:3]
        got = [(cc, x) for rr, cc, x in zip(r, c, v, strict=True) if rr == row]
        assert [cc for cc, _ in got] == [cc for _, cc, _ in cand]
    assert T.merge_topk([], [], [], 3, False)[0].size == 0
