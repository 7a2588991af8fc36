"""The public surface of shoal.queues, and the SHOAL_PURE switch."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from qhelpers import native_fixture  # noqa: F401 (provides the `native` fixture)

import shoal.queues as queues
from shoal.queues import Ring, Segment


def test_public_names():
    assert set(queues.__all__) == {"Ring", "Segment", "Doorbell", "RingMatrix", "Push", "Empty", "EMPTY", "NATIVE"}
    for name in queues.__all__:
        assert hasattr(queues, name)
    assert isinstance(queues.NATIVE, bool)
    assert queues.EMPTY is queues.Empty.EMPTY
    assert [p.name for p in queues.Push] == ["OK", "FULL"]


@pytest.mark.parametrize("value, expect", [("1", False), ("0", None)])
def test_shoal_pure_env(value, expect):
    env = dict(os.environ, SHOAL_PURE=value)
    code = "import shoal.queues as q; print(q.NATIVE, q.RingMatrix(2, 4096).ring(0, 1).native)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    native = queues._impl.NATIVE_AVAILABLE if expect is None else expect
    assert out.stdout.split() == [str(native), str(native)]


def test_native_unavailable_is_explained(monkeypatch):
    monkeypatch.setattr(queues._impl, "_native", None)
    with Segment.create(1 << 16) as seg:
        with pytest.raises(RuntimeError, match="not built"):
            Ring(seg.buf, 0, 4096, native=True)


def test_use_after_close_raises(native):
    with Segment.create(1 << 16) as seg:
        ring = Ring.initialise(seg.buf, 0, 4096, native=native)
        ring.close()
        for op in (ring.pop, ring.readable, ring.used_bytes, ring.pop_many):
            with pytest.raises(ValueError, match="released"):
                op()
        with pytest.raises(ValueError, match="released"):
            ring.push(b"x")
