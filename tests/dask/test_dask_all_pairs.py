"""all_pairs on the dask backend (a LocalCluster of 2 dask worker processes, one shoal worker
each): a pilot whose workers are all on the driver's host keeps the one-host path (shared
memory written in place); the across-hosts path (items copied to each host, tiles sent back),
chosen by ``all_pairs.across_hosts`` when some dask worker is on another host, is run here
too by making that choice say so: every output mode gives scipy's values.

The same path on real separate hosts (no shared /dev/shm or /tmp): tests/multihost."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from dask_cluster import clusters, pilot  # noqa: F401 - fixtures
from scipy.spatial.distance import cdist, pdist, squareform

from shoal.patterns import all_pairs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "patterns_allpairs"))
import ap_tasks as t  # noqa: E402

pytestmark = pytest.mark.fd_slack(8)


@pytest.fixture(scope="module")
def kind(clusters):
    clusters.warm("dask-localcluster")
    return "dask-localcluster"


@pytest.fixture
def across(pilot, monkeypatch):
    """The pilot, with compute() taking the across-hosts path."""
    monkeypatch.setattr(all_pairs, "across_hosts", lambda p: True)
    return pilot


def test_workers_on_the_drivers_host_keep_the_shared_memory_path(pilot):
    assert not all_pairs.across_hosts(pilot)
    x = np.random.default_rng(1).normal(size=(40, 3))
    np.testing.assert_array_equal(all_pairs.compute(pilot, x, block=cdist, condensed=True),
                                  pdist(x))


def test_arrays_across_hosts_give_scipys_values(across):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(70, 4)), rng.normal(size=(30, 4))
    np.testing.assert_array_equal(all_pairs.compute(across, x, block=cdist, condensed=True),
                                  pdist(x))
    np.testing.assert_array_equal(all_pairs.compute(across, x, block=cdist), squareform(pdist(x)))
    np.testing.assert_array_equal(all_pairs.compute(across, x, block=cdist, other=y), cdist(x, y))


def test_a_block_error_across_hosts_names_its_rows(across):
    with pytest.raises(all_pairs.PairError, match=r"block\(rows, cols\) .* returned shape"):
        all_pairs.compute(across, np.zeros((20, 2)), block=t.block_wrong_shape)


def test_loaded_items_across_hosts_every_output(across, tmp_path):
    x = np.random.default_rng(3).normal(size=(45, 3))
    paths = []
    for i, row in enumerate(x):
        paths.append(str(tmp_path / f"{i:02d}.npy"))
        np.save(paths[-1], row)
    ref = squareform(pdist(x))
    got = all_pairs.compute(across, paths, t.euclidean, load=t.load_npy, tile=4)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert got.stats.pairs == 45 * 46 // 2 and got.stats.tiles > 1
    assert got.stats.loads >= 45 and got.stats.item_loads.min() >= 1
    assert sum(w["pairs"] for w in got.stats.per_worker) >= got.stats.pairs
    assert all(w["host"] for w in got.stats.per_worker)

    out = str(tmp_path / "d.npy")
    on_disk = all_pairs.compute(across, paths, t.euclidean, load=t.load_npy, tile=4, out=out)
    assert on_disk.shape == (45, 45)
    np.testing.assert_allclose(np.load(out), ref, rtol=1e-12, atol=1e-12)

    seen = np.full((45, 45), np.nan)

    def on_tile(i0, j0, tile):
        seen[i0:i0 + tile.shape[0], j0:j0 + tile.shape[1]] = tile

    all_pairs.compute(across, paths, t.euclidean, load=t.load_npy, tile=4, out=on_tile)
    np.testing.assert_allclose(seen, ref, rtol=1e-12, atol=1e-12)

    best = all_pairs.compute(across, paths, t.euclidean, load=t.load_npy, tile=4, top_k=3)
    masked = ref + np.diag(np.full(45, np.inf))
    np.testing.assert_array_equal(best.indices, np.argsort(masked, axis=1, kind="stable")[:, :3])

    rect = all_pairs.compute(across, list(x[:20]), t.euclidean, other=list(x[20:]), tile=4)
    np.testing.assert_allclose(rect, cdist(x[:20], x[20:]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attempt", range(3))
def test_a_failing_pair_across_hosts_stops_the_run_and_names_it(across, attempt):
    """The pair fails in the first block; blocks that start after the abort return nothing
    (they once broke the driver's loop with a TypeError instead of the PairError)."""
    with pytest.raises(all_pairs.PairError, match=r"\(i, j\) = \((3, 5|5, 3)\)"):
        all_pairs.compute(across, list(range(60)), t.fails_on_3_5, tile=1)
