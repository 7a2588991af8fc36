"""Shared memory that tasks can hold: ``SharedArray`` and ``BestCell``.

``SharedArray(shape, dtype)`` is a numpy array in an anonymous memfd made by
the driver.  Its handle pickles to ``(driver pid, fd, shape, dtype, host)``; a
worker that unpickles it opens ``/proc/<driver pid>/fd/<fd>`` (workers are the
driver's children, same user) and maps the same pages.  A pid and an fd mean
something only on the host that made them: a handle that reaches a process on
another host (its hostname differs) refuses with an error naming both hosts,
instead of opening whatever that pid is there (rejected: trusting the pid, which
on another machine is another process or none).  No name ever exists in
/dev/shm, so nothing can leak, even when the driver is SIGKILLed: the pages go
when the last process holding them does.  Workers write results in place — no
per-element messages through the driver.

``BestCell`` is the incumbent of a branch-and-bound search: the best value
found so far, readable by every worker at the cost of a few memory loads.
Lock-free without compare-and-swap: it holds one float64 slot per process
(driver and each worker endpoint), each written only by its owner (the
single-writer rule of the rings), and the best is the max/min over the slots.
Aligned 8-byte stores are atomic on x86-64 and aarch64, so a reader sees an old
or a new value, never a torn one.

Rejected: a CAS loop on one word (no atomics in pure Python; the native helper
is optional); broadcasting incumbents through the rings (a message per
improvement per worker, and a busy worker reads it only between tasks).

Leaving the machine (``portable_dumps``, the dask balancer lending a spawned task
to another machine): an object in this machine's memory cannot go, *unless* it is
a backend's per-machine replica of a pilot-level object (``SharedArray.per_node``,
``BestCell.for_pilot``, ``Channel.for_pilot`` on a dask pilot).  The backend
registers each replica it makes (``portable_as``) with a function that gives the
pilot-level handle's pickle; a replica, or a worker's attached copy of it (same
token), pickles as that handle when it leaves, and unpickles on the destination
machine into *that* machine's replica.  Anything else raises ``NodeBound`` there.
"""

from __future__ import annotations

import enum
import math
import mmap
import os
import pickle
import socket
import threading
import uuid
import weakref
from collections import OrderedDict

from . import context


class Sense(enum.Enum):
    MAX = "max"
    MIN = "min"


_ATTACHED: OrderedDict = OrderedDict()  # token -> SharedArray mapped in this process
_leaving = threading.local()  # .on: pickling for another machine (portable_dumps)
# token of a replica's memory -> (its SharedArray, the replica, () -> the pickle of its
# pilot-level handle): what a replica becomes when it leaves this machine (portable_as)
_PORTABLE: dict[str, tuple] = {}


class NodeBound(Exception):
    """Raised while pickling for another machine: the object lives in this machine's memory."""


def portable_dumps(obj, *, by_value: bool = False) -> bytes | None:
    """``pickle.dumps(obj)`` for another machine, or None if something in it is shared
    memory of this machine.

    The dask backend moves spawned tasks between machines only when this says they
    can go: a SharedArray (or BestCell, or anything holding one) cannot, but a
    backend's replica of a pilot-level object goes as that object (``portable_as``),
    to be this object's replica on the destination.  ``by_value``: cloudpickle only
    (functions by value, as the backend sends them)."""
    import cloudpickle

    _leaving.on = True
    try:
        if by_value:
            return cloudpickle.dumps(obj, 5)
        try:
            return pickle.dumps(obj, 5)
        except NodeBound:
            return None
        except Exception:
            return cloudpickle.dumps(obj, 5)
    except NodeBound:
        return None
    finally:
        _leaving.on = False


def _memory(obj) -> SharedArray:
    return obj._memory() if isinstance(obj, _OnOneArray) else obj


def portable_as(replica, handle) -> None:
    """A backend's replica (a SharedArray, BestCell or Channel standing for a
    ``SharedArray.per_node``, ``BestCell.for_pilot``, ``Channel.for_pilot``): when it
    -- or a worker's attached copy of it -- leaves this machine it pickles as
    ``handle()`` (a reduce tuple naming the pilot-level object), not as this
    machine's memory."""
    array = _memory(replica)
    _PORTABLE[array._token] = (array, replica, handle)


def forget_portable(replica) -> None:
    """The replica is closed (the backend drops it): it is plain memory again."""
    _PORTABLE.pop(getattr(_memory(replica), "_token", None), None)


def _leaving_as(token: str | None, kind: type):
    """While leaving: the pickle of the pilot-level handle of the replica of ``kind``
    whose memory has ``token``; None when there is none (plain local memory)."""
    entry = _PORTABLE.get(token)
    if entry is None or not isinstance(entry[1], kind):
        return None
    return entry[2]()

