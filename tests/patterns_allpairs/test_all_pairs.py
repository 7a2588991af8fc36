"""all_pairs.compute against references nobody here wrote (scipy's pdist/cdist, Levenshtein
pairs from the literature), on 1 and 2 workers; outputs, statistics, bad input."""

from __future__ import annotations

import functools

import ap_tasks as t
import numpy as np
import pytest
from scipy.spatial.distance import cdist, pdist

import shoal
from shoal.patterns import all_pairs

METRICS = ["euclidean", "cosine", "cityblock"]


@pytest.fixture(scope="module", params=[1, 2], ids=["1worker", "2workers"])
def pilot(request):
    with shoal.Pilot(workers=request.param) as p:
        yield p


def _data(n, seed=0, dim=6):
    return list(np.random.default_rng(seed).normal(size=(n, dim)))


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


# -- numbers: scipy is the reference -------------------------------------------------

@pytest.mark.parametrize("path", ["compare", "block"])
@pytest.mark.parametrize("metric", METRICS)
def test_symmetric_matches_pdist(pilot, metric, path):
    xs = _data(37)
    kw = {"block": t.BLOCK[metric]} if path == "block" else {}
    r = all_pairs.compute(pilot, xs, t.PER_PAIR[metric], tile=8, **kw)  # 37 = 4 x 8 + 5
    assert r.shape == (37, 37)
    iu = np.triu_indices(37, 1)
    _close(r[iu], pdist(np.array(xs), metric))
    assert np.array_equal(r, r.T)
    np.testing.assert_allclose(np.diag(r), 0.0, atol=1e-12)
    assert r.stats.pairs == 37 * 38 // 2


@pytest.mark.parametrize("path", ["compare", "block"])
@pytest.mark.parametrize("metric", METRICS)
def test_rectangular_matches_cdist(pilot, metric, path):
    xs, ys = _data(29, 1), _data(19, 2)
    kw = {"block": t.BLOCK[metric]} if path == "block" else {}
    r = all_pairs.compute(pilot, xs, t.PER_PAIR[metric], other=ys, tile=6, **kw)
    assert r.shape == (29, 19)
    _close(r, cdist(np.array(xs), np.array(ys), metric))
    assert r.stats.pairs == 29 * 19


def test_default_tile_and_odd_sizes(pilot):
    xs = _data(101, 3)
    r = all_pairs.compute(pilot, xs, t.euclidean)
    _close(r[np.triu_indices(101, 1)], pdist(np.array(xs)))
    assert 1 <= r.stats.tile <= 101


# -- strings: Levenshtein -------------------------------------------------------------

def _reference_levenshtein(s, t_):
    """Top-down recursion with memo (a different algorithm from ap_tasks.levenshtein)."""

    @functools.lru_cache(maxsize=None)
    def d(i, j):
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (s[i - 1] != t_[j - 1]))

    return d(len(s), len(t_))


def test_levenshtein(pilot):
    words = ["kitten", "sitting", "flaw", "lawn", "", "abc", "intention", "execution",
             "saturday", "sunday", "rosettacode", "raisethysword", "a", "shoal"]
    r = all_pairs.compute(pilot, words, t.levenshtein, tile=3)
    idx = {w: k for k, w in enumerate(words)}
    for a, b, want in [("kitten", "sitting", 3), ("flaw", "lawn", 2), ("", "abc", 3),
                       ("intention", "execution", 5), ("saturday", "sunday", 3),
                       ("rosettacode", "raisethysword", 8)]:
        assert r[idx[a], idx[b]] == r[idx[b], idx[a]] == want
    ref = np.array([[_reference_levenshtein(a, b) for b in words] for a in words])
    assert np.array_equal(r, ref)


# -- items as files: loads are counted, and few ----------------------------------------

def _files(tmp_path, n, dim=8):
    xs = _data(n, 4, dim)
    paths = []
    for k, x in enumerate(xs):
        p = tmp_path / f"item{k:04d}.npy"
        np.save(p, x)
        paths.append(str(p))
    return xs, paths


