"""What one task attempt used: host, node runtime, CPU time, peak RSS, bytes read and written.

Measured where the attempt ran, by the means the OS offers for that kind of task:

* **executables** (local runner threads, and ``remote.run_executable`` on a dask node): the
  child is reaped with ``os.wait4``, whose ``rusage`` gives its user and system CPU time and
  peak RSS (``ru_maxrss``, KiB on Linux), each including the descendants it waited for (a
  ``pre_exec`` shell's commands).  That peak is at least the spawning process's own peak at
  the exec (``own_peak``): a child that stayed below it has no RSS figure (None), one above
  it has its own.  ``/proc/<pid>/io`` is read while the child is a zombie
  (exited, not yet reaped: the runner waits with ``WNOWAIT`` first), which still holds its
  counters and those of the children it reaped.  A child that exits within the fast spawn's
  quick window is reaped inside the C helper (spawn.py) with ``wait4`` too, which returns its
  rusage; such attempts (under 5 ms) have CPU figures (RSS as above) but no byte counts.
* **function tasks** (pilot workers, local or on dask): measured in the worker around the
  call (``measured_call``): CPU time as ``getrusage`` deltas of the worker process and of the
  children it reaped meanwhile; peak RSS as the worker's high-water mark during the call --
  reset before it (``/proc/self/clear_refs``) and read after it (``VmHWM`` of
  ``/proc/self/status``), through file descriptors kept open per process (``pread``/
  ``pwrite`` at offset 0 regenerate them), so the figure is the call's peak *including the
  worker's own memory* (the interpreter, its imports).  Not ``ru_maxrss``: a worker started
  by a big driver inherits the driver's peak there (the exec keeps the spawner's high-water
  mark), which hid every call's peak below it.  No byte counts: two more ``/proc/self/io``
  reads per call cost a tiny task more than the rest of the measurement, so they are left
  to executables.  A task that waits on child tasks it spawned runs others meanwhile in the
  same process: their use is counted in it.

Bytes: ``read_chars``/``write_chars`` are everything passed through read/write system calls
(files, pipes, sockets; ``rchar``/``wchar``), ``read_bytes``/``write_bytes`` what went to or
came from storage (``read_bytes``/``write_bytes``: 0 for a file served from the page cache).
Without ``/proc`` (not Linux) they are None, as is every figure the OS did not give.

Rejected alternatives: sampling processes with psutil from the driver (the driver does not
see the nodes' processes, and a sampler misses short peaks — ``ru_maxrss`` is exact); a
``time -v`` wrapper around each executable (one more exec per task; a small supervisor that
forks the task would also give the peaks below the spawner's, at that price);
``RUSAGE_THREAD`` for function tasks (misses the BLAS/OpenMP threads the call starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import resource
import socket

import shoal

# the journal's columns and their SQLite types, in ``Usage.row`` order (journal.py has them
# in tasks and failed_attempts)
COLUMNS = (("host", "TEXT"), ("node", "TEXT"), ("cpu_user", "REAL"), ("cpu_sys", "REAL"),
           ("max_rss", "INTEGER"), ("read_chars", "INTEGER"), ("write_chars", "INTEGER"),
           ("read_bytes", "INTEGER"), ("write_bytes", "INTEGER"))
_IO_KEYS = {b"rchar": "read_chars", b"wchar": "write_chars", b"read_bytes": "read_bytes",
            b"write_bytes": "write_bytes"}
HOST = socket.gethostname()


@dataclasses.dataclass(frozen=True)
class Usage:
    """One attempt's resource use; None where not measured.  ``max_rss`` in bytes."""

    host: str | None = None
    node: str | None = None  # the node runtime: "cpus 0,1" (local runners), "worker 2 cpu 1"
    cpu_user: float | None = None
    cpu_sys: float | None = None
    max_rss: int | None = None
    read_chars: int | None = None
    write_chars: int | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None

    def row(self) -> tuple:
        """The values of ``COLUMNS``, in order."""
        return tuple(getattr(self, name) for name, _ in COLUMNS)


NONE = Usage()


def worker_node() -> str | None:
    """The shoal worker (node runtime) running the calling task, in words; None outside one."""
    worker = shoal.current_worker()
    return f"worker {worker.id} cpu {worker.cpu}" if worker is not None else None


