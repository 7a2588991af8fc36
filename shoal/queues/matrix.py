"""The layout of one shared Segment for ``n`` endpoints: a ring per ordered pair.

Data flow: the driver (endpoint 0) builds ``RingMatrix(n)``, which creates the
Segment and one Doorbell per endpoint, and starts worker ``i`` (1..n-1) with
``subprocess.Popen([...], pass_fds=matrix.fds())`` handing it ``matrix.spec()``
(msgpack/JSON-able).  The worker calls ``RingMatrix.attach(spec)``; pass_fds
keeps fd numbers unchanged, and the spec records them.  Endpoint ``a`` sends to
``b`` by ``ring(a, b).push(...)`` then ``doorbell(b).ring()``; ``b`` drains
``ring(x, b)`` for every ``x`` and parks on ``doorbell(b)`` when all are empty.

Segment layout (every part 64-byte aligned)::

    0                 header: magic, version, n, capacity, peer_capacity (u64 each)
    64                n doorbells, Doorbell.FOOTPRINT (64) bytes each
    64 + 64n          n status cells, STATUS_WORDS (8) u64 words each
    64 + 128n         rings in (src, dst) order, src != dst, Ring.footprint(cap) each;
                      cap = capacity if 0 in (src, dst) else peer_capacity

Invariants: ring(src, dst) has one producer (src) and one consumer (dst); the
status cell of ``ep`` is written by ``ep`` only (readers see word-atomic values).
The segment is memfd-backed and sparse: pages of a ring are only allocated
once used.

Ownership: a RingMatrix owns its Segment and doorbell fds (created ones, or the
ones passed in / inherited by attach) and closes them in ``close()``, or at
once when the constructor or ``attach`` fails.  Ring objects cache no counters,
so any Ring over the same memory may act as a ring's consumer as long as only
one does at a time (e.g. the driver draining ``ring(0, ep)`` of a dead worker).

Alternatives rejected: one MPMC queue per worker (needs CAS or a lock between
producers); one segment per ring (n**2 fds to pass and map).
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from .parking import Doorbell
from .ring import HEADER_BYTES, Ring, _check_capacity
from .segment import Segment

__all__ = ["RingMatrix"]

_MAGIC = int.from_bytes(b"SHOALRM1", "little")
_VERSION = 1
_HEADER = 64


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class RingMatrix:
    """Rings, doorbells and status cells for ``n`` endpoints in one Segment (creator or attacher)."""

    #: u64 words in each endpoint's status cell.
    STATUS_WORDS = 8

    @staticmethod
    def layout_size(n_endpoints: int, capacity: int, peer_capacity: int) -> int:
        """Bytes of segment a matrix needs (before rounding to pages)."""
        size = _HEADER + n_endpoints * (Doorbell.FOOTPRINT + 8 * RingMatrix.STATUS_WORDS)
        for src in range(n_endpoints):
            for dst in range(n_endpoints):
                if src != dst:
                    cap = capacity if 0 in (src, dst) else peer_capacity
                    size += Ring.footprint(cap)
        return size

    def __init__(
        self,
        n_endpoints: int,
        capacity: int = 1 << 20,
        peer_capacity: int = 1 << 18,
        segment: Segment | None = None,
        doorbell_fds: list[tuple] | None = None,
        *,
        native: bool | None = None,
    ):
        try:
            if not isinstance(n_endpoints, int) or n_endpoints < 1:
                raise ValueError(f"n_endpoints must be an int >= 1, got n_endpoints={n_endpoints!r}")
            _check_capacity(capacity)
            if n_endpoints > 2:
                _check_capacity(peer_capacity)
        except ValueError:
            if segment is not None:  # ownership passed with the call
                segment.close()
                for fds in doorbell_fds or ():
                    for fd in fds:
                        _close_quietly(fd)
            raise
        self.n = n_endpoints
        self.capacity = capacity
        self.peer_capacity = peer_capacity
        self._native = native
        self._rings: dict[tuple[int, int], Ring] = {}
        self._status: dict[int, memoryview] = {}
        self._closed = False
        # offsets
        self._bell_base = _HEADER
        self._status_base = _HEADER + n_endpoints * Doorbell.FOOTPRINT
        off = self._status_base + n_endpoints * 8 * self.STATUS_WORDS
        self._ring_offsets: dict[tuple[int, int], tuple[int, int]] = {}
        for src in range(n_endpoints):
            for dst in range(n_endpoints):
                if src != dst:
                    cap = capacity if 0 in (src, dst) else peer_capacity
                    self._ring_offsets[(src, dst)] = (off, cap)
                    off += Ring.footprint(cap)
        needed = off

        creating = segment is None
        self._doorbells: list[Doorbell] = []
        if creating:
            if doorbell_fds is not None:
                raise ValueError("doorbell_fds can only be given together with segment")
            segment = Segment.create(needed)
        self.segment = segment
        try:
            if not creating:
                if segment.size < needed:
                    raise ValueError(f"segment of {segment.size} bytes is smaller than the {needed} this layout needs")
                if doorbell_fds is None or len(doorbell_fds) != n_endpoints:
                    raise ValueError(
                        f"attaching needs doorbell_fds for all {n_endpoints} endpoints, got {doorbell_fds!r}"
                    )
            self._init_header(creating)
            for ep in range(n_endpoints):
                fds = None if creating else doorbell_fds[ep]
                offset = self._bell_base + ep * Doorbell.FOOTPRINT
                self._doorbells.append(Doorbell(segment.buf, offset, fds, owns_fds=True, native=native))
        except BaseException:
            # Ownership passed to us with the call: release what we were given too.
            self.close()
            if not creating:
                for fds in (doorbell_fds or [])[len(self._doorbells) :]:
                    for fd in fds:
                        _close_quietly(fd)
            raise

    def _init_header(self, creating: bool) -> None:
        buf = self.segment.buf
        hdr = buf[:_HEADER].cast("Q")
        try:
            layout = (_VERSION, self.n, self.capacity, self.peer_capacity)
            if creating:
                for offset, _cap in self._ring_offsets.values():
                    buf[offset : offset + HEADER_BYTES] = bytes(HEADER_BYTES)
                hdr[1], hdr[2], hdr[3], hdr[4] = layout
                hdr[0] = _MAGIC
            else:
                found = (hdr[0], hdr[1], hdr[2], hdr[3], hdr[4])
                if found != (_MAGIC, *layout):
                    raise ValueError(f"segment header {found} does not match this layout {(_MAGIC, *layout)}")
        finally:
            hdr.release()

    # -- attaching in a child --------------------------------------------------------

    def spec(self) -> dict:
        """What a child needs to attach besides the fds themselves (msgpack/JSON-able)."""
        return {
            "version": _VERSION,
            "n": self.n,
            "capacity": self.capacity,
            "peer_capacity": self.peer_capacity,
            "size": self.segment.size,
            "segment_fd": self.segment.fd,
            "doorbell_fds": [list(bell.fds) for bell in self._doorbells],
        }

    def fds(self) -> list[int]:
        """The segment fd and every doorbell fd: pass them with ``subprocess.Popen(pass_fds=...)``."""
        out = [self.segment.fd]
        for bell in self._doorbells:
            out.extend(bell.fds)
        return out

    @classmethod
    def attach(
        cls,
        spec: Mapping,
        fd_map: Mapping[int, int] | None = None,
        *,
        native: bool | None = None,
    ) -> RingMatrix:
        """Called once per child: map the segment and take ownership of the inherited fds.

        Ownership passes with the call: the fds are closed by ``close()``, or
        at once if attaching fails.

        ``fd_map`` translates the fd numbers recorded in ``spec`` to this
        process's numbers; leave it None with pass_fds (numbers are unchanged).
        """
        if spec.get("version") != _VERSION:
            raise ValueError(f"RingMatrix spec version {spec.get('version')!r} != {_VERSION}")

        def fd(num: int) -> int:
            return num if fd_map is None else fd_map[num]

        bells = [tuple(fd(x) for x in fds) for fds in spec["doorbell_fds"]]
        try:
            segment = Segment.attach(fd(spec["segment_fd"]), spec["size"])
        except BaseException:
            for fds in bells:
                for num in fds:
                    _close_quietly(num)
            raise
        return cls(spec["n"], spec["capacity"], spec["peer_capacity"], segment, bells, native=native)

    # -- access ----------------------------------------------------------------------

    def ring(self, src: int, dst: int) -> Ring:
        """The ring from ``src`` to ``dst`` (push by src only, pop by dst only)."""
        ring = self._rings.get((src, dst))
        if ring is None:
            if self._closed:
                raise ValueError("RingMatrix is closed")
            try:
                offset, cap = self._ring_offsets[(src, dst)]
            except KeyError:
                raise ValueError(
                    f"no ring from src={src} to dst={dst} (endpoints 0..{self.n - 1}, src != dst)"
                ) from None
            ring = Ring(self.segment.buf, offset, cap, native=self._native)
            self._rings[(src, dst)] = ring
        return ring

    def doorbell(self, ep: int) -> Doorbell:
        """The doorbell of endpoint ``ep`` (ring: anyone; park: ep only)."""
        self._check_ep(ep)
        return self._doorbells[ep]

    def status(self, ep: int) -> memoryview:
        """Endpoint ``ep``'s status cell: STATUS_WORDS u64 words (written by ep only)."""
        self._check_ep(ep)
        view = self._status.get(ep)
        if view is None:
            if self._closed:
                raise ValueError("RingMatrix is closed")
            start = self._status_base + ep * 8 * self.STATUS_WORDS
            raw = self.segment.buf[start : start + 8 * self.STATUS_WORDS]
            view = raw.cast("Q")
            raw.release()
            self._status[ep] = view
        return view

    def _check_ep(self, ep: int) -> None:
        if not isinstance(ep, int) or not 0 <= ep < self.n:
            raise ValueError(f"endpoint ep={ep!r} out of range 0..{self.n - 1}")

    def close(self) -> None:
        """Release rings, status views, doorbells and the segment (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for ring in self._rings.values():
            ring.close()
        self._rings.clear()
        for view in self._status.values():
            view.release()
        self._status.clear()
        for bell in self._doorbells:
            bell.close()
        self.segment.close()

    def __enter__(self) -> RingMatrix:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RingMatrix n={self.n} capacity={self.capacity} peer_capacity={self.peer_capacity} size={self.segment.size}>"
