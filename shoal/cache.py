"""Results of function calls kept in a folder: ``pilot.options(cache=path).submit(f, ...)`` and
``@shoal.cached(path)``.

A call's key is SHA-256 over the function by value (shoal/_taskkey.py: its code, defaults,
closure, and the code of the functions of the user's own modules it names, recursively) and its
arguments as plain data.  An argument that is not plain data (numbers, strings, bytes, tuples,
lists, dicts, sets, numpy arrays of numbers) cannot be part of a key: the call is refused with a
``ValueError`` naming the argument, rather than cached on a guess.

One file per key, ``<path>/<key>.result``: a checked container (shoal/_durable.py: header with
the key, the body's length and SHA-256) whose body is the value in the ensemble journal's data
format (patterns/ensemble/values.py: msgpack, reading never runs code), or pickle with
``pickle=True``.  Written atomically (a reader sees the old file or the new one); read without
following links; a torn, tampered or foreign file is a miss with a ``CacheWarning``, and the call
runs.  A file stored with pickle is read only by a cache opened with ``pickle=True``: reading it
runs code its author chose (docs/runtime.md, "Trust boundaries"), so use it only for folders
only you can write.

``pilot.options(cache=path).submit`` looks the key up in the driver: a hit is a finished
``shoal.Future`` and nothing is submitted; a miss is submitted, and the worker that runs it
stores the value before returning it, so a done future's value is in the folder.
``@shoal.cached(path)`` wraps the function itself: the lookup happens wherever it is called.
Either way the workers need the folder on a filesystem they share with the driver (on dask:
a shared filesystem, as for an ensemble's sandboxes).

Rejected alternatives: pickle by default (a shared cache folder would be a code-execution vector
for whoever can write it); keying by ``module:qualname`` (an edited function, or a helper it
calls, would give the old results); storing a miss's value from the driver when it arrives (a
done callback on the pilot's result thread: the future was done before the file existed, and
file I/O delayed every other result); an SQLite file for the cache (concurrent writers from many
workers and hosts on a network filesystem; one file per key needs no lock).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import warnings

from ._durable import CheckpointError, pack, read_file, unpack, write_atomic
from ._taskkey import CacheWarning, Unkeyable, data_bytes, function_digest

KIND = "function-result"
__all__ = ["CacheWarning", "Cached", "FunctionCache", "cached", "submit_cached"]


def _values():
    from .patterns.ensemble import values

    return values


class FunctionCache:
    """One cache folder; ``pickle``: whether values may be stored and read with pickle."""

    def __init__(self, path, *, pickle: bool = False):
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"cache: the folder must be a path, got {path!r}")
        if not isinstance(pickle, bool):
            raise TypeError(f"cache: pickle must be True or False, got {pickle!r}")
        self.path = os.path.abspath(os.fspath(path))
        self.pickle = pickle
        if os.path.islink(self.path):
            raise ValueError(f"cache folder {self.path} is a symbolic link; give the real path")
        os.makedirs(self.path, exist_ok=True)

    def key(self, fn, args, kwargs) -> str:
        """The key of ``fn(*args, **kwargs)``; ValueError naming what cannot be keyed."""
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            code = function_digest(fn, _values().numpy_bytes)
        except Unkeyable as exc:
            raise ValueError(f"cache: {name} cannot be keyed: {exc}") from None
        except RecursionError:
            raise ValueError(f"cache: {name} cannot be keyed: its code nests too deep to hash") from None
        h = hashlib.sha256(code.encode())
        h.update(b"args:%d;" % len(args))  # framed: f("x", k=1) and f(**{"str:1:xk": 1}) differ
        for i, a in enumerate(args):
            h.update(self._arg(a, f"argument {i} of {name}"))
        h.update(b"kwargs:%d;" % len(kwargs))
        for k in sorted(kwargs):
            h.update(data_bytes(str(k)) + self._arg(kwargs[k], f"argument {k}= of {name}"))
        return h.hexdigest()

    @staticmethod
    def _arg(value, what: str) -> bytes:
        try:
            return data_bytes(value, _values().numpy_bytes)
        except Unkeyable as exc:
            raise ValueError(f"cache: {what}: {exc}; only plain data can be part of a cache key "
                             "(pass data, or drop cache=)") from None

    def _file(self, key: str) -> str:
        return os.path.join(self.path, f"{key}.result")

    def get(self, key: str):
        """``(True, value)`` for a hit, ``(False, None)`` for a miss (a bad file: a warning too)."""
        path = self._file(key)
        values = _values()
        try:
            blob = read_file(path, "cache file")
            if blob is None:
                return False, None
            belongs, body = unpack(blob, path, KIND, "cache file")
            if belongs.get("key") != key:
                raise CheckpointError(f"cache file {path} is of key {belongs.get('key')!r}")
            mode = values.Values.PICKLE if self.pickle else values.Values.DATA
            return True, values.decode(bytes(body) or None, mode, f"cache file {path}")
        except (OSError, ValueError) as exc:  # CheckpointError and EnsembleError are ValueErrors
            warnings.warn(f"cache file {path} is not used (a miss): {exc}", CacheWarning, stacklevel=3)
            return False, None

    def put(self, key: str, value) -> bool:
        """Store ``value``; False (and a warning) if the data format cannot hold it."""
        values = _values()
        if not self.pickle and not values.is_data(value):
            warnings.warn(f"cache {self.path}: a {type(value).__qualname__} result is not plain data "
                          "and was not stored (return data, or cache with pickle=True for a folder "
                          "only you can write)", CacheWarning, stacklevel=3)
            return False
        mode = values.Values.PICKLE if self.pickle else values.Values.DATA
        blob = values.encode(value, mode) or b""
        if self.pickle and blob and not blob.startswith(b"P"):  # pickle failed: a marker, no value
            warnings.warn(f"cache {self.path}: a {type(value).__qualname__} result cannot be pickled "
                          "and was not stored", CacheWarning, stacklevel=3)
            return False
        try:
            write_atomic(self._file(key), pack(KIND, {"key": key}, blob), "cache file")
        except OSError as exc:
            warnings.warn(f"cache {self.path}: not stored: {exc}", CacheWarning, stacklevel=3)
            return False
        return True


def submit_cached(submit, cache: FunctionCache, fn, args, kwargs):
    """``submit(fn, args, kwargs) -> Future`` through ``cache``: a hit is a finished Future; a
    miss runs ``fn`` in a worker that stores its value before returning it (so once the future
    is done, the value is in the folder)."""
    from .runtime.future import Future

    key = cache.key(fn, args, kwargs)
    hit, value = cache.get(key)
    if hit:
        fut = Future()
        fut.set_result(value)
        return fut
    return submit(functools.partial(call_and_store, cache, key, fn), args, kwargs)


def call_and_store(cache: FunctionCache, key: str, fn, *args, **kwargs):
    """Run ``fn`` and keep its value under ``key`` (in the worker that ran it)."""
    value = fn(*args, **kwargs)
    cache.put(key, value)
    return value


class Cached:
    """A function whose calls are looked up in a cache folder first (``shoal.cached``)."""

    def __init__(self, fn, cache: FunctionCache):
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            kind = "a generator" if inspect.isgeneratorfunction(fn) else "an async"
            raise TypeError(f"shoal.cached: {getattr(fn, '__qualname__', fn)!r} is {kind} function: its "
                            "call returns an iterator or coroutine, not a value a cache can keep; cache "
                            "a function that returns the values (a list) instead")
        self.__wrapped__, self.cache = fn, cache
        functools.update_wrapper(self, fn)

    def __get__(self, obj, objtype=None):
        """A method: ``obj`` is its first argument, so it is part of the key (plain data only:
        an object is refused by name, rather than cached by its type)."""
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args, **kwargs):
        key = self.cache.key(self.__wrapped__, args, kwargs)
        hit, value = self.cache.get(key)
        if hit:
            return value
        value = self.__wrapped__(*args, **kwargs)
        self.cache.put(key, value)
        return value

    def __repr__(self) -> str:
        return f"<shoal.cached {getattr(self.__wrapped__, '__qualname__', '?')} in {self.cache.path}>"


def cached(path, *, pickle: bool = False):
    """``@shoal.cached("cache/")``: each call's result is kept in the folder, keyed by the
    function's code by value and its arguments (module docstring); a later call with the same key
    — in this process or another run — returns it without running.  ``pickle=True`` stores values
    the data format cannot hold, for folders only you can write (docs/runtime.md)."""
    cache = FunctionCache(path, pickle=pickle)
    return lambda fn: Cached(fn, cache)
