"""Seeded Zipf key choice with a multi-partition knob (numpy; pure, no I/O)."""

from __future__ import annotations

import numpy as np


class Keys:
    """Draws keys in ``[0, n)`` with P(k) ~ 1/(k+1)^theta; ``rng`` is a seeded numpy Generator."""

    def __init__(self, n: int, theta: float, rng: np.random.Generator, partitions: int = 2):
        if n < 1:
            raise ValueError("n_keys must be >= 1")
        if theta < 0:
            raise ValueError("theta must be >= 0")
        self.n, self.rng, self.partitions = n, rng, max(1, partitions)
        w = 1.0 / np.arange(1, n + 1, dtype=float) ** theta
        self.cdf = np.cumsum(w) / w.sum()
        self.perm = rng.permutation(n)  # hot keys scattered over the key space (and partitions)

    def draw(self, size: int) -> np.ndarray:
        idx = np.searchsorted(self.cdf, self.rng.random(size), "right")
        return self.perm[np.minimum(idx, self.n - 1)]

    def group(self, length: int, multi: bool) -> list:
        """``length`` keys: all in the first key's partition, or (multi) not all in it."""
        ks = self.draw(length).tolist()
        p = self.partitions
        if p == 1 or self.n < p or length < 2:
            return ks
        home = ks[0] % p
        for i in range(1, length):
            k = ks[i]
            want = home if not multi else (home + 1 + (i - 1) % (p - 1)) % p
            k = k - k % p + want
            if k >= self.n:
                k -= p
            ks[i] = k
        return ks
