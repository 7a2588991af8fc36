"""Wire format of every message that crosses a ring.

Data flow: a message is one ``bytes`` object whose first byte is its ``Kind``.
Tasks and results (the hot path) use a fixed ``struct`` header followed by a
pickle payload; control messages (stats, moves, deaths) carry a msgpack body.
Messages larger than a ring record are cut into fragments by
``shoal.runtime.mailbox``; fragments use the reserved kinds ``FIRST``/``MORE``/``LAST``.

Task ids are 64-bit: the owner endpoint (who receives the result: 0 is the
driver, 1..N the workers) in the top 16 bits, a per-owner counter below.  So a
result can be routed by any worker without a lookup, and ids never collide.

Serialization (docs/architecture.md): functions travel once per worker as
cloudpickle bytes under a small integer id (``DEFINE``); arguments and results
use pickle protocol 5.  A function that a worker made up itself (a closure
spawned inside a task) and that is stolen travels inline (``Flag.INLINE_FN``).

Rejected: msgpack for task payloads (cannot carry arbitrary Python objects);
one pickle of (fn, args) per task (re-sends the function every time, the
cost that makes ``ProcessPoolExecutor`` slow for tiny tasks).
"""

from __future__ import annotations

import enum
import io
import os
import pickle
import struct
import sys
import traceback
import types
from collections import ChainMap

import cloudpickle
import msgpack

from .._errors import PicklingError, RemoteTraceback, SerializationError, UnpicklingError


class Kind(enum.IntEnum):
    """First byte of every message."""

    TASK = 1  # header TASK_HDR + pickle((args, kwargs)) [+ inline fn]
    RESULT = 2  # header RESULT_HDR + pickle(value or (exc, tb, hops))
    DEFINE = 3  # u32 fn id + u16 name length + name (utf-8) + cloudpickle(fn)
    CANCEL = 4  # msgpack [task ids]
    STEAL = 5  # msgpack [thief endpoint, thief generation]
    LOOT = 6  # msgpack [victim, thief generation, [task message, ...]]   (a steal answer; may be empty)
    MOVED = 7  # msgpack [thief, generation, [task ids]]  (victim -> owner)
    STARTED = 8  # msgpack [task id, endpoint]            (only for tasks with a timeout)
    DIED = 9  # msgpack [endpoint, generation]          (driver -> workers)
    STATS = 10  # msgpack request (driver -> worker: []) or reply (worker -> driver: dict)
    SHUTDOWN = 11
    WAKE = 12  # nothing: "there may be work to steal" (a no-op message)
    INIT = 13  # cloudpickle((initializer, initargs)): run once, before any task (driver -> worker)
    INIT_FAILED = 14  # msgpack [endpoint, formatted traceback]          (worker -> driver)
    CANCEL_IF_QUEUED = 15  # msgpack [task ids]: drop unless started (driver -> worker, cancel())
    DROPPED = 16  # msgpack [task id]: a driver task dropped for a cancel (worker -> driver)
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

# Plain-int twins of the enums for the per-task paths: ``flags & Flag.TIMED`` runs
# IntFlag's Python-level ``__rand__`` (~1 us), ``int & TIMED`` is one C operation.
TASK = int(Kind.TASK)
RESULT = int(Kind.RESULT)
INLINE_FN = int(Flag.INLINE_FN)
TIMED = int(Flag.TIMED)
_OK = int(Status.OK)
_ERROR = int(Status.ERROR)
_pack_task = TASK_HDR.pack
_pack_result = RESULT_HDR.pack
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


def owner_of(task_id: int) -> int:
    return task_id >> OWNER_SHIFT


def encode_task(task_id: int, fn_id: int, flags: int, payload: bytes) -> bytes:
    return _pack_task(TASK, flags, fn_id, task_id) + payload


def decode_task_header(msg: bytes) -> tuple[int, int, int]:
    """(flags, fn_id, task_id) of a TASK message."""
    _, flags, fn_id, task_id = TASK_HDR.unpack_from(msg)
    return flags, fn_id, task_id


def describe(fn) -> str:
    """A task's name for error messages (a string passes through)."""
    if isinstance(fn, str):
        return fn
    return getattr(fn, "__qualname__", None) or type(fn).__name__


# -- pickling ----------------------------------------------------------------------------


