"""Helpers for the tests that run against a real SLURM (marker ``slurm``).

``scripts/slurm-local up`` (root) starts a one-node SLURM on this machine; .ci/run
does it before ``pytest -m slurm``.  Without one the tests skip with that hint."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HINT = ("no SLURM is up here: run `sudo scripts/slurm-local up` (installs slurm-wlm and munge "
        "and starts a one-node SLURM), then `python -m pytest -m slurm tests/hpc`")


@functools.cache
def slurm_state() -> str | None:
    """The first node's state from sinfo, or None when SLURM is absent or not answering
    (asked once per session: an installed SLURM whose controller is down answers slowly)."""
    if shutil.which("sinfo") is None:
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                             timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None


def needs_slurm():
    """Skip (with how to enable) unless a SLURM node is up and usable."""
    state = slurm_state()
    if state not in ("idle", "mixed", "allocated", "completing"):
        pytest.skip(HINT + (f" (sinfo says the node is {state})" if state else ""))


def queue() -> list[str]:
    """Job ids squeue lists now (every user)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return out.stdout.split()


def wait_for(cond, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def shoal_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "shoal", *args]


@pytest.fixture
def slurm():
    """A SLURM node is up (else skip); the test leaves no job of its own in squeue.
    (A fixture here, imported by the test modules: a tests/hpc/conftest.py would shadow
    tests/conftest.py for ``from conftest import ...`` elsewhere.)"""
    needs_slurm()
    before = set(queue())
    yield
    left = set(queue()) - before
    assert not left, f"the test left jobs in squeue: {sorted(left)}"


@pytest.fixture
def tasks_importable(monkeypatch):
    """sbatch passes the environment on: the dask workers in the jobs import tasks_hpc."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


class LogLines:
    """``with LogLines("shoal.jobs") as log: ...; log.text``: what a logger said at WARNING
    and above (works with ``-p no:logging``, unlike caplog)."""

    def __init__(self, name: str):
        import logging

        self.logger = logging.getLogger(name)
        self.lines: list[str] = []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = lambda record: self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def __enter__(self):
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
