"""Helpers for the queue tests: implementations to parametrize over, peer processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shoal.queues import _impl

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "ring_peer.py")

IMPLS = [
    pytest.param(False, id="pure"),
    pytest.param(
        True,
        id="native",
        marks=pytest.mark.skipif(not _impl.NATIVE_AVAILABLE, reason="shoal.queues._native not built"),
    ),
]


def stress_scale() -> float:
    return float(os.environ.get("SHOAL_STRESS_SCALE", "1"))


def spawn_peer(args: list[str], pass_fds, native: bool) -> subprocess.Popen:
    """Start tests/queues/ring_peer.py with the given fds inherited."""
    env = dict(os.environ)
    env["SHOAL_PURE"] = "0" if native else "1"
    return subprocess.Popen(
        [sys.executable, PEER, *args],
        pass_fds=list(pass_fds),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    """Wait for a peer; fail the test with its stderr if it failed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"peer timed out; stderr:\n{err}") from None
    assert proc.returncode == 0, f"peer exited {proc.returncode}; stderr:\n{err}"
    return out


@pytest.fixture(params=IMPLS, name="native")
def native_fixture(request) -> bool:
    """True for the C helper, False for the pure-Python fallback.

    A fixture defined here (not in a conftest.py, whose module name ``conftest``
    would shadow tests/conftest.py for other test packages' imports); test
    modules import it as ``native_fixture`` (the fixture is named ``native``).
    """
    return request.param
