"""All-pairs benchmark: shoal's tiled skeleton vs a sequential loop, per-row pool tasks and scipy.

Usage::

    python benchmarks/bench_all_pairs.py            # N=2000 items from .npy files, 2 workers
    python benchmarks/bench_all_pairs.py --quick    # N=400, smaller block problem

Everything is measured in one run and reported as ratios (the machines are
small and noisy; absolute times are printed only for context):

1. items as ``.npy`` files, ``compare`` = a small numpy expression per pair:
   * sequential: load every item once, then a double loop over ``i <= j``;
   * shoal ``all_pairs.compute(load=np.load)`` on ``--workers`` workers;
   * the naive pool approach (joblib if installed, else multiprocessing.Pool):
     one task per row ``i`` that loads item ``i`` and every item ``j >= i``
     itself -> ``N (N + 1) / 2`` loads;
   * the same compute on a 1-worker pilot (shoal pins each worker to a CPU, so
     on a shared machine "2 workers vs 1 worker" isolates the scaling);
2. items in memory, the vectorised ``block`` path (``cdist`` per tile) vs
   scipy's single-core ``cdist`` on the whole data;
3. vectors in a numpy array (N = 20,000 x 64 by default): ``all_pairs.compute(pilot,
   X, block=cdist, condensed=True)`` vs scipy's ``pdist(X)`` -- the same half of the
   matrix, the same values (checked to 1e-12); ``--pdist-only`` runs just this one.

Pool start-up is outside every timing (a warm-up task first), so the ratios
compare the work, not process creation.  The sequential loop, shoal and cdist
runs are interleaved ``--repeat`` times and the best time of each counts (on
a shared, noisy machine noise only ever adds time); the slow per-row pool
runs once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from scipy.spatial.distance import cdist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import shoal  # noqa: E402
from shoal.patterns import all_pairs  # noqa: E402


def compare(a, b):
    d = a - b
    return float(np.sqrt(np.dot(d, d)))


def block(rows, cols):
    return cdist(np.asarray(rows), np.asarray(cols))


def sequential(paths):
    n = len(paths)
    xs = [np.load(p) for p in paths]
    out = np.empty((n, n))
    for i in range(n):
        a = xs[i]
        for j in range(i, n):
            out[i, j] = out[j, i] = compare(a, xs[j])
    return out, n


def naive_row(args):
    """One row task that loads what it needs: item i and every item j >= i."""
    i, paths = args
    a = np.load(paths[i])
    vals = [compare(a, np.load(paths[j])) for j in range(i, len(paths))]
    return i, vals, 1 + len(paths) - i


def naive_pool(paths, workers):
    n = len(paths)
    out = np.empty((n, n))
    tasks = [(i, paths) for i in range(n)]
    try:
        import joblib

        name = "joblib"
        with joblib.Parallel(n_jobs=workers) as par:
            par(joblib.delayed(abs)(1) for _ in range(workers))  # start the pool
            t0 = time.perf_counter()
            rows = par(joblib.delayed(naive_row)(t) for t in tasks)
            seconds = time.perf_counter() - t0
    except ImportError:
        import multiprocessing as mp

        name = "multiprocessing.Pool"
        with mp.get_context("fork").Pool(workers) as pool:
            pool.map(abs, range(workers))
            t0 = time.perf_counter()
            rows = pool.map(naive_row, tasks)
            seconds = time.perf_counter() - t0
    loads = 0
    for i, vals, k in rows:
        out[i, i:] = vals
        out[i:, i] = vals
        loads += k
    return out, loads, seconds, name


def vs_pdist(args) -> int:
    """Section 3: arrays in memory, condensed output, against scipy's pdist."""
    from scipy.spatial.distance import pdist

    x = np.random.default_rng(1).normal(size=(args.pdist_n, args.pdist_dim))
    t_pdist = t_one = t_shoal = float("inf")
    with shoal.Pilot(workers=args.workers) as pilot, shoal.Pilot(workers=1) as one:
        for p in (pilot, one):
            all_pairs.compute(p, x[:300], block=cdist, condensed=True)  # warm: imports
        for _ in range(args.repeat):  # interleaved, best of each
            t0 = time.perf_counter()
            ref = pdist(x)
            t_pdist = min(t_pdist, time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = all_pairs.compute(pilot, x, block=cdist, condensed=True)
            t_shoal = min(t_shoal, time.perf_counter() - t0)
            err = float(np.max(np.abs(got - ref))) if ref.size else 0.0
            assert got.shape == ref.shape and err <= 1e-12, f"differs from pdist by {err}"
            del got
            if not args.skip_one:
                t0 = time.perf_counter()
                got = all_pairs.compute(one, x, block=cdist, condensed=True)
                t_one = min(t_one, time.perf_counter() - t0)
                del got
            del ref
    print(f"# arrays in memory: N={args.pdist_n} x {args.pdist_dim} float64, euclidean, "
          f"condensed output ({args.pdist_n * (args.pdist_n - 1) // 2:,} values); "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; best of {args.repeat}")
    print("\n| approach | seconds | speed-up vs pdist |\n|---|---:|---:|")
    print(f"| scipy pdist(X) (one core) | {t_pdist:.2f} | 1.00x |")
    if not args.skip_one:
        print(f"| shoal compute(X, block=cdist, condensed=True), 1 worker | {t_one:.2f} | "
              f"{t_pdist / t_one:.2f}x |")
    print(f"| shoal compute(X, block=cdist, condensed=True), {args.workers} workers | "
          f"{t_shoal:.2f} | {t_pdist / t_shoal:.2f}x |")
    print(f"\nshoal over pdist: {t_pdist / t_shoal:.2f}x (target >= 1.5x on 2 workers); "
          f"max |difference| {err:.1e}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="items loaded from .npy files (default 2000)")
    ap.add_argument("--dim", type=int, default=16, help="vector length of each item (default 16)")
    ap.add_argument("--block-n", type=int, default=6000, help="items of the block-path problem (default 6000)")
    ap.add_argument("--block-dim", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repeats; the best time of each counts")
    ap.add_argument("--quick", action="store_true", help="small sizes (N=400, block N=1500)")
    ap.add_argument("--skip-naive", action="store_true", help="leave out the slow per-row pool run")
    ap.add_argument("--pdist-n", type=int, default=20000, help="rows of the pdist problem")
    ap.add_argument("--pdist-dim", type=int, default=64)
    ap.add_argument("--pdist-only", action="store_true", help="run section 3 only")
    ap.add_argument("--skip-one", action="store_true", help="section 3 without the 1-worker run")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.block_n, args.pdist_n = 400, 1500, 4000
    if args.pdist_only:
        return vs_pdist(args)
    rng = np.random.default_rng(0)
    rows = []

    with tempfile.TemporaryDirectory(prefix="shoal-allpairs-") as tmp:
        xs = rng.normal(size=(args.n, args.dim))
        paths = []
        for k, x in enumerate(xs):
            paths.append(os.path.join(tmp, f"item{k:05d}.npy"))
            np.save(paths[-1], x)

        ys = rng.normal(size=(args.block_n, args.block_dim))
        items = list(ys)
        t_seq = t_shoal = t_one = t_cdist = t_block = float("inf")
        with shoal.Pilot(workers=args.workers) as pilot, shoal.Pilot(workers=1) as one:
            all_pairs.compute(pilot, paths[:200], compare, load=np.load)  # warm: imports, code paths
            all_pairs.compute(one, paths[:200], compare, load=np.load)
            all_pairs.compute(pilot, items[:50], block=block)  # warm: workers import scipy
            for _ in range(args.repeat):  # interleaved, best of each: noise only ever adds time
                t0 = time.perf_counter()
                ref, seq_loads = sequential(paths)
                t_seq = min(t_seq, time.perf_counter() - t0)
                t0 = time.perf_counter()
                got = all_pairs.compute(pilot, paths, compare, load=np.load)
                t_shoal = min(t_shoal, time.perf_counter() - t0)
                st = got.stats
                assert np.allclose(got, ref, rtol=1e-12), "shoal result differs from the sequential loop"
                t0 = time.perf_counter()
                one_loads = all_pairs.compute(one, paths, compare, load=np.load).stats.loads
                t_one = min(t_one, time.perf_counter() - t0)

                t0 = time.perf_counter()
                ref_b = cdist(ys, ys)
                t_cdist = min(t_cdist, time.perf_counter() - t0)
                t0 = time.perf_counter()
                got_b = all_pairs.compute(pilot, items, block=block)
                t_block = min(t_block, time.perf_counter() - t0)
                assert np.allclose(got_b, ref_b, rtol=1e-12), "block path differs from cdist"
                tile_b = got_b.stats.tile
                del got_b, ref_b

        if not args.skip_naive:
            nv, naive_loads, t_naive, pool_name = naive_pool(paths, args.workers)
            assert np.allclose(nv, ref, rtol=1e-12)

    n = args.n
    print(f"# all-pairs, N={n} .npy items (dim {args.dim}), {args.workers} workers, "
          f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}); best of {args.repeat}; "
          "compare = sqrt(dot(a-b, a-b)) per pair")
    print(f"# shoal: tile {st.tile}, {st.tiles} tiles, {st.tiles_stolen} stolen "
          f"({st.tiles_stolen_warm} warm), cache {st.cache_hits} hits / {st.cache_misses} misses")
    rows.append(("sequential loop (load once, i<=j)", t_seq, seq_loads, "1.00x"))
    rows.append(("shoal all_pairs (1 worker)", t_one, one_loads, f"{t_seq / t_one:.2f}x"))
    rows.append((f"shoal all_pairs ({args.workers} workers)", t_shoal, st.loads, f"{t_seq / t_shoal:.2f}x"))
    if not args.skip_naive:
        rows.append((f"{pool_name}, one task per row, load inside", t_naive, naive_loads,
                     f"{t_seq / t_naive:.2f}x"))
    print("\n| approach | seconds | loads | loads/item | speed-up vs sequential |\n|---|---:|---:|---:|---:|")
    for name, secs, loads, ratio in rows:
        print(f"| {name} | {secs:.2f} | {loads:,} | {loads / n:.1f} | {ratio} |")
    print()
    print(f"shoal speed-up over the sequential loop: {t_seq / t_shoal:.2f}x (target >= 1.8x); "
          f"{args.workers} workers over 1 worker: {t_one / t_shoal:.2f}x")
    if not args.skip_naive:
        print(f"loads, per-row pool / shoal: {naive_loads / max(1, st.loads):.0f}x fewer (target >= 10x); "
              f"time, per-row pool / shoal: {t_naive / t_shoal:.2f}x")
    print(f"block path (cdist per tile {tile_b}, N={args.block_n}, dim {args.block_dim}): "
          f"scipy cdist single-core {t_cdist:.2f} s, shoal {t_block:.2f} s -> "
          f"{t_cdist / t_block:.2f}x cdist's speed")
    print()
    return vs_pdist(args)


if __name__ == "__main__":
    sys.exit(main())
