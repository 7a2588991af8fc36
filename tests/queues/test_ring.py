"""Conformance of Ring (native and pure): records, wraparound, FULL, errors."""
from __future__ import annotations

import pytest
from qhelpers import native_fixture  # noqa: F401 (provides the `native` fixture)

from shoal.queues import EMPTY, Empty, Push, Ring, Segment
from shoal.queues.ring import HEADER_BYTES


@pytest.fixture
def seg():
    s = Segment.create(1 << 20)
    yield s
    s.close()


def make(seg, native, capacity=4096, offset=0):
    ring = Ring.initialise(seg.buf, offset, capacity, native=native)
    assert ring.native is native
    return ring


def test_footprint():
    assert Ring.footprint(4096) == 4096 + HEADER_BYTES
    assert Ring.footprint(1 << 20) % 64 == 0


def test_push_pop_roundtrip(seg, native):
    ring = make(seg, native)
    assert ring.pop() is EMPTY
    assert isinstance(ring.pop(), Empty)
    assert not ring.readable()
    assert ring.used_bytes() == 0
    for payload in [b"", b"a", b"hello world", bytes(range(256)), b"x" * ring.max_message]:
        assert ring.push(payload) is Push.OK
        assert ring.readable()
        out = ring.pop()
        assert type(out) is bytes and out == payload
    assert ring.pop() is EMPTY
    assert ring.used_bytes() == 0


def test_empty_payload_is_not_empty_result(seg, native):
    ring = make(seg, native)
    ring.push(b"")
    assert ring.pop() == b""
    assert ring.pop() is EMPTY


def test_accepts_bytes_like(seg, native):
    ring = make(seg, native)
    assert ring.push(bytearray(b"abc")) is Push.OK
    assert ring.push(memoryview(b"abcdefgh")[2:5]) is Push.OK
    assert ring.push(memoryview(b"abcdefgh").cast("Q")) is Push.OK  # raw bytes of the view
    assert ring.push(memoryview(b"abcdefgh")[::2]) is Push.OK  # non-contiguous: copied
    assert ring.pop_many() == [b"abc", b"cde", b"abcdefgh", b"aceg"]


def test_fifo_and_pop_many(seg, native):
    ring = make(seg, native, capacity=1 << 16)
    msgs = [bytes([i % 251]) * (i % 37) for i in range(500)]
    for m in msgs:
        assert ring.push(m) is Push.OK
    got = ring.pop_many(10)
    assert got == msgs[:10]
    got += ring.pop_many(1000)
    assert got == msgs
    assert ring.pop_many() == []
    assert ring.pop_many(0) == []


def test_full_and_record_accounting(seg, native):
    ring = make(seg, native)
    # each 24-byte payload takes 8 (header) + 24 = 32 bytes; 4096 / 32 = 128 records
    for i in range(128):
        assert ring.push(bytes([i]) * 24) is Push.OK, i
    assert ring.used_bytes() == 4096
    assert ring.push(b"") is Push.FULL
    assert ring.pop() == bytes([0]) * 24
    assert ring.push(bytes(24)) is Push.OK
    assert ring.push(b"") is Push.FULL


def test_wraparound_many_times(seg, native):
    ring = make(seg, native)
    sizes = [0, 1, 7, 8, 9, 100, 1000, ring.max_message, 513, 3]
    for i in range(5000):
        payload = bytes([i % 256]) * sizes[i % len(sizes)]
        assert ring.push(payload) is Push.OK
        if i % 3 == 0:
            assert ring.push(payload) is Push.OK
            assert ring.pop() == payload
        assert ring.pop() == payload
    assert ring.pop() is EMPTY


def test_max_message_always_fits_an_empty_ring(seg, native):
    ring = make(seg, native)
    for pos in range(0, 4096, 8):  # an empty ring at every possible position
        seg.buf[0:8] = seg.buf[64:72] = (pos + 4096 * 7).to_bytes(8, "little")
        assert ring.push(bytes(ring.max_message)) is Push.OK, pos
        assert ring.push(b"") is Push.OK, pos
        assert ring.pop() == bytes(ring.max_message)
        assert ring.pop() == b""


def test_counters_wrap_mod_2_64(seg, native):
    # Start both counters just below 2**64 (a ring that has carried 16 EiB).
    start = (1 << 64) - 64
    seg.buf[0:128] = bytes(128)
    seg.buf[0:8] = start.to_bytes(8, "little")
    seg.buf[64:72] = start.to_bytes(8, "little")
    ring = Ring(seg.buf, 0, 4096, native=native)
    for i in range(20):
        assert ring.push(bytes([i]) * 20) is Push.OK
    assert ring.used_bytes() == 20 * 32
    assert [r[0] for r in ring.pop_many(100)] == list(range(20))
    assert int.from_bytes(seg.buf[0:8], "little") == (start + 640) % (1 << 64)


def test_attach_sees_same_ring(seg, native):
    producer = make(seg, native, offset=4096 + 64)
    consumer = Ring(seg.buf, 4096 + 64, 4096, native=not native if _other_available() else native)
    producer.push(b"one")
    assert consumer.pop() == b"one"
    producer.close()
    consumer.close()


def _other_available() -> bool:
    from shoal.queues import _impl

    return _impl.NATIVE_AVAILABLE


def test_oversize_push_names_size_and_limit(seg, native):
    ring = make(seg, native)
    with pytest.raises(ValueError, match=r"1025 bytes.*max_message=1024"):
        ring.push(bytes(1025))
    assert ring.pop() is EMPTY


@pytest.mark.parametrize("capacity", [0, 1000, 2048, 4095, 4097, 6144, 1 << 33, "4096", 4096.0])
def test_bad_capacity_names_argument(seg, native, capacity):
    with pytest.raises(ValueError, match="capacity"):
        Ring(seg.buf, 0, capacity, native=native)
    with pytest.raises(ValueError, match="capacity"):
        Ring.footprint(capacity)


def test_bad_offset_and_too_small_buffer(seg, native):
    with pytest.raises(ValueError, match="offset"):
        Ring(seg.buf, 8, 4096, native=native)
    with pytest.raises(ValueError, match="does not fit"):
        Ring(seg.buf, len(seg.buf) - 4096, 4096, native=native)


def test_close_releases_views(native):
    seg = Segment.create(1 << 16)
    ring = make(seg, native)
    ring.push(b"x")
    ring.close()
    ring.close()  # idempotent
    seg.buf.release()  # would raise BufferError if the ring still held a view
    seg.close()


def test_pure_ring_refused_on_weak_memory_model(seg, monkeypatch):
    from shoal.queues import _impl

    monkeypatch.setattr(_impl.platform, "machine", lambda: "aarch64")
    monkeypatch.delenv("SHOAL_UNSAFE_PURE_RINGS", raising=False)
    with pytest.raises(RuntimeError, match="C compiler"):
        Ring(seg.buf, 0, 4096, native=False)
    monkeypatch.setenv("SHOAL_UNSAFE_PURE_RINGS", "1")
    Ring(seg.buf, 0, 4096, native=False).close()
