"""Fixtures shared by the dask attack modules (test_contract_dask.py, test_contract_cells.py)."""

from __future__ import annotations

import pytest
from dask_cluster import local_cluster


@pytest.fixture(scope="module")
def cluster():
    """A LocalCluster of two dask worker processes for the module.  Multiprocessing's
    resource tracker, which a LocalCluster starts, is started first: module fixtures are
    set up before the per-test leak check looks, so it never counts as a leak."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    c = local_cluster(2)
    yield c
    c.close()