def test_files_loaded_few_times(pilot, tmp_path):
    n = 120
    xs, paths = _files(tmp_path, n)
    r = all_pairs.compute(pilot, paths, t.euclidean, load=t.load_npy)
    _close(r[np.triu_indices(n, 1)], pdist(np.array(xs)))
    s = r.stats
    assert s.item_loads.shape == (n,)
    assert s.loads == s.item_loads.sum() >= n  # every item loaded at least once
    assert s.max_loads_per_item <= pilot.workers  # cache big enough: once per worker at most
    assert s.cache_misses == s.loads and s.cache_hits > 0


def test_small_cache_still_far_fewer_loads_than_n(pilot, tmp_path):
    n = 120
    xs, paths = _files(tmp_path, n)
    item = np.load(paths[0]).nbytes + 112
    r = all_pairs.compute(pilot, paths, t.euclidean, load=t.load_npy, cache_bytes=40 * item)
    _close(r[np.triu_indices(n, 1)], pdist(np.array(xs)))
    s = r.stats
    assert s.tile <= 5  # the default tile follows the cache: 2 tiles' items fit
    assert s.cache_evictions > 0
    assert s.loads_per_item < n / 4, s.summary()


def test_rectangular_files_count_both_sides(pilot, tmp_path):
    xs, paths = _files(tmp_path, 30)
    r = all_pairs.compute(pilot, paths[:20], t.cityblock, other=paths[20:], load=t.load_npy, tile=4)
    _close(r, cdist(np.array(xs[:20]), np.array(xs[20:]), "cityblock"))
    assert r.stats.item_loads.shape == (30,) and r.stats.item_loads.min() >= 1


# -- outputs ---------------------------------------------------------------------------

def test_out_memmap_file(pilot, tmp_path):
    xs = _data(45, 5)
    path = tmp_path / "d.npy"
    r = all_pairs.compute(pilot, xs, t.cityblock, out=str(path), tile=7)
    assert isinstance(r, np.memmap)
    _close(np.load(path)[np.triu_indices(45, 1)], pdist(np.array(xs), "cityblock"))
    assert r.stats.pairs == 45 * 46 // 2
    del r


def test_out_callback_covers_every_cell_once(pilot):
    xs = _data(33, 6)
    seen = np.zeros((33, 33), dtype=int)
    got = np.zeros((33, 33))

    def on_tile(i0, j0, tile):
        h, w = tile.shape
        seen[i0:i0 + h, j0:j0 + w] += 1
        got[i0:i0 + h, j0:j0 + w] = tile

    r = all_pairs.compute(pilot, xs, t.euclidean, out=on_tile, tile=5)
    assert r.size == 0 and r.stats.pairs == 33 * 34 // 2
    assert (seen == 1).all()
    _close(got[np.triu_indices(33, 1)], pdist(np.array(xs)))


@pytest.mark.parametrize("largest", [False, True])
def test_top_k(pilot, largest):
    vals = [float(v) for v in np.random.default_rng(7).integers(0, 40, size=50)]  # ties on purpose
    r = all_pairs.compute(pilot, vals, t.absdiff, top_k=4, tile=6, largest=largest)
    d = np.abs(np.subtract.outer(vals, vals))
    np.fill_diagonal(d, np.nan)
    assert r.shape == r.indices.shape == (50, 4)
    for i in range(50):
        row = np.where(np.isnan(d[i]), np.inf, -d[i] if largest else d[i])
        order = np.lexsort((np.arange(50), row))[:4]  # best first, ties to the smaller index
        assert list(r.indices[i]) == list(order)
        assert list(r[i]) == list(d[i][order])


def test_top_k_rectangular_and_padding(pilot):
    xs, ys = _data(12, 8), _data(3, 9)
    r = all_pairs.compute(pilot, xs, t.euclidean, other=ys, top_k=5)
    want = cdist(np.array(xs), np.array(ys))
    assert np.array_equal(r.indices[:, :3], np.argsort(want, axis=1, kind="stable"))
    assert (r.indices[:, 3:] == -1).all() and np.isnan(r[:, 3:]).all()


# -- edges -----------------------------------------------------------------------------

