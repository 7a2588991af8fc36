"""Values that must travel to workers exactly as the driver made them.

``portable(fn)`` wraps a function defined in ``__main__`` so it travels by value
(workers have another ``__main__``); ``unwrap`` takes the wrapper off once per
task, so the search's hot loop calls the bare function.  ``Pinned`` ships an
object (a SharedArray or BestCell) wherever it is re-sent.  Split out of ``_search`` so the engine module stays about one concept.
"""

from __future__ import annotations

import pickle


class _ByValue:
    """Ships a function defined in ``__main__`` by value (workers have another ``__main__``).

    Unpickles to a wrapper again (a bare function from cloudpickle would make
    the next plain pickle of a stolen task fail); Explorer unwraps it once per
    task (``unwrap``), so the hot path pays nothing.
    """

    __slots__ = ("fn", "blob")

    def __init__(self, fn, blob=None):
        self.fn, self.blob = fn, blob

    def __call__(self, *args):
        return self.fn(*args)

    @staticmethod
    def _load(blob):
        import cloudpickle

        return _ByValue(cloudpickle.loads(blob), blob)

    def __reduce__(self):
        if self.blob is None:
            import cloudpickle

            self.blob = cloudpickle.dumps(self.fn)
        return (_ByValue._load, (self.blob,))


class Pinned:
    """A SharedArray, BestCell or Channel in a Spec, pickled afresh wherever it is re-sent.

    Handles name their creator, so a re-pickled handle maps the same memory on this
    machine; on a dask node, re-pickling in the dask worker turns the driver's
    handle into the node's own replica (shoal.backends._dask_cells), which that
    node's workers must share.  (It used to keep the driver's bytes instead: a
    worker's handle once named the worker's own fd number.)
    """

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    @staticmethod
    def _load(blob):
        return Pinned(pickle.loads(blob))

    def __reduce__(self):
        return (Pinned._load, (pickle.dumps(self.obj, 5),))


def unwrap(fn):
    return fn.fn if type(fn) is _ByValue else fn


def portable(fn):
    """``fn``, wrapped to travel by value when it (or a partial's function) lives in __main__."""
    inner = getattr(fn, "func", fn)
    if getattr(inner, "__module__", None) == "__main__":
        return _ByValue(fn)
    return fn
