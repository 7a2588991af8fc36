"""The local pilot's own promises, beyond the executor conformance suite.

What every backend promises (submit, map, graphs, spawn, cancel, retries, timeouts, worker
deaths, close/shutdown, stats keys, shared objects) is tested once, on the local backend and
on two kinds of dask cluster, in tests/conformance/test_executor_conformance.py.  Here: what
only the local backend has.
"""

from __future__ import annotations

import pytest
import rt_tasks as t

import shoal


@pytest.fixture(scope="module")
def pilot():
    with shoal.Pilot(workers=2) as p:
        yield p


def test_stats_name_local_workers_by_cpu_and_node(pilot):
    pilot.submit(t.inc, 1).result(30)
    stats = pilot.stats()
    assert stats["backend"] == "local"
    assert [w["worker"] for w in stats["workers"]] == [1, 2]
    for w in stats["workers"]:
        assert "cpu" in w and "node" in w and "generation" in w


def test_worker_ids_are_the_local_worker_numbers(pilot):
    ids = {pilot.submit(t.where).result(30).id for _ in range(20)}
    assert ids <= {1, 2}
