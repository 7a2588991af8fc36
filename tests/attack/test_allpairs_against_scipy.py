"""Breaking all_pairs on arrays already in memory the way a scipy user does.

Every result is compared with scipy's ``pdist``/``cdist`` on the same input: odd and prime
sizes, every dtype a user's array arrives in, memory layouts numpy produces, NaN and inf,
metrics.  A block that writes its rows in place was silently wrong (a race between strips).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist, pdist, squareform

import shoal
from shoal.patterns import all_pairs
from shoal.patterns.all_pairs import PairError


@pytest.fixture(scope="module")
def pilot():
    with shoal.Pilot(workers=2) as p:
        yield p


def _x(n, dim=6, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dim))


def _centring_block(rows, cols):
    """A block written for a single call ``block(X, X)``: it centres its rows in place."""
    rows -= rows.mean(axis=1, keepdims=True)
    return cdist(rows, cols - cols.mean(axis=1, keepdims=True))


def test_a_block_writing_its_rows_in_place_is_refused_not_raced(pilot):
    """Before: the strips of both workers read the same shared rows while a strip centred
    its own in place, so the condensed result was off by up to 0.14 in one run of three
    (right in the others); called once on the user's array the same block is exact.  Now
    the block gets read-only views and the write is a PairError that says so."""
    x = _x(200, 8)
    for _ in range(3):
        with pytest.raises(PairError, match="read-only views of the shared rows"):
            all_pairs.compute(pilot, x.copy(), block=_centring_block, condensed=True)
    # and a block that copies first gives scipy's numbers
    xc = x - x.mean(axis=1, keepdims=True)
    got = all_pairs.compute(pilot, x, block=lambda a, b: _centring_block(a.copy(), b), condensed=True)
    np.testing.assert_allclose(got, pdist(xc), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 13, 31, 97])
def test_odd_and_prime_sizes_equal_scipy(pilot, n):
    x, y = _x(n, seed=n), _x(max(n - 1, 0), seed=n + 100)
    np.testing.assert_allclose(all_pairs.compute(pilot, x, block=cdist, condensed=True), pdist(x),
                               rtol=1e-12, atol=1e-12)
    square = all_pairs.compute(pilot, x, block=cdist)
    assert square.shape == (n, n)
    np.testing.assert_allclose(square, squareform(pdist(x)) if n else np.zeros((0, 0)), atol=1e-12)
    np.testing.assert_allclose(all_pairs.compute(pilot, x, block=cdist, symmetric=False),
                               cdist(x, x), atol=1e-12)
    np.testing.assert_allclose(all_pairs.compute(pilot, x, block=cdist, other=y), cdist(x, y),
                               atol=1e-12)


def _inputs():
    x = _x(40)
    return {"float32": x.astype(np.float32), "int64": (x * 10).astype(np.int64),
            "int8": (x * 10).astype(np.int8), "uint8": (np.abs(x) * 10).astype(np.uint8),
            "bool": x > 0, "fortran": np.asfortranarray(x), "strided": x[::2, ::2],
            "transposed": np.ascontiguousarray(x.T).T, "nan": np.where(x > 1.5, np.nan, x),
            "inf": np.where(x > 1.5, np.inf, x)}


@pytest.mark.parametrize("kind", list(_inputs()))
@pytest.mark.parametrize("metric", ["euclidean", "cityblock", "hamming"])
def test_dtypes_layouts_and_non_finite_values_equal_pdist(pilot, kind, metric):
    x = _inputs()[kind]
    got = all_pairs.compute(pilot, x, block=lambda a, b: cdist(a, b, metric), condensed=True)
    assert got.dtype == np.float64 and got.shape == (len(x) * (len(x) - 1) // 2,)
    np.testing.assert_allclose(got, pdist(x, metric), rtol=1e-12, atol=1e-12, equal_nan=True)