_ATTACHED_MAX = 64  # attached copies the cache keeps alive; older ones live while used


_CHECK_FROM = 16 << 20  # smaller arrays skip the memory check (reading /proc costs ~0.15 ms)


def _gib(n: int) -> str:
    return f"{n / 2**40:.2f} TiB" if n >= 2**40 else f"{n / 2**30:.2f} GiB"


def memory_for_shared() -> tuple[int, int | None]:
    """``(available, limit)``: bytes of memory a new SharedArray can get now (MemAvailable
    plus free swap), and the memory cgroup's limit (None when there is none or it is not
    readable).  A memfd's pages live in RAM or swap only: the kernel's internal tmpfs that
    holds them has no size limit, so /dev/shm's free space says nothing about them."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        available = info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):  # pragma: no cover - not Linux
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    limit = None
    candidates = ["/sys/fs/cgroup/memory/memory.limit_in_bytes"]  # cgroup v1
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            for line in f:
                if line.startswith("0::"):  # cgroup v2
                    candidates.insert(0, f"/sys/fs/cgroup{line[3:].strip().rstrip('/')}/memory.max")
    except OSError:  # pragma: no cover
        pass
    for path in candidates:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 says "no limit" with ~2^63
            limit = int(text)
            break
    return available, limit


def check_fits(shape: tuple, dtype, nbytes: int, available: int, limit: int | None) -> None:
    """MemoryError, before anything is allocated, for an array that cannot fit.

    A memfd is sparse until written, so without this an 8 TB array "succeeded" on a
    24 GiB machine and failed later, in whichever process wrote the pages (an OOM kill,
    or SIGBUS).  Refused: more than the memory available now (RAM the kernel can free,
    and free swap) or than the memory cgroup's limit.  Pure: the numbers are given."""
    over = nbytes > available or (limit is not None and nbytes > limit)
    if not over:
        return
    have = f"{_gib(available)} available now"
    if limit is not None:
        have += f", the memory cgroup's limit is {_gib(limit)}"
    raise MemoryError(
        f"SharedArray: unable to allocate {_gib(nbytes)} ({nbytes:,} bytes) for an array with "
        f"shape {shape} and data type {dtype}: this machine has {have}. Shared memory lives "
        "in RAM (or swap), not in a file: use a smaller shape or dtype, free memory, or keep "
        "data larger than memory in a file (numpy.memmap)")


