"""Anonymous shared memory that cannot leak: ``memfd_create`` + ``mmap``.

Data flow: the creator (the driver) calls ``Segment.create(size)``; the fd is
handed to each worker with ``subprocess.Popen(..., pass_fds=[seg.fd])`` and the
worker calls ``Segment.attach(fd, size)``.  Both map the same pages.

Invariants:
  * The region has no name anywhere: memfd lives only as long as some process
    holds the fd or a mapping.  When every process exits (even by SIGKILL) the
    kernel frees it, so nothing can outlive the pilot in /dev/shm.
  * ``size`` is rounded up to whole pages; the memory starts zeroed (ftruncate
    of a fresh file) and is only allocated when touched.

Alternatives rejected: ``multiprocessing.shared_memory`` and named POSIX shm
(``shm_open``) put a name in /dev/shm that leaks when the owner is SIGKILLed
before it can unlink (the resource tracker is itself a process that can die);
SysV shm leaks the same way.  Fallback where memfd is unavailable (old kernels,
non-Linux): a temp file in /dev/shm (or the temp dir) that is unlinked right
after it is opened, so it too has no name while in use.

Closing: ``close()`` releases ``buf``, unmaps and closes the fd, and is
idempotent.  Callers should release views they derived from ``buf`` first; if
some are still alive ``close()`` does not raise BufferError: the mapping is left
to the garbage collector (it is unmapped when the last view goes) and the fd is
closed anyway (a mapping stays valid without its fd).  After ``close()``,
``buf`` is None.
"""
from __future__ import annotations

import mmap
import os
import tempfile

__all__ = ["Segment"]

_PAGE = mmap.PAGESIZE


def _round_up(size: int) -> int:
    return (size + _PAGE - 1) // _PAGE * _PAGE


def _anonymous_fd() -> int:
    """A fresh close-on-exec fd for an anonymous file (memfd, else an unlinked temp file)."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        try:
            return memfd_create("shoal", os.MFD_CLOEXEC)
        except OSError:  # pragma: no cover - kernels without memfd
            pass
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else None  # pragma: no cover
    fd, path = tempfile.mkstemp(prefix="shoal-", dir=directory)  # pragma: no cover
    os.unlink(path)  # pragma: no cover - nameless from here on
    return fd  # pragma: no cover


class Segment:
    """An anonymous shared memory region (create once, attach in children)."""

    __slots__ = ("fd", "size", "buf", "_mmap", "_closed", "__weakref__")

    def __init__(self, fd: int, size: int, mm: mmap.mmap):
        self.fd = fd
        self.size = size
        self._mmap = mm
        self.buf = memoryview(mm)
        self._closed = False

    @classmethod
    def create(cls, size: int) -> Segment:
        """Creator only: a new zeroed region of at least ``size`` bytes (rounded to pages)."""
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"Segment size must be a positive int, got size={size!r}")
        size = _round_up(size)
        fd = _anonymous_fd()
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, mm)

    @classmethod
    def attach(cls, fd: int, size: int) -> Segment:
        """Map an inherited fd of ``size`` bytes; the Segment takes ownership of ``fd``."""
        actual = os.fstat(fd).st_size
        if actual < size:
            raise ValueError(f"Segment.attach: fd {fd} holds {actual} bytes, expected size={size}")
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(fd, size, mm)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the view, unmap and close the fd (idempotent; tolerates live views)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.buf.release()
        except BufferError:
            pass  # views derived via the buffer protocol are alive; GC unmaps later
        try:
            self._mmap.close()
        except BufferError:
            pass  # slices/casts of buf are alive; the mmap is unmapped when they go
        # Drop our references: if views are still alive, the mapping (and the
        # mmap's private dup of the fd) goes when the last of them is released.
        self._mmap = None
        self.buf = None
        try:
            os.close(self.fd)
        except OSError:
            pass

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Segment fd={self.fd} size={self.size} {state}>"