def _refuse_file(f):
    name = getattr(f, "name", None)
    raise PicklingError(
        f"an open file ({type(f).__name__} {name!r}) cannot be sent to a worker: a worker is "
        "another process with its own files; pass the path (and open it in the task) or the "
        "contents instead")


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, except that open files are refused: cloudpickle would silently send a
    text file's *contents* as a StringIO (and a binary file not at all); and code objects
    keep their file names."""

    dispatch_table = ChainMap(
        {t: _refuse_file for t in (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter,
                                   io.BufferedRandom, io.FileIO)},
        {types.CodeType: _code_reduce},  # keeps co_filename (see _code_reduce)
        cloudpickle.Pickler.dispatch_table)


def cloud_dumps(obj, reducers: dict | None = None) -> bytes:
    """cloudpickle.dumps with protocol 5, refusing open files (see ``_Pickler``);
    ``reducers`` (type -> reduce function) take precedence over the pickler's own, e.g.
    joblib's memmapping reducers for numpy arrays (``shoal.integrations.joblib``)."""
    _by_value_mp_main()
    buf = io.BytesIO()
    if reducers:
        _ReducingPickler(buf, reducers).dump(obj)
    else:
        _Pickler(buf, protocol=_PROTO).dump(obj)
    return buf.getvalue()


class _ReducingPickler(_Pickler):
    """``_Pickler`` with more reducers (the C pickler reads ``dispatch_table`` when it is
    initialised, so it is set on the instance before that)."""

    def __init__(self, file, reducers: dict):
        self.dispatch_table = ChainMap(reducers, _Pickler.dispatch_table)
        super().__init__(file, protocol=_PROTO)


_mp_main_done = False


def _by_value_mp_main() -> None:
    """In a multiprocessing "spawn" child the user's script is ``__mp_main__``, a module the
    workers cannot import: send its functions and classes by value, as ``__main__``'s."""
    global _mp_main_done
    if _mp_main_done:
        return
    mod = sys.modules.get("__mp_main__")
    if mod is not None and getattr(mod, "__name__", None) == "__mp_main__":
        cloudpickle.register_pickle_by_value(mod)
        _mp_main_done = True


def dump_args(args: tuple, kwargs: dict, fn) -> bytes:
    try:
        data = _dumps((args, kwargs), _PROTO)
        if b"main__" not in data:
            return data
        # A class or function of the driver's __main__ (or __mp_main__) pickles by
        # reference, and a worker's __main__ is not the driver's: send those by value.
        return cloud_dumps((args, kwargs))
    except Exception as exc:
        # Plain pickle refuses lambdas and local classes; cloudpickle takes them.
        try:
            return cloud_dumps((args, kwargs))
        except Exception as exc2:
            why = exc2 if isinstance(exc2, SerializationError) else exc
            raise PicklingError(f"cannot pickle the arguments of {describe(fn)}: {why}") from exc


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


def load_args(body, fn_name: str):
    """Unpickle a TASK payload; any failure (a module the worker cannot import, an object
    whose ``__setstate__`` raises, even ``SystemExit``) becomes a SerializationError naming
    the task's function."""
    try:
        return _loads(body)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in __setstate__ included
        raise UnpicklingError(f"cannot unpickle the arguments of {fn_name} in worker process "
                                 f"{os.getpid()}: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (f"module {exc.name!r} cannot be imported there ({exc}); it exists only in the "
                "driver (the __main__ of a multiprocessing child, a module made at run time, "
                "a file not on sys.path): define the function in an importable module, or "
                "cloudpickle.register_pickle_by_value(module) in the driver")
    return f"{type(exc).__name__}: {exc}"


class Unloadable:
    """Stands in for a function a worker could not unpickle: calling it raises why."""

    def __init__(self, name: str, exc: BaseException):
        self.__qualname__ = self.__name__ = name
        self.message = f"cannot load function {name} in worker process {os.getpid()}: {_why(exc)}"

    def __call__(self, *args, **kwargs):
        raise UnpicklingError(self.message)

    @classmethod
    def quarantined(cls, name: str, message: str) -> Unloadable:
        """The stand-in a replacement worker gets for a quarantined function (its DEFINE
        is never sent again): a task of it that reaches the worker anyway (stolen from a
        worker that had loaded it) fails with ``message`` instead of waiting forever for
        a DEFINE that never comes."""
        self = cls.__new__(cls)
        self.__qualname__ = self.__name__ = name
        self.message = message
        return self


def encode_define(fn_id: int, blob: bytes, name: str = "") -> bytes:
    raw = name.encode("utf-8", "replace")[:0xFFFF]
    return bytes((Kind.DEFINE,)) + fn_id.to_bytes(4, "little") + len(raw).to_bytes(2, "little") + raw + blob


def decode_define(msg: bytes):
    """(fn id, function): an ``Unloadable`` when the function cannot be unpickled here."""
    fn_id = int.from_bytes(msg[1:5], "little")
    n = int.from_bytes(msg[5:7], "little")
    name = bytes(msg[7:7 + n]).decode("utf-8", "replace")
    try:
        return fn_id, cloudpickle.loads(memoryview(msg)[7 + n:])
    except BaseException as exc:  # noqa: BLE001 - SystemExit while unpickling included
        return fn_id, Unloadable(name or f"#{fn_id}", exc)