class SharedArray:
    """A numpy array in shared memory; pass it to tasks as an argument (driver creates it)."""

    def __init__(self, shape, dtype="float64", *, fill=None):
        import numpy as np

        self.shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        if any((not isinstance(n, int)) or n < 0 for n in self.shape):
            raise ValueError(f"SharedArray shape must be non-negative ints, got {shape!r}")
        self.dtype = np.dtype(dtype)
        nbytes = max(1, math.prod(self.shape) * self.dtype.itemsize)  # Python ints: no wrap
        if not hasattr(os, "memfd_create"):  # pragma: no cover - non-Linux
            raise OSError("SharedArray needs Linux memfd_create")
        if nbytes >= _CHECK_FROM:
            check_fits(self.shape, self.dtype, nbytes, *memory_for_shared())
        self._token = uuid.uuid4().hex
        # the name carries the token: an attacher checks it, because the creator's fd
        # number is reused once this array is closed (a late task must not map the next one)
        self._fd = os.memfd_create(f"shoal-{self._token}", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, nbytes)
        self._pid = os.getpid()
        self._origin = (self._pid, self._fd)  # what every handle names, wherever it is re-sent from
        self._map(nbytes)
        if fill is not None:
            self.array[...] = fill

    def _map(self, nbytes: int) -> None:
        import numpy as np

        self._mmap = mmap.mmap(self._fd, nbytes)
        count = int(np.prod(self.shape, dtype=np.int64))
        self.array = np.frombuffer(self._mmap, dtype=self.dtype, count=count).reshape(self.shape)

    @classmethod
    def per_node(cls, pilot, shape, dtype="float64", *, fill=None) -> SharedArray:
        """An array shared by the driver and workers of each *node* of ``pilot``.

        Local backend: one ordinary SharedArray (the machine is the one node).
        dask backend: each node makes its own array of this shape and fill the
        first time a task carrying the handle reaches it; the nodes' copies are
        independent (for per-node bookkeeping, such as who is idle there).
        """
        return pilot.shared.node_array(tuple(shape) if not isinstance(shape, int) else (shape,),
                                       dtype, fill)

    @classmethod
    def _attach(cls, token: str, pid: int, fd: int, shape, dtype,
                host: str | None = None) -> SharedArray:
        """Unpickling: map the creator's memfd once per process (cached by token)."""
        import numpy as np

        here = this_host()
        if host is not None and host != here:
            # not an error here: unpickling runs inside dask's comms, where an exception
            # takes the whole dask worker down; the task fails when it touches the array
            return _Elsewhere(token, pid, fd, shape, dtype, host, here)

        cached = _ATTACHED.get(token)
        if cached is not None:
            _ATTACHED.move_to_end(token)
            return cached
        home = _PORTABLE.get(token)
        if home is not None and pid == os.getpid():  # a replica of this process: itself
            return home[0]
        self = cls.__new__(cls)
        self._token = token
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        if pid == os.getpid():
            self._fd = os.dup(fd)
        else:
            try:
                self._fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise OSError(f"cannot map the SharedArray of process {pid} (fd {fd}): {exc}; "
                              "it can only be used by that process's shoal workers") from exc
            if token not in os.readlink(f"/proc/self/fd/{self._fd}"):
                os.close(self._fd)
                raise ValueError(f"the SharedArray of process {pid} (fd {fd}) was closed by its "
                                 "creator: a task must not outlive the arrays it was given")
        self._pid = pid
        self._origin = (pid, fd)
        nbytes = max(1, int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize)
        self._map(nbytes)
        # The cache is not the owner: a copy it lets go of may still be held by a running
        # task (one given 65 arrays, or a parent whose children attached more).  Closing it
        # then broke that task (``array`` None); now its fd goes when it is garbage.
        self._release = weakref.finalize(self, os.close, self._fd)
        _ATTACHED[token] = self
        if len(_ATTACHED) > _ATTACHED_MAX:
            _ATTACHED.popitem(last=False)
        return self

    def __reduce__(self):
        if getattr(_leaving, "on", False):
            call = _leaving_as(self._token, SharedArray)
            if call is None:
                raise NodeBound(repr(self))
            return call
        if self._fd is None:
            raise ValueError("a closed SharedArray cannot be sent to a task")
        pid, fd = self._origin  # the creator's fd, not this process's copy
        return (_attach, (self._token, pid, fd, self.shape, self.dtype.str, this_host()))

    def close(self) -> None:
        """Drop this process's mapping (the array must not be used after)."""
        if getattr(self, "_fd", None) is None:
            return
        if _ATTACHED.get(getattr(self, "_token", None)) is self:
            del _ATTACHED[self._token]  # a later task attaches afresh, not to a closed one
        self.array = None
        try:
            self._mmap.close()
        except BufferError:
            pass  # views still alive: the mapping goes with them
        release = getattr(self, "_release", None)
        if release is not None:
            release.detach()
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<shoal.SharedArray shape={self.shape} dtype={self.dtype}>"


def _attach(token, pid, fd, shape, dtype, host=None) -> SharedArray:
    # A module-level function, not the classmethod itself: cloudpickle would send a
    # classmethod by value (its qualified name does not lead back to the function).
    return SharedArray._attach(token, pid, fd, shape, dtype, host)


class _Elsewhere(SharedArray):
    """A SharedArray handle unpickled on another host than its memory's: any use raises
    ``OSError`` naming both hosts (``.array``; ``close()`` does nothing).  It pickles back to
    the original handle, so it still works if it travels home."""

    def __init__(self, token, pid, fd, shape, dtype, home: str, here: str):
        import numpy as np

        self._token, self._pid, self._origin = token, pid, (pid, fd)
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self._fd, self._home, self._here = None, home, here

    @property
    def array(self):
        raise OSError(f"a SharedArray made on host {self._home!r} (process {self._pid}) reached "
                      f"a task on host {self._here!r}: its memory exists only on "
                      f"{self._home!r}; give tasks on other hosts SharedArray.per_node(pilot, ...) "
                      "(one copy per machine), or send the data itself")

    @array.setter
    def array(self, value):
        self.array  # noqa: B018 - raises

    def close(self) -> None:
        return

    def __reduce__(self):
        pid, fd = self._origin
        return (_attach, (self._token, pid, fd, self.shape, self.dtype.str, self._home))

    def __repr__(self) -> str:
        return f"<shoal.SharedArray shape={self.shape} dtype={self.dtype} on host {self._home!r}>"


def this_host() -> str:
    """This process's host name, as handles of host-local memory record it (a pid and an fd
    name something only there)."""
    return socket.gethostname()


class _OnOneArray:
    """An object whose state is one SharedArray (``_memory()``): ``close()`` closes it, and
    a backend's replica of a pilot-level object leaves this machine as that object's
    handle (``portable_as``); anything else pickles as its array (which stays local)."""

    def _memory(self) -> SharedArray:
        raise NotImplementedError

    def close(self) -> None:
        self._memory().close()

    def __reduce_ex__(self, protocol):
        if getattr(_leaving, "on", False):  # a replica goes as its pilot-level object
            call = _leaving_as(getattr(self._memory(), "_token", None), _OnOneArray)
            if call is not None:
                return call
        return super().__reduce_ex__(protocol)


