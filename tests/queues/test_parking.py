"""Doorbell: parked consumers wake after a ring, on lifeline EOF, and burn no CPU idle."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest
from qhelpers import (
    finish,
    native_fixture,  # noqa: F401 (provides the `native` fixture)
    spawn_peer,
)

from shoal.queues import Doorbell, Push, RingMatrix, Segment


@pytest.fixture
def seg():
    s = Segment.create(1 << 16)
    yield s
    s.close()


def test_ring_without_sleeper_writes_nothing(seg, native):
    bell = Doorbell(seg.buf, 0, native=native)
    try:
        assert not bell.sleeping
        bell.ring()
        with pytest.raises(BlockingIOError):
            os.read(bell.fds[0], 8)
    finally:
        bell.close()


def test_park_returns_at_once_when_ready(seg, native):
    bell = Doorbell(seg.buf, 0, native=native)
    seen = []

    def ready():
        seen.append(bell.sleeping)  # the flag is set before the re-check
        return True

    try:
        assert bell.park(ready, None) == []
        assert seen == [True]
        assert not bell.sleeping
    finally:
        bell.close()


def test_park_times_out(seg, native):
    bell = Doorbell(seg.buf, 0, native=native)
    try:
        assert bell.park(lambda: False, 0.01) == []
        assert not bell.sleeping
    finally:
        bell.close()


def test_pure_park_caps_sleep(seg):
    bell = Doorbell(seg.buf, 0, native=False)
    try:
        t0 = time.monotonic()
        bell.park(lambda: False, 30.0)
        assert time.monotonic() - t0 < 10  # capped at PURE_MAX_SLEEP (generous bound)
    finally:
        bell.close()


def test_thread_wakes_parked_consumer(native):
    matrix = RingMatrix(2, 4096, native=native)
    ring, bell = matrix.ring(1, 0), matrix.doorbell(0)
    got = []

    def consumer():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            rec = ring.pop()
            if isinstance(rec, bytes):
                got.append(rec)
                return
            bell.park(ring.readable, 5.0)

    t = threading.Thread(target=consumer)
    t.start()
    deadline = time.monotonic() + 5
    while not bell.sleeping and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ring.push(b"wake up") is Push.OK
    matrix.doorbell(0).ring()
    t.join(10)
    assert not t.is_alive()
    assert got == [b"wake up"]
    matrix.close()


def test_native_ring_writes_wake_fd_when_sleeping(seg, native):
    bell = Doorbell(seg.buf, 0, native=native)
    other = Doorbell(seg.buf, 0, bell.fds, native=native)  # e.g. a producer's view
    try:
        woke = []
        t = threading.Thread(target=lambda: woke.append(bell.park(lambda: False, 5.0)))
        t.start()
        deadline = time.monotonic() + 5
        while not other.sleeping and time.monotonic() < deadline:
            time.sleep(0.001)
        other.ring()
        t.join(10)
        assert woke == [[]]
    finally:
        other.close()
        bell.close()


def test_park_reports_lifeline_eof(seg, native):
    bell = Doorbell(seg.buf, 0, native=native)
    r, w = os.pipe()
    try:
        quiet_r, quiet_w = os.pipe()
        os.close(w)  # the parent "died"
        deadline = time.monotonic() + 5
        woke = []
        while not woke and time.monotonic() < deadline:
            woke = bell.park(lambda: False, 5.0, (quiet_r, r))
        assert woke == [r]
        os.close(quiet_r)
        os.close(quiet_w)
    finally:
        os.close(r)
        bell.close()


def test_pipe_fallback(seg, native):
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    bell = Doorbell(seg.buf, 64, (r, w), owns_fds=True, native=native)
    try:
        woke = []
        t = threading.Thread(target=lambda: woke.append(bell.park(lambda: False, 5.0)))
        t.start()
        deadline = time.monotonic() + 5
        while not bell.sleeping and time.monotonic() < deadline:
            time.sleep(0.001)
        for _ in range(3):
            bell.ring()
        t.join(10)
        assert woke == [[]]
        with pytest.raises(BlockingIOError):
            os.read(r, 8)  # drained
    finally:
        bell.close()
    with pytest.raises(OSError):
        os.fstat(r)


def test_close_closes_only_owned_fds(seg, native):
    before = len(os.listdir("/proc/self/fd"))
    bell = Doorbell(seg.buf, 0, native=native)
    borrowed = Doorbell(seg.buf, 0, bell.fds, native=native)
    borrowed.close()
    os.fstat(bell.fds[0])  # still open
    bell.close()
    bell.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_bad_offset(seg, native):
    with pytest.raises(ValueError, match="offset"):
        Doorbell(seg.buf, 3, native=native)


def test_parked_child_wakes_on_push(native):
    """A child that waits for a message parks (sleeps) and wakes on push + ring."""
    with RingMatrix(2, 1 << 16, native=native) as matrix:
        child = spawn_peer(
            [json.dumps(matrix.spec()), "1", "{}", json.dumps({0: 3}), "1", "1"], matrix.fds(), native
        )
        try:
            deadline = time.monotonic() + 30
            while not matrix.doorbell(1).sleeping and time.monotonic() < deadline:
                time.sleep(0.005)
            from ring_peer import exchange

            exchange(matrix, 0, {1: 3}, {}, True, 3)
        finally:
            out = finish(child)
        assert json.loads(out)["got"] == {"0": 3}
        assert json.loads(out)["parks"] >= 1


IDLE_CHILD = """
import json, sys
from shoal.queues import EMPTY, RingMatrix
m = RingMatrix.attach(json.loads(sys.argv[1]))
ring, bell = m.ring(0, 1), m.doorbell(1)
while ring.pop() is EMPTY:
    bell.park(ring.readable, None)
m.close()
"""


def test_idle_park_uses_no_cpu(native):
    with RingMatrix(2, 4096, native=native) as matrix:
        env = dict(os.environ, SHOAL_PURE="0" if native else "1")
        proc = subprocess.Popen(
            [sys.executable, "-c", IDLE_CHILD, json.dumps(matrix.spec())], pass_fds=matrix.fds(), env=env
        )
        try:
            deadline = time.monotonic() + 30
            while not matrix.doorbell(1).sleeping and time.monotonic() < deadline:
                time.sleep(0.005)
            assert matrix.doorbell(1).sleeping
            child = psutil.Process(proc.pid)
            t0 = sum(child.cpu_times()[:2])
            time.sleep(0.5)
            used = sum(child.cpu_times()[:2]) - t0
            # native: asleep in poll (~0); pure: wakes every PURE_MAX_SLEEP (a few ms of CPU)
            assert used < 0.15, f"parked child used {used:.3f} s of CPU in 0.5 s"
            matrix.ring(0, 1).push(b"bye")
            matrix.doorbell(1).ring()
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
