"""The public surface is small and deliberate: changing it must change this test."""

from __future__ import annotations

import concurrent.futures as cf
import inspect

import shoal

EXPECTED = {
    "Pilot", "Future", "spawn", "current_worker", "WorkerInfo", "topology", "Topology",
    "NumaNode", "BackendKind", "SharedArray", "BestCell", "Channel", "Sense", "ShoalError",
    "TopologyError", "PilotClosed", "TaskTimeout", "WorkerLost", "SerializationError",
    "RemoteTraceback", "BackendUnavailable", "publish",
}


def test_all_is_the_contract():
    assert set(shoal.__all__) == EXPECTED
    for name in EXPECTED:
        assert hasattr(shoal, name), name


def test_contract_shapes():
    assert issubclass(shoal.Future, cf.Future)
    params = inspect.signature(shoal.Pilot.submit).parameters
    assert {"retries", "timeout"} <= set(params)
    params = inspect.signature(shoal.Pilot.map).parameters
    assert {"ordered", "chunksize"} <= set(params)
    assert {"cancel_pending"} <= set(inspect.signature(shoal.Pilot.close).parameters)
    assert "dashboard" in inspect.signature(shoal.Pilot.__init__).parameters
    assert hasattr(shoal.Pilot, "dashboard_url")
    for err in (shoal.PilotClosed, shoal.TaskTimeout, shoal.WorkerLost, shoal.SerializationError,
                shoal.TopologyError):
        assert issubclass(err, shoal.ShoalError)
    assert shoal.current_worker() is None
