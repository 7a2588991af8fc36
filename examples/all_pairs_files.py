"""All-pairs over items stored as files: a distance matrix, its 3 nearest neighbours, a file output.

    python examples/all_pairs_files.py [N]

Each item is a small vector in its own ``.npy`` file; ``load=np.load`` runs on
the workers, and each worker's cache keeps loaded items so that every file is
read about once per worker instead of once per pair.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import shoal  # noqa: E402
from shoal.patterns import all_pairs  # noqa: E402


def distance(a, b):
    """Euclidean distance of two loaded items (any picklable function of two items works)."""
    d = a - b
    return float(np.sqrt(np.dot(d, d)))


def main(n: int = 300) -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp, shoal.Pilot(workers=2) as pilot:
        paths = []
        for k in range(n):
            paths.append(os.path.join(tmp, f"item{k:04d}.npy"))
            np.save(paths[-1], rng.normal(size=8))

        dist = all_pairs.compute(pilot, paths, distance, load=np.load)
        print(f"matrix {dist.shape}: {dist.stats.summary()}")

        near = all_pairs.compute(pilot, paths, distance, load=np.load, top_k=3)
        print(f"nearest to item 0: {near.indices[0].tolist()} at {np.round(near[0], 3).tolist()}")

        on_disk = all_pairs.compute(pilot, paths, distance, load=np.load, out=os.path.join(tmp, "d.npy"))
        print(f"memmap output equals the in-memory one: {bool(np.array_equal(on_disk, dist))}")
        del on_disk

        try:
            all_pairs.compute(pilot, paths + [os.path.join(tmp, "missing.npy")], distance, load=np.load)
        except all_pairs.LoadError as exc:
            print(f"a bad key is named: {str(exc).splitlines()[0][:100]}...")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
