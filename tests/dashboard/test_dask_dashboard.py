"""On the dask backend: the node-level view (rows per dask worker, from the node runtimes'
own stats) and a link to dask's own dashboard, with a real LocalCluster of worker processes."""

from __future__ import annotations

import pytest
from dash_tasks import get_state, nap, wait_for

import shoal

pytestmark = pytest.mark.fd_slack(12)  # dask's connection pools grow with use


@pytest.fixture(scope="module")
def cluster():
    """Started before the per-test leak check (its resource tracker lives as long as we do)."""
    distributed = pytest.importorskip("distributed")
    import logging

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as c:
        yield c


def test_dask_pilot_page_links_dask_dashboard_and_groups_workers_by_machine(cluster):
    import distributed

    with shoal.Pilot(backend="dask", cluster=cluster, workers=1, dashboard=0) as pilot:
        assert [f.result() for f in [pilot.submit(nap, 0.01, i) for i in range(20)]] == list(range(20))
        with distributed.Client(cluster, set_as_default=False) as client:
            link = client.dashboard_link
        state = wait_for(lambda: (s := get_state(pilot.dashboard_url)["pilot"])
                         and len(s["workers"]) == 2 and s)
        assert state["backend"] == "dask" and state["dask_dashboard"] == link
        assert set(state["nodes"]) == set(cluster.scheduler_info["workers"])
        assert {r["dask_worker"] for r in state["workers"]} == set(state["nodes"])
        assert all(r["pid"] > 0 for r in state["workers"])
        wait_for(lambda: get_state(pilot.dashboard_url)["pilot"]["totals"]["tasks"] >= 20)
