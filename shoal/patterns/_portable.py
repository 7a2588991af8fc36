"""Values that must travel to workers exactly as the driver made them.

``portable(fn)`` wraps a function defined in ``__main__`` so it travels by value
(workers have another ``__main__``); ``unwrap`` takes the wrapper off once per
task, so the search's hot loop calls the bare function.  ``Pinned`` ships an
object (a SharedArray or BestCell) as the driver pickled it, whoever re-sends
it.  Split out of ``_search`` so the engine module stays about one concept.
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
    """A SharedArray or BestCell that always re-pickles as the driver pickled it.

    Works around shoal's SharedArray handle, which a worker re-pickles with its
    own fd number (a task stolen from a worker then maps the wrong file); the
    driver's pickle names the driver's fd, valid for every worker.
    """

    __slots__ = ("obj", "blob")

    def __init__(self, obj, blob=None):
        self.obj = obj
        self.blob = pickle.dumps(obj, 5) if blob is None else blob

    @staticmethod
    def _load(blob):
        # pickled again from the object loaded here: the same bytes for a SharedArray or
        # BestCell of this machine (handles name their creator), but on a dask node the
        # node's own replica (shoal.backends._dask_cells), which its workers must share
        return Pinned(pickle.loads(blob))

    def __reduce__(self):
        return (Pinned._load, (self.blob,))


def unwrap(fn):
    return fn.fn if type(fn) is _ByValue else fn


def portable(fn):
    """``fn``, wrapped to travel by value when it (or a partial's function) lives in __main__."""
    inner = getattr(fn, "func", fn)
    if getattr(inner, "__module__", None) == "__main__":
        return _ByValue(fn)
    return fn
