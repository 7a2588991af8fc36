"""Values that must travel to workers exactly as the driver made them.

``portable(fn)`` wraps a function defined in ``__main__`` so it travels by value
(workers have another ``__main__``); ``unwrap`` takes the wrapper off once per
task, so the search's hot loop calls the bare function (all_pairs uses it too).  (A ``Pinned``
wrapper for SharedArray/BestCell handles used to live here: handles now name
their creator's fd wherever they are re-pickled, so it had nothing left to do.)
"""

from __future__ import annotations


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


def unwrap(fn):
    return fn.fn if type(fn) is _ByValue else fn


def portable(fn):
    """``fn``, wrapped to travel by value when it (or a partial's function) lives in __main__."""
    inner = getattr(fn, "func", fn)
    if getattr(inner, "__module__", None) == "__main__":
        return _ByValue(fn)
    return fn
