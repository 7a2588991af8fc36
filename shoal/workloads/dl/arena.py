"""One shared-memory arena per training run: every buffer a task reads or writes.

The driver lays out named regions (training data, the epoch's permutation, parameters
and optimizer state per stage, gradient accumulators per replica and stage, reduction
tree nodes, activation slabs per replica/stage/micro-batch, the done table and the fused
update's arrivals: program.py) and maps them all in one
``shoal.SharedArray``.  Tasks receive the arena's handle once (inside the per-run
program, which a worker unpickles once) and exchange only small futures: activations and
gradients never travel as pickled copies through the driver.  One memory segment instead
of one per buffer keeps a worker's attach cache at a single entry and the driver's file
descriptors at one.

Data flow per step (``v = step % 2``): forwards read ``param[s][v]`` and write activation
slabs; backwards read them and write ``acc[r][s][m % 2]``; reductions write ``node``; the
update reads ``param[s][v]``, ``state[s][*][v]`` and the tree root and writes version
``1 - v``.  Double buffers make every task idempotent: a retry recomputes the same bytes
from inputs that nobody has overwritten yet.
"""

from __future__ import annotations

import numpy as np

from shoal import SharedArray

_ALIGN = 64


class Layout:
    """Named regions (offset, shape, dtype) of one arena; pure bookkeeping."""

    def __init__(self):
        self.regions: dict = {}
        self.size = 0

    def add(self, key, shape, dtype) -> None:
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset = -(-self.size // _ALIGN) * _ALIGN
        self.regions[key] = (offset, shape, dtype.str)
        self.size = offset + max(nbytes, 1)


class Arena:
    """A Layout mapped in shared memory; ``view(key)`` -> the numpy array of a region."""

    def __init__(self, layout: Layout, shared: SharedArray | None = None):
        self.layout = layout
        self.shared = shared if shared is not None else SharedArray((max(layout.size, 1),), "uint8")
        self._views: dict = {}

    def view(self, key) -> np.ndarray:
        v = self._views.get(key)
        if v is None:
            offset, shape, dtype = self.layout.regions[key]
            dtype = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            v = np.frombuffer(self.shared.array, dtype=dtype, count=count, offset=offset).reshape(shape)
            self._views[key] = v
        return v

    def __getstate__(self):
        return {"layout": self.layout, "shared": self.shared}

    def __setstate__(self, state):
        self.layout = state["layout"]
        self.shared = state["shared"]
        self._views = {}

    def close(self) -> None:
        self._views.clear()
        self.shared.close()


class PrivateArena:
    """A Layout's regions as this process's own arrays, each made (zeroed) on first use.

    What a task of a run across hosts (``across_hosts.py``) computes in: the same region
    names as the shared arena, so the program's arithmetic is literally the same code;
    only the regions that process touches take memory.  It pickles as its layout."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self._views: dict = {}

    def view(self, key) -> np.ndarray:
        v = self._views.get(key)
        if v is None:
            _, shape, dtype = self.layout.regions[key]
            v = self._views[key] = np.zeros(shape, np.dtype(dtype))
        return v

    def __getstate__(self):
        return {"layout": self.layout}

    def __setstate__(self, state):
        self.layout = state["layout"]
        self._views = {}

    def close(self) -> None:
        self._views.clear()