def test_empty_and_single(pilot):
    r0 = all_pairs.compute(pilot, [], t.euclidean)
    assert r0.shape == (0, 0) and r0.stats.pairs == 0
    r1 = all_pairs.compute(pilot, [np.ones(3)], t.euclidean)
    assert r1.shape == (1, 1) and r1[0, 0] == 0.0 and r1.stats.pairs == 1
    r2 = all_pairs.compute(pilot, _data(4), t.euclidean, other=[])
    assert r2.shape == (4, 0)
    r3 = all_pairs.compute(pilot, [], t.euclidean, top_k=2)
    assert r3.shape == (0, 2)


def test_stats_are_consistent(pilot):
    r = all_pairs.compute(pilot, _data(150, 10), t.euclidean, tile=8)
    s = r.stats
    assert s.workers == pilot.workers and s.tile == 8 and s.pairs == 150 * 151 // 2
    assert s.tiles == sum(w["tiles"] for w in s.per_worker) == (19 * 20) // 2
    assert s.tiles_stolen_warm <= s.tiles_stolen == s.tiles_stolen_local + s.tiles_stolen_remote
    assert s.loads == 0 and s.cache_hits + s.cache_misses > 0 and s.pairs_per_s > 0
    assert "pairs" in s.summary()


# -- bad input -------------------------------------------------------------------------

def test_compare_raising_names_the_pair(pilot):
    with pytest.raises(all_pairs.PairError, match=r"\(i, j\) = \(3, 5\).*ZeroDivisionError: boom") as info:
        all_pairs.compute(pilot, list(range(9)), t.fails_on_3_5, tile=2)
    assert (info.value.i, info.value.j) == (3, 5)
    r = all_pairs.compute(pilot, list(range(9)), t.absdiff, tile=2)  # the pilot goes on
    assert r[2, 7] == 5.0


def test_load_failing_names_the_key(pilot):
    keys = ["a", "bb", "bad-key", "ccc"]
    with pytest.raises(all_pairs.LoadError, match=r"load\('bad-key'\) failed for items\[2\]") as info:
        all_pairs.compute(pilot, keys, t.absdiff, load=t.load_or_fail, tile=1)
    assert info.value.key == "bad-key"


@pytest.mark.parametrize("fn, pattern", [(t.returns_string, r"'x' \(str\) for pair \(i, j\) = \(1, 2\)"),
                                         (t.returns_none, r"None \(NoneType\) for pair \(i, j\) = \(0, 0\)")])
def test_non_numeric_results_rejected(pilot, fn, pattern):
    with pytest.raises(all_pairs.PairError, match=pattern):
        all_pairs.compute(pilot, list(range(4)), fn, tile=4)


@pytest.mark.parametrize("block", [t.block_wrong_shape, t.block_strings])
def test_bad_block_rejected(pilot, block):
    with pytest.raises(all_pairs.PairError, match="must return a real-valued array of shape"):
        all_pairs.compute(pilot, list(range(5)), block=block)


@pytest.mark.parametrize("kwargs, exc", [
    ({}, TypeError),
    ({"compare": 3}, TypeError),
    ({"compare": t.absdiff, "tile": 0}, ValueError),
    ({"compare": t.absdiff, "cache_bytes": -1}, ValueError),
    ({"compare": t.absdiff, "top_k": 0}, ValueError),
    ({"compare": t.absdiff, "top_k": 2, "out": "x.npy"}, ValueError),
    ({"compare": t.absdiff, "out": 3}, TypeError),
])
def test_bad_arguments(pilot, kwargs, exc):
    with pytest.raises(exc):
        all_pairs.compute(pilot, [1, 2, 3], **kwargs)


def test_items_must_be_a_sequence(pilot):
    with pytest.raises(TypeError, match="sequence"):
        all_pairs.compute(pilot, "abc", t.absdiff)


def test_large_in_memory_items_do_not_travel_with_tasks(pilot):
    # 1.4 MB of items: more than a ring holds; tasks carry a handle, not the data set
    xs = list(np.random.default_rng(11).normal(size=(300, 600)))
    r = all_pairs.compute(pilot, xs, block=t.block_euclidean, tile=16)
    _close(r[np.triu_indices(300, 1)], pdist(np.array(xs)))
