"""all_pairs.compute on vectors already in memory (a numpy array, ``block=``): equal to
scipy's pdist/cdist, condensed or square or rectangular, on 1 and 2 workers; strips
partition the pairs; bad blocks are named; workers let go of the result's memory."""

from __future__ import annotations

import functools
import pickle

import ap_tasks as t
import numpy as np
import pytest
from scipy.spatial.distance import cdist, pdist

import shoal
from shoal.patterns import _pair_arrays as A
from shoal.patterns import all_pairs


@pytest.fixture(scope="module", params=[1, 2], ids=["1worker", "2workers"])
def pilot(request):
    with shoal.Pilot(workers=request.param) as p:
        yield p


def _x(n, dim=16, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(dtype)


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "cityblock"])
def test_condensed_equals_pdist(pilot, metric):
    x = _x(613)  # not a multiple of anything
    r = all_pairs.compute(pilot, x, block=functools.partial(cdist, metric=metric),
                          condensed=True)
    want = pdist(x, metric)
    assert r.shape == want.shape
    np.testing.assert_allclose(r, want, rtol=1e-12, atol=1e-12)
    assert r.stats.pairs == len(want) and r.stats.tiles > 1


def test_square_and_rectangular_equal_cdist(pilot):
    x, y = _x(300), _x(77, seed=1)
    sq = all_pairs.compute(pilot, x, block=cdist)
    np.testing.assert_allclose(sq, cdist(x, x), rtol=1e-12, atol=1e-12)
    assert sq.stats.pairs == 300 * 301 // 2
    rect = all_pairs.compute(pilot, x, other=y, block=cdist)
    np.testing.assert_allclose(rect, cdist(x, y), rtol=1e-12, atol=1e-12)
    full = all_pairs.compute(pilot, x, block=t.BLOCK["euclidean"], symmetric=False)
    np.testing.assert_allclose(full, cdist(x, x), rtol=1e-12, atol=1e-12)


def test_small_and_odd_inputs(pilot):
    for n in (0, 1, 2, 5):
        x = _x(n) if n else np.empty((0, 16))
        r = all_pairs.compute(pilot, x, block=cdist, condensed=True)
        assert r.shape == (n * (n - 1) // 2,)
        if n > 1:
            np.testing.assert_allclose(r, pdist(x), rtol=1e-12)
    x32 = _x(200, dtype=np.float32)  # the result is float64, as pdist's
    r = all_pairs.compute(pilot, x32, block=cdist, condensed=True)
    np.testing.assert_allclose(r, pdist(x32), rtol=1e-6)
    # the generic path (a list of items) gives the condensed vector too
    r = all_pairs.compute(pilot, list(_x(40)), t.PER_PAIR["euclidean"], condensed=True)
    np.testing.assert_allclose(r, pdist(_x(40)), rtol=1e-12)


def _bad_shape(a, b):
    return np.zeros((len(a), len(b) - 1))


def _boom(a, b):
    if len(b) < 200:
        raise ValueError("boom")
    return cdist(a, b)


def test_bad_blocks_are_named(pilot):
    x = _x(300)
    with pytest.raises(all_pairs.PairError, match=r"returned shape \(\d+, \d+\), expected"):
        all_pairs.compute(pilot, x, block=_bad_shape, condensed=True)
    with pytest.raises(all_pairs.PairError,
                       match=r"block failed on rows \[\d+, \d+\) x columns \[\d+, 300\).*boom"):
        all_pairs.compute(pilot, x, block=_boom, condensed=True)
    with pytest.raises(ValueError, match="condensed=True"):
        all_pairs.compute(pilot, x, other=x, block=cdist, condensed=True)


def test_strips_partition_and_balance():
    for n in (1, 2, 7, 100, 1001):
        for parts in (1, 3, 32):
            s = A.strips(n, parts, True)
            assert s[0][0] == 0 and s[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(s, s[1:], strict=False))
            assert len(s) <= min(parts, n)
            if n >= 1000 and parts == 32:
                pairs = [sum(n - i for i in range(a, b)) for a, b in s]
                assert max(pairs) < 1.2 * n * (n + 1) / 2 / parts + n
    assert A.strips(10, 3, False) == [(0, 4), (4, 8), (8, 10)]
    n = 9
    idx = [A.condensed_start(n, i) for i in range(n - 1)]
    assert idx == [sum(n - k - 1 for k in range(i)) for i in range(n - 1)]


def test_closed_shared_array_is_not_handed_out_again():
    """A worker that closes an attached array (as strip tasks do) attaches afresh later."""
    sa = shoal.SharedArray((4,), "float64", fill=1.0)
    try:
        a = pickle.loads(pickle.dumps(sa))
        a.close()
        b = pickle.loads(pickle.dumps(sa))
        assert b is not a and b.array[0] == 1.0
        b.close()
    finally:
        sa.close()


@pytest.mark.parametrize("block", ["block_complex", "block_objects"])
def test_a_block_that_is_not_real_valued_is_refused_not_cast(pilot, block):
    # Before: the array path wrote the block into the float64 result as is: a complex block
    # lost its imaginary part (a ComplexWarning in the worker's log, nothing else), an
    # object block of None became NaN.  The tiled path refused both; now both paths do.
    with pytest.raises(all_pairs.PairError, match="real-valued"):
        all_pairs.compute(pilot, _x(20), block=getattr(t, block))
    assert all_pairs.compute(pilot, _x(5), block=cdist).shape == (5, 5)  # pilot still fine


def test_an_object_array_of_items_takes_the_tiled_path(pilot):
    # Before: ValueError "cannot create an OBJECT array from memory buffer" (SharedArray),
    # naming neither the items nor what to do; a list of the same strings worked.
    words = np.array(["ab", "cde", "f", "ghij"], dtype=object)
    got = all_pairs.compute(pilot, words, block=t.block_len_sum)
    want = np.array([[len(a) + len(b) for b in words] for a in words], dtype=float)
    np.testing.assert_array_equal(got, want)
