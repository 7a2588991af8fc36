"""The public surface is small and deliberate: changing it must change this test."""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import pickle

import shoal

EXPECTED = {
    "Pilot", "Future", "spawn", "current_worker", "WorkerInfo", "topology", "Topology",
    "NumaNode", "BackendKind", "SharedArray", "BestCell", "Channel", "Sense", "ShoalError",
    "TopologyError", "PilotClosed", "TaskTimeout", "WorkerLost", "SerializationError",
    "RemoteTraceback", "BackendUnavailable", "allocation", "Allocation", "BrokenPilot",
    "PicklingError", "UnpicklingError", "publish", "Backoff", "cached",
}


def test_all_is_the_contract():
    assert set(shoal.__all__) == EXPECTED
    for name in EXPECTED:
        assert hasattr(shoal, name), name


def test_contract_shapes():
    assert issubclass(shoal.Future, cf.Future)
    assert issubclass(shoal.Pilot, cf.Executor)
    params = inspect.signature(shoal.Pilot.submit).parameters
    assert [p.kind for p in params.values()] == [inspect.Parameter.POSITIONAL_ONLY] * 2 + [
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]  # every keyword is fn's
    assert {"retries", "timeout"} <= set(inspect.signature(shoal.Pilot.options).parameters)
    params = inspect.signature(shoal.Pilot.map).parameters
    assert {"ordered", "chunksize", "timeout", "window_bytes"} <= set(params)
    assert {"cancel_futures", "wait"} <= set(inspect.signature(shoal.Pilot.shutdown).parameters)
    assert {"max_workers", "initializer", "initargs", "max_tasks_per_child"} <= set(
        inspect.signature(shoal.Pilot).parameters)
    assert issubclass(shoal.WorkerLost, cf.BrokenExecutor) and issubclass(shoal.BrokenPilot, cf.BrokenExecutor)
    assert issubclass(shoal.PicklingError, pickle.PicklingError)
    assert issubclass(shoal.UnpicklingError, pickle.UnpicklingError)
    assert {"cancel_pending"} <= set(inspect.signature(shoal.Pilot.close).parameters)
    assert "dashboard" in inspect.signature(shoal.Pilot.__init__).parameters
    assert hasattr(shoal.Pilot, "dashboard_url")
    for err in (shoal.PilotClosed, shoal.TaskTimeout, shoal.WorkerLost, shoal.SerializationError,
                shoal.TopologyError):
        assert issubclass(err, shoal.ShoalError)
    assert shoal.current_worker() is None
