"""Wire format of every message that crosses a ring.

Data flow: a message is one ``bytes`` object whose first byte is its ``Kind``.
Tasks and results (the hot path) use a fixed ``struct`` header followed by a
pickle payload; control messages (stats, moves, deaths) carry a msgpack body.
Messages larger than a ring record are cut into fragments by
``shoal.runtime.mailbox``; fragments use the reserved kinds ``FIRST``/``MORE``/``LAST``.

Task ids are 64-bit: the owner endpoint (who receives the result: 0 is the
driver, 1..N the workers) in the top 16 bits, a per-owner counter below.  So a
result can be routed by any worker without a lookup, and ids never collide.

Serialization (ARCHITECTURE.md): functions travel once per worker as
cloudpickle bytes under a small integer id (``DEFINE``); arguments and results
use pickle protocol 5.  A function that a worker made up itself (a closure
spawned inside a task) and that is stolen travels inline (``Flag.INLINE_FN``).

Rejected: msgpack for task payloads (cannot carry arbitrary Python objects);
one pickle of (fn, args) per task (re-sends the function every time, the
cost that makes ``ProcessPoolExecutor`` slow for tiny tasks).
"""

from __future__ import annotations

import collections
import enum
import io
import pickle
import struct
import traceback
import types

import cloudpickle
import msgpack

from .._errors import PicklingError, RemoteTraceback, UnpicklingError


class Kind(enum.IntEnum):
    """First byte of every message."""

    TASK = 1  # header TASK_HDR + pickle((args, kwargs)) [+ inline fn]
    RESULT = 2  # header RESULT_HDR + pickle(value or (exc, tb))
    DEFINE = 3  # u32 fn id + cloudpickle(fn)
    CANCEL = 4  # msgpack [task ids]
    STEAL = 5  # msgpack [thief endpoint, thief generation]
    LOOT = 6  # msgpack [victim, [task message, ...]]   (a steal answer; may be empty)
    MOVED = 7  # msgpack [thief, generation, [task ids]]  (victim -> owner)
    STARTED = 8  # msgpack [task id, endpoint]            (only for tasks with a timeout)
    DIED = 9  # msgpack [endpoint, generation]          (driver -> workers)
    STATS = 10  # msgpack request (driver -> worker: []) or reply (worker -> driver: dict)
    SHUTDOWN = 11
    WAKE = 12  # nothing: "there may be work to steal" (a no-op message)
    INIT = 13  # cloudpickle((initializer, initargs)): run once, before any task (driver -> worker)
    INIT_FAILED = 14  # msgpack [endpoint, formatted traceback]          (worker -> driver)
    CANCEL_IF_QUEUED = 15  # msgpack [task ids]: drop unless started (driver -> worker, cancel())
    FIRST = 0xFD  # first fragment of a larger message
    MORE = 0xFE  # middle fragment
    LAST = 0xFF  # last fragment


class Flag(enum.IntFlag):
    NONE = 0
    INLINE_FN = 1  # payload is pickle((fn, args, kwargs)) instead of pickle((args, kwargs))
    TIMED = 2  # the worker reports STARTED so the driver can enforce the timeout


class Status(enum.IntEnum):
    OK = 0
    ERROR = 1


TASK_HDR = struct.Struct("<BBxxIQ")  # kind, flags, fn id, task id
RESULT_HDR = struct.Struct("<BBxxxxxxQ")  # kind, status, task id
OWNER_SHIFT = 48
SEQ_MASK = (1 << OWNER_SHIFT) - 1

_dumps = pickle.dumps
_loads = pickle.loads
_PROTO = 5


def _code_reduce(code):
    """cloudpickle's reducer for code objects, keeping ``co_filename`` (cloudpickle 3
    replaces it by "<dynamic-code>"), so a remote traceback through a function of the
    driver's ``__main__`` names its file and shows its source lines."""
    make, args = cloudpickle.cloudpickle._code_reduce(code)
    return make, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = collections.ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)