# -- results ------------------------------------------------------------------------------

_TB_LIMIT = 100_000  # characters of remote traceback text kept (head and tail)
_TB_FRAMES = 1000  # frames of a remote traceback formatted at most (the innermost ones)


def encode_result(task_id: int, value) -> bytes:
    try:
        data = _dumps(value, _PROTO)
        # classes rebuilt by value in this worker (see dump_args); a reference to one needs
        # more than 15 bytes (the module name alone is 8), so small results skip the scan
        if len(data) > 15 and b"main__" in data:
            data = cloud_dumps(value)
        return _pack_result(RESULT, _OK, task_id) + data
    except BaseException:  # noqa: BLE001 - a __reduce__ raising SystemExit must not kill the worker
        try:
            return _pack_result(RESULT, _OK, task_id) + cloud_dumps(value)
        except Exception as exc:  # noqa: BLE001
            err = PicklingError(f"cannot pickle the result ({type(value).__name__}): {exc!r}")
            err.__cause__ = exc
            return encode_error(task_id, err)
        except BaseException as exc:  # noqa: BLE001 - SystemExit while pickling: the task's
            return encode_error(task_id, exc)  # error, as concurrent.futures.process delivers it


def remote_text(exc: BaseException) -> tuple[str, int]:
    """(traceback text, hops) to send with ``exc``.

    An exception that already crossed a process boundary (its ``__cause__`` is the
    RemoteTraceback of the previous crossing) keeps that original text once and
    counts one more hop: re-formatting it at every hop made a deep stolen spawn
    chain quadratic in time and memory."""
    cause = exc.__cause__
    if isinstance(cause, RemoteTraceback):
        return cause.tb, cause.hops + 1
    frames, tb_ = 0, exc.__traceback__
    while tb_ is not None and frames <= _TB_FRAMES:
        frames, tb_ = frames + 1, tb_.tb_next
    try:
        if frames > _TB_FRAMES:  # a RecursionError: formatting 100,000 frames takes seconds
            tb = (f"[outer frames omitted: only the innermost {_TB_FRAMES} are shown]\n"
                  + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__,
                                                       limit=-_TB_FRAMES)))
        else:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException as err:  # noqa: BLE001 - a __str__ that raises
        tb = f"{type(exc).__name__} (its traceback could not be formatted: {err!r})\n"
    if len(tb) > _TB_LIMIT:
        cut = len(tb) - _TB_LIMIT
        tb = tb[:_TB_LIMIT // 5] + f"\n... [{cut} characters cut] ...\n" + tb[-(_TB_LIMIT * 4 // 5):]
    return tb, 0


def _rebuild_exception(cls, args, state):
    """Unpickle an exception without calling its ``__init__`` (which may need other
    arguments than ``args``): how a class with a custom ``__init__`` keeps its type."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    if state:
        exc.__dict__.update(state)
    return exc


class _ExcByState:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc

    def __reduce__(self):
        exc = self.exc
        state = dict(getattr(exc, "__dict__", None) or {})
        return _rebuild_exception, (type(exc), exc.args, state)


def encode_error(task_id: int, exc: BaseException) -> bytes:
    tb, hops = remote_text(exc)
    hdr = _pack_result(RESULT, _ERROR, task_id)
    try:
        body = cloud_dumps((exc, tb, hops))
        _loads(body)  # an exception whose __init__ takes other arguments fails only here
        return hdr + body
    except BaseException:  # noqa: BLE001
        pass
    try:
        return hdr + cloud_dumps((_ExcByState(exc), tb, hops))
    except BaseException:  # noqa: BLE001
        # The exception itself does not pickle: keep its type name and text.
        try:
            text = repr(exc)
        except BaseException:  # noqa: BLE001
            text = type(exc).__name__
        return hdr + _dumps((PicklingError(f"unpicklable exception {text}"), tb, hops), _PROTO)


def decode_result(msg: bytes):
    """(task_id, ok, value_or_exception).  Never raises: whatever unpickling does (even
    ``SystemExit``) becomes a SerializationError of this task."""
    _, status, task_id = RESULT_HDR.unpack_from(msg)
    body = memoryview(msg)[RESULT_HDR.size:]
    try:
        obj = _loads(body)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: it must not end the receiving thread
        return task_id, False, result_unpickling_error(task_id, status, exc)
    if status == _OK:
        return task_id, True, obj
    exc, tb, hops = obj
    exc.__cause__ = RemoteTraceback(tb, hops)
    return task_id, False, exc


def result_unpickling_error(task_id: int, status: int, exc: BaseException) -> UnpicklingError:
    what = "result" if status == Status.OK else "exception"
    err = UnpicklingError(f"cannot unpickle the {what} of task {task_id:#x}: {exc!r}")
    err.__cause__ = exc
    return err


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
