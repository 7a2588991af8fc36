"""The state of a transactional stream: named integer tables in one shared-memory array.

``Store({"accounts": array, ...})`` copies every table into ONE flat int64
``shoal.SharedArray``; a table is a view at an offset.  A state access names
``(table, key)``; inside the engine it becomes a *global key* ``gid = base[table]
+ key``, so the scheduler handles one key space, one array and one dtype.

Invariants: tables are 1-D and integer-typed (int64 holds them all; anything
else is refused at construction, never silently truncated); the layout (names,
order, sizes) is fixed for the life of the store and is what a checkpoint is
checked against.  Rejected: one SharedArray per table (a version read would
first have to find the table's mapping; one flat array is one memoryview).
"""

from __future__ import annotations

import numpy as np

import shoal


class Store:
    """Named 1-D integer tables in shared memory (the driver creates it; tasks receive it)."""

    def __init__(self, tables: dict):
        if not isinstance(tables, dict) or not tables:
            raise TypeError("ts.Store needs a non-empty dict of table name -> 1-D integer array")
        layout, arrays, base = {}, [], 0
        for name, values in tables.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"ts.Store: table names must be non-empty strings, got {name!r}")
            arr = np.asarray(values)
            if arr.ndim != 1:
                raise ValueError(f"ts.Store: table {name!r} must be 1-D, got shape {arr.shape}")
            if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
                raise TypeError(f"ts.Store: table {name!r} must hold integers that fit int64, "
                                f"got dtype {arr.dtype}")
            layout[name] = (base, len(arr))
            arrays.append(arr.astype(np.int64))
            base += len(arr)
        self.layout = layout  # name -> (base, size): small, picklable, sent with every task
        self.size = base
        self._flat = shoal.SharedArray((max(base, 1),), "int64", fill=0)
        if base:
            self._flat.array[:base] = np.concatenate(arrays)

    @property
    def flat(self) -> np.ndarray:
        """All tables, concatenated (a live view of the shared memory)."""
        return self._flat.array[: self.size]

    @property
    def shared(self) -> shoal.SharedArray:
        return self._flat

    def table(self, name: str) -> np.ndarray:
        """A live view of one table."""
        base, size = self._lookup(name)
        return self._flat.array[base: base + size]

    def _lookup(self, name):
        try:
            return self.layout[name]
        except KeyError:
            raise KeyError(f"unknown table {name!r} (tables: {', '.join(self.layout)})") from None

    def snapshot(self) -> dict:
        """dict name -> a numpy copy of the table."""
        return {name: self.table(name).copy() for name in self.layout}

    def fingerprint(self) -> list:
        return [[name, base, size] for name, (base, size) in self.layout.items()]

    def close(self) -> None:
        self._flat.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}[{s}]" for n, (_, s) in self.layout.items())
        return f"<ts.Store {sizes}>"
