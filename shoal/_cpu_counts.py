"""SLURM's run-length CPU counts, for every part of shoal that reads them (leaf module: stdlib only).

``SLURM_JOB_CPUS_PER_NODE`` (and ``SLURM_TASKS_PER_NODE``) write one count per node in a
run-length form: ``"2(x3),1"`` is 2, 2, 2, 1.  The ensemble's node placement
(``shoal.patterns.ensemble.nodes``) and the dask backend's pilot over a job's nodes
(``shoal.backends.dask.job_nodes``) both size nodes from it, and neither layer may import
the other, so the parser lives here.
"""

from __future__ import annotations

import re


def expand_counts(text: str) -> list[int]:
    """SLURM's ``SLURM_JOB_CPUS_PER_NODE`` form: ``"2(x3),1"`` -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if m is None:
            raise ValueError(f"malformed SLURM CPU count list {text!r}")
        out += [int(m[1])] * int(m[2] or 1)
    return out
