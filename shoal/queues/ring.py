"""Lock-free single-producer/single-consumer byte ring in shared memory.

Data flow: one process (the producer) calls ``Ring.push``; exactly one other
process (the consumer) calls ``Ring.pop`` / ``Ring.pop_many``.  A ``RingMatrix``
gives every ordered pair of endpoints its own ring, so no ring ever has two
writers and no lock or CAS is needed.

Layout at ``buf[offset : offset + Ring.footprint(capacity)]``::

    +0    head  u64   bytes consumed; written by the consumer only
    +64   tail  u64   bytes produced; written by the producer only
    +128  data  capacity bytes of records

head and tail sit on their own 64-byte cache lines (no false sharing).  They are
free-running byte counters (mod 2**64); a position is ``counter & (capacity-1)``
and ``tail - head`` is the number of bytes in use.  A record is a u32 length, a
u32 flags word, then the payload, padded to 8 bytes.  When a record does not fit
between its position and the end of the data area the producer writes a *wrap
marker* (flags = WRAP) there and the record at position 0, and publishes both
with one tail store; the consumer skips from a wrap marker to position 0.
Because positions are 8-aligned and capacity is a multiple of 8 there is always
room for a wrap marker's header.

Invariants:
  * head is written only by the consumer, tail only by the producer;
    0 <= tail - head <= capacity.
  * The producer copies the payload (and record header) *before* it publishes
    the new tail (release); the consumer reads tail (acquire) before it reads a
    record, and copies the payload out *before* it publishes the new head
    (release), so the producer never overwrites bytes still being read.
  * ``max_message = capacity // 4`` bytes: a record plus the worst wrap waste is
    then at most half the ring, so a push into an empty ring always succeeds.

Implementations: the native helper (``_native.RingCore``, C11 atomics, one C
call per push/pop including the memcpy and the ``bytes`` construction) and a
pure-Python fallback (``struct``/``memoryview``), correct on x86-64 thanks to
total store order and refused on weakly ordered CPUs; see DESIGN.md.

Alternatives rejected: multiprocessing.Queue/Pipe (a lock and one or more
syscalls per message), MPMC queues (need CAS or locks; SPSC per pair is enough
when every pair has its own ring), a ring of fixed-size slots (wastes memory for
small messages, and large ones need fragmenting anyway).
"""
from __future__ import annotations

import struct

from . import _impl
from .results import EMPTY, Empty, Push

__all__ = ["Ring"]

HEADER_BYTES = 128  # head line + tail line
_HEAD = 0  # index of head in the header viewed as u64 words
_TAIL = 8  # index of tail (byte offset 64)
_REC = struct.Struct("=II")  # record header: u32 length, u32 flags (native order, as in C)
_REC_BYTES = 8
FLAG_WRAP = 1
_M64 = (1 << 64) - 1
MIN_CAPACITY = 4096
MAX_CAPACITY = 1 << 32


def _check_capacity(capacity: int) -> None:
    if (
        not isinstance(capacity, int)
        or capacity < MIN_CAPACITY
        or capacity > MAX_CAPACITY
        or capacity & (capacity - 1)
    ):
        raise ValueError(
            f"capacity must be a power of two between {MIN_CAPACITY} and {MAX_CAPACITY}, "
            f"got capacity={capacity!r}"
        )


def _closed(*args, **kwargs):
    raise ValueError("ring has been released (Ring.close was called)")


