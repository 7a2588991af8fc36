"""RingMatrix: layout, attach from a child via pass_fds, status cells, ownership."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import msgpack
import pytest
from qhelpers import native_fixture  # noqa: F401 (provides the `native` fixture)

from shoal.queues import Push, Ring, RingMatrix, Segment


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_layout_rings_disjoint_and_sized(native):
    n = 4
    with RingMatrix(n, 1 << 14, 1 << 12, native=native) as m:
        spans = []
        for src in range(n):
            for dst in range(n):
                if src == dst:
                    continue
                ring = m.ring(src, dst)
                assert ring is m.ring(src, dst)
                expect = 1 << 14 if 0 in (src, dst) else 1 << 12
                assert ring.capacity == expect
                spans.append((ring.offset, ring.offset + Ring.footprint(ring.capacity)))
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert spans[-1][1] <= m.segment.size
        assert m.segment.size >= RingMatrix.layout_size(n, 1 << 14, 1 << 12)
        # rings are independent
        m.ring(1, 2).push(b"a")
        m.ring(2, 1).push(b"b")
        assert m.ring(1, 2).pop() == b"a" and m.ring(2, 1).pop() == b"b"
        assert not any(m.ring(s, d).readable() for s in range(n) for d in range(n) if s != d)


def test_bad_arguments(native):
    with pytest.raises(ValueError, match="n_endpoints"):
        RingMatrix(0)
    with pytest.raises(ValueError, match="capacity"):
        RingMatrix(2, 5000)
    with pytest.raises(ValueError, match="capacity"):
        RingMatrix(3, 4096, 100)
    with RingMatrix(3, 4096, 4096, native=native) as m:
        with pytest.raises(ValueError, match="src=1 to dst=1"):
            m.ring(1, 1)
        with pytest.raises(ValueError, match="dst=3"):
            m.ring(0, 3)
        with pytest.raises(ValueError, match="ep=3"):
            m.doorbell(3)
        with pytest.raises(ValueError, match="ep=-1"):
            m.status(-1)


def test_single_endpoint():
    with RingMatrix(1) as m:
        assert m.n == 1
        assert len(m.fds()) == 2  # segment + one doorbell


def test_status_cells(native):
    with RingMatrix(3, 4096, 4096, native=native) as m:
        cells = [m.status(ep) for ep in range(3)]
        assert all(c.format == "Q" and len(c) == RingMatrix.STATUS_WORDS for c in cells)
        cells[1][0] = 42
        cells[1][7] = (1 << 64) - 1
        assert m.status(1).tolist() == [42, 0, 0, 0, 0, 0, 0, (1 << 64) - 1]
        assert m.status(0).tolist() == [0] * 8 and m.status(2).tolist() == [0] * 8


def test_spec_is_serialisable_and_fds_listed(native):
    with RingMatrix(3, 4096, 4096, native=native) as m:
        spec = m.spec()
        assert json.loads(json.dumps(spec)) == spec
        assert msgpack.unpackb(msgpack.packb(spec), strict_map_key=False) == spec
        fds = m.fds()
        assert spec["segment_fd"] == fds[0]
        assert [fd for bell in spec["doorbell_fds"] for fd in bell] == fds[1:]
        assert spec["size"] == m.segment.size


def test_attach_with_fd_map(native):
    with RingMatrix(3, 4096, 4096, native=native) as m:
        fd_map = {fd: os.dup(fd) for fd in m.fds()}
        other = RingMatrix.attach(m.spec(), fd_map, native=native)
        try:
            assert other.ring(0, 2).push(b"hi") is Push.OK
            other.doorbell(2).ring()
            assert m.ring(0, 2).pop() == b"hi"
            m.status(2)[3] = 9
            assert other.status(2)[3] == 9
        finally:
            other.close()
        for fd in fd_map.values():  # the attached matrix owned and closed its copies
            with pytest.raises(OSError):
                os.fstat(fd)


def test_attach_rejects_mismatched_layout():
    with RingMatrix(2, 4096) as m:
        spec = dict(m.spec(), capacity=8192)
        fd_map = {fd: os.dup(fd) for fd in m.fds()}
        try:
            with pytest.raises(ValueError):
                RingMatrix.attach(spec, fd_map)
        finally:
            for fd in fd_map.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
        with pytest.raises(ValueError, match="version"):
            RingMatrix.attach(dict(m.spec(), version=99))


def test_constructor_with_segment_takes_ownership(native):
    before = _fd_count()
    with RingMatrix(2, 4096, 4096, native=native) as m:
        seg = Segment.attach(os.dup(m.segment.fd), m.segment.size)
        bells = [tuple(os.dup(fd) for fd in m.doorbell(ep).fds) for ep in range(2)]
        other = RingMatrix(2, 4096, 4096, segment=seg, doorbell_fds=bells, native=native)
        other.ring(1, 0).push(b"x")
        assert m.ring(1, 0).pop() == b"x"
        other.close()
        with pytest.raises(ValueError, match="layout"):  # header says 4096, not 8192
            RingMatrix(2, 8192, 4096, segment=Segment.attach(os.dup(m.segment.fd), m.segment.size),
                       doorbell_fds=[tuple(os.dup(fd) for fd in m.doorbell(ep).fds) for ep in range(2)])
    assert _fd_count() == before


def test_close_releases_everything(native):
    before = _fd_count()
    m = RingMatrix(4, 4096, 4096, native=native)
    for src in range(4):
        for dst in range(4):
            if src != dst:
                m.ring(src, dst).push(b"x")
    m.status(2)[0] = 1
    m.doorbell(1).ring()
    m.close()
    m.close()
    assert _fd_count() == before
    with pytest.raises(ValueError, match="closed"):
        m.ring(0, 1)


def test_close_with_user_held_views():
    before = _fd_count()
    m = RingMatrix(2, 4096)
    view = m.segment.buf[0:8]
    m.close()  # no BufferError
    del view
    assert _fd_count() == before


CHILD = """
import json, sys
from shoal.queues import EMPTY, RingMatrix
m = RingMatrix.attach(json.loads(sys.argv[1]))
me = int(sys.argv[2])
m.status(me)[0] = 1000 + me
inbox, bell = m.ring(0, me), m.doorbell(me)
while (msg := inbox.pop()) is EMPTY:
    bell.park(inbox.readable, 1.0)
m.ring(me, 0).push(msg + b" from %d" % me)
m.doorbell(0).ring()
m.close()
"""


def test_children_attach_via_pass_fds(native):
    env = dict(os.environ, SHOAL_PURE="0" if native else "1")
    with RingMatrix(3, 4096, 4096, native=native) as m:
        procs = [
            subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(m.spec()), str(ep)], pass_fds=m.fds(), env=env)
            for ep in (1, 2)
        ]
        try:
            for ep in (1, 2):
                m.ring(0, ep).push(b"ping")
                m.doorbell(ep).ring()
            for ep, proc in zip((1, 2), procs, strict=True):
                assert proc.wait(60) == 0
                assert m.ring(ep, 0).pop() == b"ping from %d" % ep
                assert m.status(ep)[0] == 1000 + ep
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
