"""How task results are stored in the journal: a data format by default, pickle only on request.

Trust boundary: a journal is a file.  Anyone who can write it decides what a
``--resume`` (and every ``when=``/``post_exec`` that reads results) sees.  With
the default ``values="data"`` a result is msgpack with a few extension types
(tuple, set, frozenset, complex, big ints, bytes, numpy arrays and scalars of plain
dtypes): reading a crafted journal can give wrong numbers but never runs code.
``values="pickle"`` stores any picklable result, and *reading* such a journal
runs whatever its author wrote into it — pass it only for journals you trust
(your own runs on your own filesystem).  A journal written with pickle refuses
to be read without the opt-in, naming the flag.

Data flow: ``encode(value, mode) -> bytes`` (first byte: ``M`` msgpack, ``P``
pickle); ``decode(blob, mode, uid) -> value``.  A result the data format cannot
hold (a dataclass, an open file...) is stored as a marker with its type name,
and reading it raises ``EnsembleError`` that names the task and both ways out
(return plain data, or opt in to pickle): loud at the first read, not a silent
``repr`` string.

Rejected alternatives: JSON (turns tuples into lists and int dict keys into
strings: a resumed ``when=`` would see different values than the first run);
pickle by default (the journal would be a code-execution vector, see above);
refusing the task at the end (its side effects happened; the value is what is
lost, so it is the value's reader that must hear about it).
"""

from __future__ import annotations

import enum
import pickle

import msgpack

from .model import EnsembleError


class Values(enum.Enum):
    """How the journal stores function results (``run(values=...)``)."""

    DATA = "data"  # msgpack + extension types: never runs code when read
    PICKLE = "pickle"  # any picklable value: reading runs code; trusted journals only

    @classmethod
    def parse(cls, value) -> Values:
        if isinstance(value, Values):
            return value
        try:
            return cls(value)
        except ValueError:
            raise EnsembleError(f"values={value!r}: choose 'data' (the default, safe) or 'pickle' "
                                "(any picklable result; trust the journal file)") from None


_TUPLE, _SET, _FROZENSET, _COMPLEX, _NDARRAY, _NPSCALAR, _UNREPR, _BIGINT = range(1, 9)


class Unrepresentable:
    """A result the data format could not store; reading it raises (see ``decode``)."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return f"<unstorable {self.type_name} result {self.text}>"


def _pack(obj):
    return msgpack.packb(obj, default=_default, use_bin_type=True, strict_types=True)


def _default(obj):
    # exact types only: a namedtuple or an IntEnum would come back as a plain tuple / int
    if type(obj) is tuple:
        return msgpack.ExtType(_TUPLE, _pack(list(obj)))
    if type(obj) is frozenset:
        return msgpack.ExtType(_FROZENSET, _pack(list(obj)))
    if type(obj) is set:
        return msgpack.ExtType(_SET, _pack(list(obj)))
    if type(obj) is int:  # beyond 64 bits
        return msgpack.ExtType(_BIGINT, str(obj).encode())
    if type(obj) is complex:
        return msgpack.ExtType(_COMPLEX, _pack([obj.real, obj.imag]))
    if type(obj).__module__ == "numpy":
        import numpy as np

        if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc":
            arr = np.ascontiguousarray(obj)
            return msgpack.ExtType(_NDARRAY, _pack([arr.dtype.str, list(arr.shape), arr.tobytes()]))
        if isinstance(obj, np.generic) and obj.dtype.kind in "biufc":
            return msgpack.ExtType(_NPSCALAR, _pack([obj.dtype.str, obj.tobytes()]))
    raise TypeError(type(obj).__qualname__)


def _ext(code: int, data: bytes):
    if code == _TUPLE:
        return tuple(_unpack(data))
    if code == _SET:
        return set(_unpack(data))
    if code == _FROZENSET:
        return frozenset(_unpack(data))
    if code == _BIGINT:
        return int(data.decode())
    if code == _COMPLEX:
        re_, im = _unpack(data)
        return complex(re_, im)
    if code in (_NDARRAY, _NPSCALAR):
        import numpy as np

        if code == _NDARRAY:
            dtype, shape, raw = _unpack(data)
            return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
        dtype, raw = _unpack(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
    if code == _UNREPR:
        type_name, text = _unpack(data)
        return Unrepresentable(type_name, text)
    return msgpack.ExtType(code, data)


def _unpack(data: bytes):
    return msgpack.unpackb(data, ext_hook=_ext, raw=False, strict_map_key=False)


def is_data(value) -> bool:
    """Whether the data format holds ``value`` as it is (else ``encode`` stores a marker)."""
    try:
        _pack(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def encode(value, mode: Values) -> bytes | None:
    """The bytes the journal stores for a function result (None for None)."""
    if value is None:
        return None
    if mode is Values.PICKLE:
        try:
            return b"P" + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            pass  # not picklable either: the marker below
    else:
        try:
            return b"M" + _pack(value)
        except (TypeError, ValueError, OverflowError):
            pass
    marker = msgpack.ExtType(_UNREPR, _pack([type(value).__qualname__, repr(value)[:200]]))
    return b"M" + msgpack.packb(marker, use_bin_type=True)


def decode(blob: bytes | None, mode: Values, uid: str):
    """The value stored for task ``uid``; raises EnsembleError where it cannot be given back."""
    if blob is None:
        return None
    blob = bytes(blob)
    tag, body = blob[:1], blob[1:]
    if tag == b"P":
        if mode is not Values.PICKLE:
            raise EnsembleError(
                f"the result of {uid} was stored with pickle (values='pickle'); reading it runs "
                "code the journal's author chose, so it needs the same opt-in: run(..., "
                "values='pickle') / shoal run --pickle-values, for journals you trust")
        return pickle.loads(body)
    if tag != b"M":
        raise EnsembleError(f"the result of {uid} is not in a format this shoal reads (tag {tag!r})")
    try:
        value = _unpack(body)
    except Exception as exc:
        raise EnsembleError(f"the result of {uid} in the journal is damaged: {exc}") from None
    if isinstance(value, Unrepresentable):
        raise EnsembleError(
            f"the result of {uid} was a {value.type_name} ({value.text}), which the journal's data "
            "format cannot store; return plain data (numbers, strings, lists, dicts, tuples, numpy "
            "arrays) or pass values='pickle' (shoal run --pickle-values) for journals you trust")
    return value


def numpy_bytes(value) -> bytes | None:
    """A numeric numpy array or scalar as bytes (dtype, shape, contents), None for anything
    else: how both result caches (reuse.py, shoal/cache.py) key an array argument by value."""
    if type(value).__module__ == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in "biufc":
            arr = np.ascontiguousarray(value)
            return f"{arr.dtype.str}{arr.shape}".encode() + arr.tobytes()
    return None