def _read(path: str) -> bytes | None:
    """A /proc file's bytes in one read (no Python file object: these are read per task)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 16384)
    except OSError:
        return None
    finally:
        os.close(fd)


def proc_io(pid: int | str = "self") -> dict[str, int]:
    """``/proc/<pid>/io`` as {column: bytes}; {} when unreadable (not Linux, gone, not ours)."""
    out: dict[str, int] = {}
    for line in (_read(f"/proc/{pid}/io") or b"").splitlines():
        key, _, value = line.partition(b":")
        name = _IO_KEYS.get(key)
        if name is not None:
            try:
                out[name] = int(value)
            except ValueError:
                pass
    return out


def own_peak(child_maxrss_kib: int) -> int | None:
    """A reaped child's own peak RSS in bytes, or None when it cannot be told apart from ours.

    Linux's ``ru_maxrss`` of a child is at least the peak RSS of the process that started
    it, as of the exec: the exec records the memory the child had until then -- ours, shared
    (vfork) or copied (fork) -- as its high-water mark.  Our own ``ru_maxrss``, read after
    the child exited, is at least that; a child above it peaked there itself.  (Seen: every
    ``/bin/true`` of a driver that had once held 300 MB "peaked" at 338 MB.)"""
    ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return child_maxrss_kib * 1024 if child_maxrss_kib > ours else None


def of_child(ru, io: dict[str, int], node: str | None = None) -> Usage:
    """An executable's use from ``os.wait4``'s rusage and its zombie's ``proc_io``."""
    return Usage(host=HOST, node=node, cpu_user=ru.ru_utime, cpu_sys=ru.ru_stime,
                 max_rss=own_peak(ru.ru_maxrss), **io)


def of_rusage(ru: tuple | None) -> Usage | None:
    """An executable's use from the C spawn helper's (user s, system s, peak RSS KiB) of a
    child it reaped itself (no /proc byte counts: it was gone before anyone could read them)."""
    if ru is None:
        return None
    user, system, rss_kib = ru
    return Usage(host=HOST, cpu_user=user, cpu_sys=system, max_rss=own_peak(rss_kib))


def wait_usage(pid: int, node: str | None = None) -> tuple[int, Usage]:
    """Reap ``pid`` (exited or about to): its wait status and what it used.  Reads its
    ``/proc`` counters first, which a zombie still holds.  ChildProcessError as ``waitpid``."""
    io = proc_io(pid)
    _, status, ru = os.wait4(pid, 0)
    return status, of_child(ru, io, node)


USAGE_ATTR = "_shoal_usage"  # set on the exception a measured call raised (kept by pickling)


def measured_call(fn, *args, **kwargs) -> tuple:
    """Call ``fn`` in this (worker) process and measure it (see the module docstring):
    ``(its value, Usage.row())`` -- a plain tuple, which costs the result's trip back to the
    driver a few bytes where the dataclasses cost hundreds.  An exception is re-raised with
    the measurement as its ``_shoal_usage`` attribute."""
    reset = _PeakFiles.reset()
    self0 = _getrusage(_SELF)
    kids0 = _getrusage(_CHILDREN)
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        usage = _since(reset, self0, kids0)
        try:
            setattr(exc, USAGE_ATTR, usage)
        except (AttributeError, TypeError):  # __slots__ or a built-in without a __dict__
            pass
        raise
    return value, _since(reset, self0, kids0).row()


def measuring(fn):
    """``fn`` wrapped in ``measured_call``: a plain function (named as ``fn``), which a pilot
    defines on its workers once and then sends by id -- a ``functools.partial`` would be
    pickled with every task."""
    @functools.wraps(fn)
    def measured(*args, **kwargs):
        return measured_call(fn, *args, **kwargs)
    return measured


_getrusage, _SELF, _CHILDREN = resource.getrusage, resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN


class _PeakFiles:
    """This process's ``/proc/self/clear_refs`` and ``/proc/self/status``, opened once per
    process (a forked child opens its own: the parent's name the parent)."""

    pid = 0
    clear = status = -1

    @classmethod
    def reset(cls) -> bool:
        """The peak RSS (VmHWM) back to the current RSS; False without /proc."""
        if cls.pid != os.getpid():
            cls.pid = os.getpid()
            cls.clear = cls.status = -1
            with contextlib.suppress(OSError):
                cls.clear = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
                cls.status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.pwrite(cls.clear, b"5", 0)
            return True
        except OSError:
            return False

    @classmethod
    def peak(cls) -> int | None:
        """The peak RSS since the last ``reset``, bytes (None if unreadable)."""
        try:
            text = os.pread(cls.status, 16384, 0)
            at = text.index(b"VmHWM:")
            return int(text[at + 6:text.index(b"kB", at)]) * 1024
        except (OSError, ValueError):
            return None


def _since(reset: bool, self0, kids0) -> Usage:
    self1 = _getrusage(_SELF)
    kids1 = _getrusage(_CHILDREN)
    return Usage(host=HOST, node=worker_node() or f"pid {os.getpid()}",
                 cpu_user=(self1.ru_utime - self0.ru_utime) + (kids1.ru_utime - kids0.ru_utime),
                 cpu_sys=(self1.ru_stime - self0.ru_stime) + (kids1.ru_stime - kids0.ru_stime),
                 max_rss=_PeakFiles.peak() if reset else None)


def of_row(row: tuple) -> Usage:
    """The Usage whose ``row()`` is ``row`` (what ``measured_call`` returns)."""
    return Usage(*row)


def of_exception(exc: BaseException | None) -> Usage:
    """The measurement a failed measured call attached to its exception (NONE if absent)."""
    usage = getattr(exc, USAGE_ATTR, None) if exc is not None else None
    if usage is None and exc is not None and exc.__cause__ is not None:
        usage = getattr(exc.__cause__, USAGE_ATTR, None)
    return usage if isinstance(usage, Usage) else NONE
