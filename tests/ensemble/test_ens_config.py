"""EngineConfig (config.py): every setting of a run checked once, with a one-line error naming
the keyword, before anything opens; the entry points build one; the launch is chosen once.

Unit tests of pure policy (the config, the launch's choice and its protocol); the runs
themselves are tested end to end in the other tests of this folder."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import shoal
from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run
from shoal.patterns.ensemble import launch
from shoal.patterns.ensemble.config import Durability, EngineConfig
from shoal.patterns.ensemble.mpi import LauncherKind
from shoal.patterns.ensemble.values import Values


@pytest.mark.parametrize(
    "settings, culprit",
    [
        ({"workers": 0}, "workers"),
        ({"workers": True}, "workers"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": 1.5}, "gpus"),
        ({"retries": -1}, "retries"),
        ({"retries": True}, "retries"),
        ({"retry_delay": -2}, "retry_delay"),
        ({"retry_delay": "soon"}, "retry_delay"),
        ({"retry_failed": True}, "retry_failed"),
        ({"new": True, "resume": True}, "new=True"),
        ({"memory": "lots"}, "memory"),
        ({"memory": -1}, "memory"),
        ({"walltime": "soon"}, "soon"),
        ({"durability": "sometimes"}, "durability"),
        ({"progress": 3}, "progress"),
        ({"values": "json"}, "values"),
        ({"launcher": "qsub"}, "launcher"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(settings, culprit):
    with pytest.raises(EnsembleError) as info:
        EngineConfig(**settings)
    message = str(info.value)
    assert culprit in message and "\n" not in message


def test_values_are_normalised_once():
    config = EngineConfig(walltime="2h", memory="1G", durability="full", values="pickle",
                          launcher="none", shared_data=["a", "b > c"])
    assert config.walltime == 7200.0
    assert config.memory == 1 << 30
    assert config.durability is Durability.FULL
    assert config.values is Values.PICKLE
    assert config.launcher is LauncherKind.NONE
    assert config.shared_data == ("a", "b > c")
    assert dataclasses.replace(config, walltime=60).walltime == 60.0  # checked again
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.walltime = 1


def test_shoal_resume_makes_a_run_a_resume(monkeypatch):
    monkeypatch.setenv("SHOAL_RESUME", "1")
    config = EngineConfig.for_run(new=True)
    assert config.resume and not config.new
    monkeypatch.setenv("SHOAL_RESUME", "0")
    assert not EngineConfig.for_run().resume


def test_run_keeps_its_keywords_and_every_one_reaches_the_config():
    """run()'s public keywords (a contract) are the config's fields plus what is not
    configuration: the workflow, the pilot and the batch allocation."""
    params = set(inspect.signature(run).parameters)
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert params - fields == {"workflow", "pilot", "resource"}
    assert fields - params == {"max_pipelines"}  # the engine's own bound, not a keyword


def test_a_bad_setting_is_refused_before_a_pilot_or_journal_opens(tmp_path):
    wf = Pipeline([Stage([Task(executable="/bin/true")])])
    with pytest.raises(EnsembleError, match="durability="):
        run(wf, journal=str(tmp_path / "x.db"), durability="never",
            resource={"backend": "slurm", "cores": 1})  # refused before asking for an allocation
    assert not (tmp_path / "x.db").exists()


class DaskPilot:  # what choose and DaskLaunch read of a pilot
    backend = shoal.BackendKind.DASK
    workers = 3


def test_both_launches_implement_the_protocol():
    members = {name for name in vars(launch.Launch) if not name.startswith("_")}
    members |= set(launch.Launch.__annotations__)
    assert {"start", "request", "refusal", "future_outcome", "kind"} <= members
    for impl in (launch.LocalLaunch(None, None, None, None, lambda: None),
                 launch.DaskLaunch(DaskPilot(), None, None)):
        assert {m for m in members if not hasattr(impl, m)} == set(), type(impl).__name__


def test_the_launch_is_chosen_from_the_pilot():
    config = EngineConfig()
    local = launch.choose(None, None, None, config, wake=lambda: None)
    assert local.kind is launch.LaunchKind.LOCAL
    dask = launch.choose(DaskPilot(), None, None, config, wake=lambda: None)
    assert dask.kind is launch.LaunchKind.DASK
    assert dask.slots(config) == [0, 1, 2]
    assert dask.memory_total(config) == 0  # not tracked on dask unless given
    mpi_task = Task(executable="/bin/true", ranks=2)
    assert "dask pilot does not start ranks" in dask.refusal(mpi_task, None)