class Ring:
    """SPSC byte ring; ``push`` is producer only, ``pop``/``pop_many`` consumer only.

    With the native helper, ``push``, ``pop``, ``pop_many``, ``readable`` and
    ``used_bytes`` are the C core's bound methods (set on the instance), so a
    call costs one C call.
    """

    #: Data bytes (a power of two >= 4096).
    capacity: int
    #: Largest payload ``push`` accepts (capacity // 4); bigger ones raise ValueError.
    max_message: int
    #: Where the ring's header starts in the buffer.
    offset: int
    #: Whether the C helper is in use.
    native: bool

    @staticmethod
    def footprint(capacity: int) -> int:
        """Bytes a ring of ``capacity`` needs, header included (a multiple of 64)."""
        _check_capacity(capacity)
        return HEADER_BYTES + capacity

    @classmethod
    def initialise(cls, buf, offset: int, capacity: int, *, native: bool | None = None) -> Ring:
        """Called once, by the creator: zero the header, then attach (returns the Ring)."""
        size = cls.footprint(capacity)
        if offset < 0 or offset + size > len(buf):
            raise ValueError(f"ring at offset={offset} of {size} bytes does not fit a {len(buf)}-byte buffer")
        buf[offset : offset + HEADER_BYTES] = bytes(HEADER_BYTES)
        return cls(buf, offset, capacity, native=native)

    def __init__(self, buf, offset: int, capacity: int, *, native: bool | None = None):
        size = self.footprint(capacity)
        if not isinstance(offset, int) or offset < 0 or offset % 64:
            raise ValueError(f"offset must be a non-negative multiple of 64, got offset={offset!r}")
        if offset + size > len(buf):
            raise ValueError(f"ring at offset={offset} of {size} bytes does not fit a {len(buf)}-byte buffer")
        self.capacity = capacity
        self.max_message = capacity // 4
        self.offset = offset
        self._mask = capacity - 1
        mod = _impl.resolve(native)
        self.native = mod is not None
        self._core = None
        self._hdr = self._data = self._view = None
        # head and tail, readable from either side in both modes (``produced``/``consumed``):
        # aligned u64 loads, atomic on x86-64 like the pure path's own
        self._marks = memoryview(buf)[offset : offset + HEADER_BYTES].cast("Q")
        if mod is not None:
            core = mod.RingCore(buf, offset, capacity, EMPTY, Push.OK, Push.FULL)
            self._core = core
            self.push = core.push
            self.pop = core.pop
            self.pop_many = core.pop_many
            self.readable = core.readable
            self.used_bytes = core.used_bytes
        else:
            _impl.check_pure_allowed()
            view = memoryview(buf)[offset : offset + size]
            self._view = view
            self._hdr = view[:HEADER_BYTES].cast("Q")
            self._data = view[HEADER_BYTES:]

    # -- producer side (pure path) -------------------------------------------------

    def push(self, data) -> Push:
        """Producer only: append one record; ``Push.OK`` or ``Push.FULL`` (never blocks)."""
        if type(data) is memoryview and (data.format != "B" or data.ndim != 1):
            data = data.cast("B") if data.c_contiguous else data.tobytes()
        n = len(data)
        if n > self.max_message:
            raise ValueError(
                f"payload of {n} bytes exceeds max_message={self.max_message} "
                f"(capacity {self.capacity}); fragment it"
            )
        hdr = self._hdr
        cap = self.capacity
        tail = hdr[_TAIL]
        free = cap - ((tail - hdr[_HEAD]) & _M64)
        need = _REC_BYTES + ((n + 7) & ~7)
        pos = tail & self._mask
        dv = self._data
        if pos + need > cap:
            skip = cap - pos
            if skip + need > free:
                return Push.FULL
            _REC.pack_into(dv, pos, 0, FLAG_WRAP)
            pos = 0
            advance = skip + need
        else:
            if need > free:
                return Push.FULL
            advance = need
        _REC.pack_into(dv, pos, n, 0)
        dv[pos + 8 : pos + 8 + n] = data
        # Publish: on x86 (TSO) this store is not reordered before the copies above.
        hdr[_TAIL] = (tail + advance) & _M64
        return Push.OK

    # -- consumer side (pure path) -------------------------------------------------

    def pop(self) -> bytes | Empty:
        """Consumer only: the next record's bytes, or ``EMPTY``."""
        hdr = self._hdr
        head = hdr[_HEAD]
        if head == hdr[_TAIL]:
            return EMPTY
        dv = self._data
        pos = head & self._mask
        n, flags = _REC.unpack_from(dv, pos)
        if flags & FLAG_WRAP:
            head += self.capacity - pos
            pos = 0
            n, flags = _REC.unpack_from(dv, 0)
        if n > self.max_message:
            raise RuntimeError(f"ring corrupted: record of {n} bytes at position {pos}")
        out = bytes(dv[pos + 8 : pos + 8 + n])
        hdr[_HEAD] = (head + _REC_BYTES + ((n + 7) & ~7)) & _M64
        return out

    def pop_many(self, max_n: int = 64) -> list[bytes]:
        """Consumer only: up to ``max_n`` records, with a single head publish."""
        hdr = self._hdr
        head = hdr[_HEAD]
        tail = hdr[_TAIL]
        out: list[bytes] = []
        if head == tail:
            return out
        dv = self._data
        cap = self.capacity
        mask = self._mask
        limit = self.max_message
        unpack = _REC.unpack_from
        while head != tail and len(out) < max_n:
            pos = head & mask
            n, flags = unpack(dv, pos)
            if flags & FLAG_WRAP:
                head += cap - pos
                pos = 0
                n, flags = unpack(dv, 0)
            if n > limit:
                raise RuntimeError(f"ring corrupted: record of {n} bytes at position {pos}")
            out.append(bytes(dv[pos + 8 : pos + 8 + n]))
            head = (head + _REC_BYTES + ((n + 7) & ~7)) & _M64
        hdr[_HEAD] = head
        return out

    # -- either side -----------------------------------------------------------------

    def readable(self) -> bool:
        """Either side: whether a record is waiting (head != tail; a hint for the producer)."""
        hdr = self._hdr
        return hdr[_HEAD] != hdr[_TAIL]

    def used_bytes(self) -> int:
        """Either side: bytes in use (records, padding and wrap waste)."""
        hdr = self._hdr
        return (hdr[_TAIL] - hdr[_HEAD]) & _M64

    def produced(self) -> int:
        """Either side: the tail, bytes published so far (a free-running u64 counter).

        A consumer that reads it after learning that the producer did something (a
        status word it wrote afterwards) knows every record of that something lies
        before this mark (x86-64: stores are seen in program order)."""
        return self._marks[_TAIL]

    def consumed(self) -> int:
        """Either side: the head, bytes the consumer has popped so far (free-running)."""
        return self._marks[_HEAD]

    def reached(self, mark: int) -> bool:
        """Consumer: whether everything published before ``produced()`` returned ``mark``
        has been popped (counters wrap at 2**64; a ring never holds 2**63 bytes)."""
        behind = (mark - self._marks[_HEAD]) & _M64
        return behind == 0 or behind >= 1 << 63

    def close(self) -> None:
        """Release this Ring's views of the buffer (idempotent); the ring itself stays."""
        if self._core is not None:
            self._core.release()
        for view in (self._hdr, self._data, self._view, self._marks):
            if view is not None:
                view.release()
        self._hdr = self._data = self._view = self._marks = None
        for name in ("push", "pop", "pop_many", "readable", "used_bytes", "produced", "consumed", "reached"):
            setattr(self, name, _closed)

    def __repr__(self) -> str:
        impl = "native" if self.native else "pure"
        return f"<Ring capacity={self.capacity} offset={self.offset} {impl}>"
