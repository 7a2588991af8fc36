"""Checkpointed searches on the dask backend: the driver (a client of a command-line
cluster: `dask scheduler` + two `dask worker` processes) is SIGKILLed mid-search, and the
same call from a new driver resumes to exactly the uninterrupted result.  The cluster
outlives the killed driver, as a real one would; what the dead driver's chunks were doing
is simply explored again (tests/patterns/test_search_checkpoint.py has the local ones)."""

from __future__ import annotations

import os
import sys

import pytest
from dask_cluster import ROOT, CliCluster

sys.path.insert(0, os.path.join(ROOT, "tests", "patterns"))
from checkpoint_kill import kill_and_resume  # noqa: E402

from shoal.workloads.nqueens import OEIS_A000170  # noqa: E402

pytestmark = [pytest.mark.fd_slack(8), pytest.mark.no_leak_check]


@pytest.fixture(scope="module")
def cluster():
    """A CLI cluster whose workers import the examples and the test apps by name."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests", "patterns"),
                    old] if p)
    try:
        c = CliCluster(2)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    yield c
    c.close()


def test_sigkill_resume_nqueens_dask(tmp_path, cluster):
    res = kill_and_resume(tmp_path, "queens", 12, cluster.address)
    assert res["value"] == OEIS_A000170[12]


@pytest.mark.slow
def test_sigkill_resume_bigger_dask(tmp_path, cluster):
    res = kill_and_resume(tmp_path, "queens", 13, cluster.address, saves=20)
    assert res["value"] == OEIS_A000170[13]


@pytest.mark.slow
def test_sigkill_resume_max_clique_dask(tmp_path, cluster):
    from checkpoint_driver import graph, mc

    import shoal

    res = kill_and_resume(tmp_path, "clique", 140, cluster.address, saves=10)
    with shoal.Pilot(2) as pilot:  # the reference: the engine, uninterrupted, locally
        r = mc.max_clique(pilot, graph(140), ordered=True)
    assert (res["value"], res["path"], res["clique"]) == (r.value, list(r.path), r.node.clique)
    hit = kill_and_resume(tmp_path, "find", 140, cluster.address, extra=[r.value], saves=5)
    assert hit["value"] == r.value
