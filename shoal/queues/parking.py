"""Parking: a consumer sleeps on an OS primitive and no wake-up is ever lost.

Data flow: every endpoint owns one ``Doorbell`` (a u32 *sleeping* flag in
shared memory plus a wake fd: an eventfd on Linux, else a pipe).  Any producer
that pushed into one of the endpoint's rings calls ``Doorbell.ring``; only the
endpoint itself calls ``Doorbell.park``.

Protocol (a Dekker-style handshake; ``F`` = full StoreLoad fence)::

    producer (ring)                     consumer (park)
    1. publish tail (release)           1. sleeping = 1
    2. F                                2. F
    3. if sleeping: write wake fd       3. if ready(): sleeping = 0; return
                                        4. poll(wake fd, extra fds, timeout)
                                        5. drain wake fd; sleeping = 0

With both fences, either the producer sees ``sleeping == 1`` (and writes the
fd, so poll returns) or the consumer's re-check sees the new tail; a wake-up
cannot be lost.  When nobody sleeps, ``ring`` costs one fence and one shared
load.  Spurious wake-ups are harmless: callers loop on ``ready()``.

Native path: ``_native.BellCore`` uses ``atomic_thread_fence(seq_cst)``.  Pure
path: Python has no StoreLoad fence (x86 TSO lets a store be overtaken by a
later load), so a wake-up can be missed in a tiny window.  As a best effort the
pure path acquires and releases a private ``threading.Lock`` (a locked
instruction in CPython's lock on x86, which is a full fence) but CPython does
not promise that, so ``park`` also caps every sleep at ``PURE_MAX_SLEEP``
(0.02 s): a missed wake-up costs at most that delay.

Alternatives rejected: a futex on the flag word (needs the extension for the
syscall and gives nothing eventfd does not, as poll also watches lifeline fds),
signals (async, interrupt arbitrary code), pure spinning (an idle pilot must
burn no CPU), a condition variable in shared memory (needs process-shared
pthread objects, which a SIGKILLed holder leaves locked).
"""
from __future__ import annotations

import math
import os
import select
import threading
from collections.abc import Callable, Iterable

from . import _impl

__all__ = ["Doorbell"]

_WAKE = (1).to_bytes(8, "little")
_POLL_READY = select.POLLIN | select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
_MAX_PARK_S = 86400.0  # the longest single park (a later deadline is re-checked on waking)


def _make_fds() -> tuple[int, ...]:
    """A fresh wake primitive: ``(eventfd,)`` or ``(read_end, write_end)`` of a pipe."""
    eventfd = getattr(os, "eventfd", None)
    if eventfd is not None:
        try:
            return (eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC),)
        except OSError:  # pragma: no cover - kernels without eventfd
            pass
    r, w = os.pipe()  # pragma: no cover - non-Linux fallback
    os.set_blocking(r, False)  # pragma: no cover
    os.set_blocking(w, False)  # pragma: no cover
    return (r, w)  # pragma: no cover


class Doorbell:
    """Sleep/wake for one endpoint: ``ring`` by any producer, ``park`` by the owner only."""

    #: Bytes of shared memory per doorbell (the flag word on its own cache line).
    FOOTPRINT = 64
    #: Longest single sleep on the pure path (bounds the cost of a missed wake-up).
    PURE_MAX_SLEEP = 0.02

    def __init__(
        self,
        buf,
        offset: int,
        fds: Iterable[int] | None = None,
        *,
        owns_fds: bool | None = None,
        native: bool | None = None,
    ):
        if not isinstance(offset, int) or offset < 0 or offset % 8 or offset + self.FOOTPRINT > len(buf):
            raise ValueError(f"Doorbell offset={offset!r} must be 8-aligned and inside the buffer")
        created = fds is None
        if created:
            fds = _make_fds()
        fds = tuple(fds)
        if len(fds) not in (1, 2):
            raise ValueError(f"Doorbell fds must be (eventfd,) or (read, write), got fds={fds!r}")
        self.fds: tuple[int, ...] = fds
        self.offset = offset
        self._rfd = fds[0]
        self._wfd = fds[-1]
        self._owns = created if owns_fds is None else owns_fds
        self._closed = False
        mod = _impl.resolve(native)
        self.native = mod is not None
        self._core = None
        self._flag = None
        if mod is not None:
            self._core = mod.BellCore(buf, offset, self._wfd)
            if created:
                self._core.disarm()
            self.ring = self._core.ring
        else:
            self._flag = memoryview(buf)[offset : offset + 4].cast("I")
            if created:
                self._flag[0] = 0
            self._fence_lock = threading.Lock()

    def ring(self) -> None:
        """Any producer, after publishing: wake the owner if it is parked (cheap otherwise)."""
        lock = self._fence_lock  # best-effort StoreLoad fence, see module docstring
        lock.acquire()
        lock.release()
        if self._flag[0]:
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wfd, _WAKE)
        except BlockingIOError:  # pipe full: a wake-up is already pending
            pass

    @property
    def sleeping(self) -> bool:
        """Either side: whether the owner has announced that it is (about to be) asleep."""
        if self._core is not None:
            return self._core.sleeping()
        return bool(self._flag[0])

    def park(
        self,
        ready: Callable[[], bool],
        timeout: float | None,
        extra_fds: Iterable[int] = (),
    ) -> list[int]:
        """Owner only: sleep until rung, ``timeout`` (None: forever) or an extra fd is readable.

        Returns the extra fds that became readable (e.g. a lifeline pipe at EOF),
        ``[]`` when woken by a ring, a timeout, or when ``ready()`` was already
        true after announcing the sleep.
        """
        core = self._core
        if core is not None:
            core.arm()  # sleeping = 1; seq_cst fence
        else:
            self._flag[0] = 1
            lock = self._fence_lock
            lock.acquire()
            lock.release()
            if timeout is None or timeout > self.PURE_MAX_SLEEP:
                timeout = self.PURE_MAX_SLEEP
        try:
            if ready():
                return []
            poller = select.poll()
            poller.register(self._rfd, select.POLLIN)
            extra = list(extra_fds)
            for fd in extra:
                poller.register(fd, select.POLLIN)
            # poll() takes at most ~24 days in ms; a far deadline (timeout=1e10, inf) parks a day
            ms = None if timeout is None else max(0, math.ceil(min(timeout, _MAX_PARK_S) * 1000))
            try:
                events = poller.poll(ms)
            except InterruptedError:  # pragma: no cover - PEP 475 retries; be safe
                events = []
            woken = []
            for fd, ev in events:
                if fd == self._rfd:
                    self._drain()
                elif ev & _POLL_READY:
                    woken.append(fd)
            return woken
        finally:
            if core is not None:
                core.disarm()
            else:
                self._flag[0] = 0

    def _drain(self) -> None:
        while True:
            try:
                if not os.read(self._rfd, 4096):
                    return
            except BlockingIOError:
                return
            if len(self.fds) == 1:
                return  # an eventfd read returns the whole counter at once

    def close(self) -> None:
        """Close the fds this Doorbell owns and release its view (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._core is not None:
            self._core.release()
        if self._flag is not None:
            self._flag.release()
            self._flag = None
        if self._owns:
            for fd in self.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __repr__(self) -> str:
        impl = "native" if self.native else "pure"
        return f"<Doorbell offset={self.offset} fds={self.fds} {impl}>"
