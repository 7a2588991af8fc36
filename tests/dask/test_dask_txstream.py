"""Transactional streams on the dask backend: every app and scheduler equals the serial oracle
on a pilot over a real dask cluster (LocalCluster by default; a command-line scheduler and
workers with -m txstream_heavy).  The store and batch state are SharedArrays of the driver's
machine, mapped by the dask workers' shoal node runtimes."""

from __future__ import annotations

import os
import sys

import pytest
from dask_cluster import clusters, pilot  # noqa: F401 - fixtures

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "txstream"))
from txs_helpers import FIXED, assert_same, run  # noqa: E402

from shoal.workloads.txstream.apps import APPS  # noqa: E402

# dask's LocalCluster scheduler runs in this process and unpickles task arguments: each
# SharedArray a task carries (store, batch state, inbox: 3 or more per run, 5 runs a test) is mapped
# here too and kept in shoal's attachment cache (bounded: 64 arrays, 2 fds each).
pytestmark = pytest.mark.fd_slack(80)


@pytest.fixture(scope="module", params=["dask-localcluster",
                                        pytest.param("dask-cli", marks=pytest.mark.txstream_heavy)])
def kind(request, clusters):
    clusters.warm(request.param)
    return request.param


@pytest.mark.parametrize("name", sorted(APPS))
def test_dask_schedulers_equal_serial(pilot, name):
    assert pilot.workers >= 1
    app = APPS[name]
    evs = app.events(150, 24, theta=1.0, abort=0.2, seed=21)
    ref = run(app.tables(24), evs, "serial")
    for sched in ["adaptive", "2pl", "partitioned", FIXED[0], FIXED[4]]:
        got = run(app.tables(24), evs, sched, pilot, punctuation=50)
        assert_same(got, ref, f"{name} {sched} on dask ({pilot.workers} workers)")