def cloud_dumps(obj) -> bytes:
    """``cloudpickle.dumps`` that keeps the file names of functions sent by value."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=_PROTO).dump(obj)
    return buf.getvalue()


def owner_of(task_id: int) -> int:
    return task_id >> OWNER_SHIFT


def encode_task(task_id: int, fn_id: int, flags: int, payload: bytes) -> bytes:
    return TASK_HDR.pack(Kind.TASK, flags, fn_id, task_id) + payload


def decode_task_header(msg: bytes) -> tuple[int, int, int]:
    """(flags, fn_id, task_id) of a TASK message."""
    _, flags, fn_id, task_id = TASK_HDR.unpack_from(msg)
    return flags, fn_id, task_id


def describe(fn) -> str:
    """A task's name for error messages (a string passes through)."""
    if isinstance(fn, str):
        return fn
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def dump_args(args: tuple, kwargs: dict, fn) -> bytes:
    try:
        data = _dumps((args, kwargs), _PROTO)
        if b"__main__" not in data:
            return data
        # A class or function of the driver's __main__ pickles by reference, and a
        # worker's __main__ is not the driver's: send those by value.
        return cloud_dumps((args, kwargs))
    except Exception as exc:
        # Plain pickle refuses lambdas and local classes; cloudpickle takes them.
        try:
            return cloud_dumps((args, kwargs))
        except Exception:
            raise PicklingError(f"cannot pickle the arguments of {describe(fn)}: {exc!r}") from exc


def dump_inline(fn, args: tuple, kwargs: dict) -> bytes:
    try:
        return cloud_dumps((fn, args, kwargs))
    except Exception as exc:
        raise PicklingError(f"cannot pickle {describe(fn)} with its arguments: {exc!r}") from exc


def dump_function(fn) -> bytes:
    try:
        return cloud_dumps(fn)
    except Exception as exc:
        raise PicklingError(f"cannot pickle function {fn!r}: {exc!r}") from exc


def encode_define(fn_id: int, blob: bytes) -> bytes:
    return bytes((Kind.DEFINE,)) + fn_id.to_bytes(4, "little") + blob


def decode_define(msg: bytes):
    return int.from_bytes(msg[1:5], "little"), cloudpickle.loads(msg[5:])


def encode_result(task_id: int, value) -> bytes:
    try:
        data = _dumps(value, _PROTO)
        if b"__main__" in data:  # classes rebuilt by value in this worker (see dump_args)
            data = cloudpickle.dumps(value, _PROTO)
        return RESULT_HDR.pack(Kind.RESULT, Status.OK, task_id) + data
    except Exception:
        try:
            return RESULT_HDR.pack(Kind.RESULT, Status.OK, task_id) + cloudpickle.dumps(value, _PROTO)
        except Exception as exc:
            err = PicklingError(f"cannot pickle the result ({type(value).__name__}): {exc!r}")
            err.__cause__ = exc
            return encode_error(task_id, err)
        except BaseException as exc:  # SystemExit/KeyboardInterrupt while pickling: the task's error
            return encode_error(task_id, exc)
    except BaseException as exc:  # (as concurrent.futures.process delivers it)
        return encode_error(task_id, exc)


def encode_error(task_id: int, exc: BaseException) -> bytes:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    hdr = RESULT_HDR.pack(Kind.RESULT, Status.ERROR, task_id)
    try:
        return hdr + cloud_dumps((exc, tb))
    except Exception:
        # The exception itself does not pickle: keep its type name and text.
        return hdr + _dumps((PicklingError(f"unpicklable exception {exc!r}"), tb), _PROTO)


def decode_result(msg: bytes):
    """(task_id, ok, value_or_exception)."""
    _, status, task_id = RESULT_HDR.unpack_from(msg)
    body = memoryview(msg)[RESULT_HDR.size:]
    try:
        obj = _loads(body)
    except BaseException as exc:  # SystemExit too: it must not end the receiving thread
        err = UnpicklingError(f"cannot unpickle the result of task {task_id:#x}: {exc!r}")
        err.__cause__ = exc
        return task_id, False, err
    if status == Status.OK:
        return task_id, True, obj
    exc, tb = obj
    exc.__cause__ = RemoteTraceback(tb)
    return task_id, False, exc


def unpickling_error(task_id: int, exc: BaseException) -> UnpicklingError:
    err = UnpicklingError(f"cannot unpickle the arguments of task {task_id:#x} on the worker: {exc!r}")
    err.__cause__ = exc
    return err


def encode_init(initializer, initargs: tuple) -> bytes:
    try:
        return bytes((Kind.INIT,)) + cloud_dumps((initializer, tuple(initargs)))
    except Exception as exc:
        raise PicklingError(f"cannot pickle initializer {describe(initializer)} with its initargs: "
                            f"{exc!r}") from exc


def encode_control(kind: Kind, body) -> bytes:
    return bytes((kind,)) + msgpack.packb(body)


def decode_control(msg: bytes):
    return msgpack.unpackb(memoryview(msg)[1:], strict_map_key=False)
