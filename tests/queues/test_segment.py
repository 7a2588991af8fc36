"""Segment: anonymous (memfd) shared memory that leaves nothing in /dev/shm."""
from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys

import pytest

from shoal.queues import Segment


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def test_create_is_zeroed_page_rounded_and_writable():
    with Segment.create(100) as seg:
        assert seg.size == mmap.PAGESIZE
        assert len(seg.buf) == seg.size
        assert bytes(seg.buf) == bytes(seg.size)
        seg.buf[10:13] = b"abc"
        assert bytes(seg.buf[10:13]) == b"abc"


def test_fd_is_anonymous_and_close_on_exec():
    with Segment.create(1 << 16) as seg:
        target = os.readlink(f"/proc/self/fd/{seg.fd}")
        assert target.startswith("/memfd:shoal") or "(deleted)" in target
        assert not os.get_inheritable(seg.fd)


@pytest.mark.parametrize("size", [0, -1, 1.5, "4096"])
def test_bad_size(size):
    with pytest.raises(ValueError, match="size"):
        Segment.create(size)


def test_attach_in_child_shares_memory():
    with Segment.create(1 << 16) as seg:
        code = (
            "import sys; from shoal.queues import Segment\n"
            "s = Segment.attach(int(sys.argv[1]), int(sys.argv[2]))\n"
            "assert bytes(s.buf[0:5]) == b'hello'\n"
            "s.buf[100:105] = b'world'\n"
            "s.close()\n"
        )
        seg.buf[0:5] = b"hello"
        subprocess.run(
            [sys.executable, "-c", code, str(seg.fd), str(seg.size)], pass_fds=[seg.fd], check=True, timeout=60
        )
        assert bytes(seg.buf[100:105]) == b"world"


def test_attach_checks_size():
    with Segment.create(4096) as seg:
        fd = os.dup(seg.fd)
        try:
            with pytest.raises(ValueError, match="size=8192"):
                Segment.attach(fd, 8192)
        finally:
            os.close(fd)
        other = Segment.attach(os.dup(seg.fd), 4096)
        other.buf[0] = 7
        assert seg.buf[0] == 7
        other.close()


def test_close_is_idempotent_and_closes_fds():
    before = _fd_count()
    seg = Segment.create(1 << 16)
    assert _fd_count() > before
    seg.close()
    seg.close()
    assert seg.closed
    assert _fd_count() == before


def test_close_tolerates_live_views():
    before = _fd_count()
    seg = Segment.create(1 << 16)
    part = seg.buf[8:16]
    words = seg.buf[:64].cast("Q")
    seg.close()  # must not raise BufferError
    part[0] = 1  # still mapped: the views keep the mapping alive
    assert words[1] == 1
    del part, words
    assert _fd_count() <= before + 1  # the mmap's own dup goes with the last view


def test_nothing_in_dev_shm_even_after_sigkill():
    before = _shm()
    segs = [Segment.create(1 << 20) for _ in range(4)]
    assert _shm() == before
    code = (
        "import os, signal, sys; from shoal.queues import Segment\n"
        "s = Segment.create(1 << 20); s.buf[0] = 1\n"
        "print('ready', flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "ready" in proc.stdout
    for seg in segs:
        seg.close()
    assert _shm() == before