class BestCell(_OnOneArray):
    """The best value found so far (max or min), shared by the driver and all workers."""

    def __init__(self, slots: int, sense: Sense | str = Sense.MAX, *, initial: float | None = None):
        self.sense = Sense(sense)
        worst = float("-inf") if self.sense is Sense.MAX else float("inf")
        self._slots = SharedArray((slots,), "float64", fill=worst if initial is None else initial)

    @classmethod
    def for_pilot(cls, pilot, sense: Sense | str = Sense.MAX, *, initial: float | None = None) -> BestCell:
        """A cell for the tasks of ``pilot``, on every node it spans.

        Local backend: one cell in this machine's shared memory.  dask backend:
        one replica per node, kept in step through the driver (an improvement
        reaches the other nodes within milliseconds; docs/dask.md).
        """
        return pilot.shared.best_cell(sense, initial)

    @property
    def slots(self):
        """The per-process slots (numpy float64; slot i written only by process i).  For a
        backend that keeps replicas of a cell in step (backends/dask/cells.py)."""
        return self._slots.array

    def _me(self) -> int:
        worker = context.worker
        return 0 if worker is None else worker.ep % len(self._slots.array)

    @property
    def value(self) -> float:
        """The best value any process has offered (a few loads; lock-free)."""
        a = self._slots.array
        return float(a.max() if self.sense is Sense.MAX else a.min())

    def offer(self, value: float) -> bool:
        """Record ``value`` if it beats this process's own best; True if it beats the global best."""
        value = float(value)
        a = self._slots.array
        me = self._me()
        if self.sense is Sense.MAX:
            better = value > a.max()
            if value > a[me]:
                a[me] = value
        else:
            better = value < a.min()
            if value < a[me]:
                a[me] = value
        return bool(better)

    def _memory(self) -> SharedArray:
        return self._slots

    def __repr__(self) -> str:
        return f"<shoal.BestCell {self.sense.value} {self.value}>"


_HEADER = 3  # int64 words in front of each Channel slot: sequence, acknowledged, length


class Channel(_OnOneArray):
    """Small messages from tasks to the driver: one slot per process, lock-free.

    ``put(blob)`` (in a task) fills this worker's slot, or returns False while
    the driver has not yet taken the previous message from it; ``get()`` (in
    the driver) takes every waiting message.  A slot's words each have one
    writer: the worker bumps *sequence* after writing the bytes, the driver
    sets *acknowledged* = *sequence* after copying them out.  On a dask pilot
    each node has its own slots, which the node forwards to the driver.
    """

    def __init__(self, slots: int, size: int = 1 << 15):
        self.size = size
        self._board = SharedArray((slots, 8 * _HEADER + size), "uint8", fill=0)

    @classmethod
    def for_pilot(cls, pilot, size: int = 1 << 15) -> Channel:
        """A channel from the tasks of ``pilot`` to its driver (each node forwards its
        slots on a dask pilot)."""
        return pilot.shared.channel(size)

    def _words(self, row: int):
        return self._board.array[row, :8 * _HEADER].view("int64")

    def put(self, blob: bytes) -> bool:
        """Send ``blob`` (at most ``size`` bytes); False if the slot is still full."""
        if len(blob) > self.size:
            raise ValueError(f"a Channel message holds at most {self.size} bytes, got {len(blob)}")
        worker = context.worker
        row = 0 if worker is None else worker.ep % self._board.shape[0]
        h = self._words(row)
        if h[0] != h[1]:
            return False
        self._board.array[row, 8 * _HEADER:8 * _HEADER + len(blob)] = memoryview(blob)
        h[2] = len(blob)
        h[0] += 1  # publish after the bytes
        return True

    def get(self) -> list[bytes]:
        """Take the waiting messages (driver side; never blocks)."""
        out = []
        a = self._board.array
        for row in range(a.shape[0]):
            h = self._words(row)
            if h[0] != h[1]:
                out.append(bytes(a[row, 8 * _HEADER:8 * _HEADER + int(h[2])]))
                h[1] = h[0]
        return out

    def _memory(self) -> SharedArray:
        return self._board


class LocalShared:
    """The ``SharedFactory`` (runtime/api.py) of a one-machine pilot: every object is one
    memfd that the driver and all workers map; ``slots`` = driver + workers."""

    def __init__(self, slots: int):
        self.slots = slots

    def node_array(self, shape, dtype, fill) -> SharedArray:
        return SharedArray(shape, dtype, fill=fill)

    def best_cell(self, sense, initial) -> BestCell:
        return BestCell(self.slots, sense, initial=initial)

    def channel(self, size: int) -> Channel:
        return Channel(self.slots, size)
