"""tests/hpc: HPC allocations.  Modules named test_slurm_* carry the ``slurm`` marker
(excluded from the default run; ``pytest -m slurm tests/hpc`` runs them against a real
SLURM and skips them, with how to enable, without one)."""

from __future__ import annotations

import pytest


@pytest.fixture
def slurm():
    """A SLURM node is up (else skip); the test leaves no job of its own in squeue."""
    from slurm_helpers import needs_slurm, queue

    needs_slurm()
    before = set(queue())
    yield
    left = set(queue()) - before
    assert not left, f"the test left jobs in squeue: {sorted(left)}"
