"""The elastic pilot's wiring without a batch system: ``JobScaler`` fed snapshots (its calls
recorded), the job watch's view of jobs asked for or given back, ``jobs=`` and the thresholds
as Pilot options.  The real proof is tests/hpc/test_slurm_elastic.py (marker slurm)."""

from __future__ import annotations

import logging

import pytest

from shoal.backends.dask.elastic import Action, Bounds
from shoal.backends.dask.jobs import DROPPED, JobPolicy, JobState, JobWatch, Replace, Seen
from shoal.backends.dask.provider import Provider, elastic_bounds
from shoal.backends.dask.scaling import JobScaler, Observation

RUN = JobState.RUNNING


class RecordingScaler(JobScaler):
    """A JobScaler whose actions are recorded instead of sent to dask-jobqueue."""

    def __init__(self, bounds):
        super().__init__(cluster=None, client=None, watch=None, bounds=bounds, start=False)
        self.calls = []

    def submit(self, jobs):
        self.calls.append(("scale", jobs))

    def drop(self, name):
        self.calls.append(("drop", name))

    def _asked(self):
        return ()


def obs(waiting=(), busy=None, jobs=None):
    jobs = jobs or {}
    return Observation(waiting=tuple(waiting), busy=busy or {}, asked=tuple(jobs), jobs=jobs)


def test_a_burst_grows_then_the_pending_job_is_cancelled_and_the_idle_one_retired(caplog):
    s = RecordingScaler(Bounds(1, 3, grow_after_s=1, idle_after_s=5))
    one = {"j1": ("11", RUN, True)}
    burst = [f"t{i}" for i in range(10)]
    assert s.step(0.0, obs(burst, {"j1": 1}, one)) == ()  # waiting, not yet for 1 s
    with caplog.at_level(logging.INFO, logger="shoal.jobs"):
        steps = s.step(1.5, obs(burst, {"j1": 1}, one))
    assert [st.action for st in steps] == [Action.SUBMIT] * 2
    assert s.calls == [("scale", 3)]  # one call: 1 asked + 2 new
    assert "submitting a job: 10 tasks waiting" in caplog.text
    three = {**one, "j2": ("12", RUN, True), "j3": ("13", JobState.PENDING, False)}
    assert s.step(3.0, obs(burst[:4], {"j1": 1, "j2": 1}, three)) == ()  # jobs pending: no more
    s.calls.clear()
    steps = s.step(4.0, obs((), {"j1": 1, "j2": 1}, three))  # the work ran out
    assert [(st.action, st.job_id) for st in steps] == [(Action.CANCEL, "j3")]
    assert s.calls == [("drop", "j3")]
    two = {k: three[k] for k in ("j1", "j2")}
    s.calls.clear()
    assert s.step(6.0, obs((), {"j1": 1}, two)) == ()  # j2's last task was seen at 4.0
    assert s.step(8.5, obs((), {"j1": 1}, two)) == ()  # 4.5 s idle < 5 s
    steps = s.step(9.5, obs((), {"j1": 1}, two))
    assert [(st.action, st.job_id) for st in steps] == [(Action.RETIRE, "j2")]
    assert s.calls == [("drop", "j2")]
    assert s.peak == 3
    assert [(d["action"], d["job_id"]) for d in s.decisions] == [
        ("submit", None), ("submit", None), ("cancel", "13"), ("retire", "12")]
    assert all(d["reason"] for d in s.decisions)


def test_a_running_job_whose_worker_has_not_connected_is_pending_not_idle():
    s = RecordingScaler(Bounds(1, 3, grow_after_s=1, idle_after_s=0))
    jobs = {"j1": ("11", RUN, True), "j2": ("12", RUN, False)}
    assert s.step(0.0, obs((), {}, jobs)) != ()
    assert s.calls == [("drop", "j2")]  # cancelled as pending (the work ran out), never "idle"
    assert s.decisions[0]["action"] == Action.CANCEL.value


def test_the_watch_does_not_replace_a_job_asked_for_and_not_launched_yet():
    """cluster.scale() put a name in worker_spec; the loop has not started its job yet."""
    pol = JobPolicy()
    pol.step(0, {"w0": "5"}, {"5": Seen("RUNNING")}, {"w0"})
    assert pol.step(1, {"w0": "5", "w1": DROPPED}, {"5": Seen("RUNNING")}, {"w0"}) == []
    assert not any(isinstance(a, Replace) for a in
                   pol.step(2, {"w0": "5", "w1": "6"}, {"5": Seen("RUNNING"),
                                                        "6": Seen("PENDING")}, {"w0"}))


class _Job:
    def __init__(self, job_id):
        self.job_id = job_id


class _Cluster:
    def __init__(self):
        self.workers = {}
        self.worker_spec = {}


class _Client:
    def scheduler_info(self):
        return {"workers": {}}


def test_jobs_being_given_back_are_neither_replaced_nor_start_failures():
    """The elastic pilot cancels pending jobs (out of worker_spec, still in workers while the
    loop closes them): squeue no longer lists them, and that is no failure to start."""
    cluster = _Cluster()
    failed = []
    watch = JobWatch(cluster, _Client(), failed.append, poll_s=3600, list_jobs=lambda: {})
    try:
        for i in range(4):
            name = f"w{i}"
            cluster.workers[name] = _Job(str(i))
            cluster.worker_spec[name] = {}
            watch.list_jobs = lambda i=i: {str(i): Seen("PENDING", "Resources")}
            watch.poll()
            del cluster.worker_spec[name]  # given back; the loop has not closed it yet
            watch.list_jobs = dict
            watch.poll()
        assert failed == [] and watch.replaced == 0
    finally:
        watch.stop()


@pytest.mark.parametrize("jobs, low, high", [((1, 8), 1, 8), ("1:8", 1, 8), ([0, 2], 0, 2)])
def test_a_range_of_jobs_is_an_elastic_pilot(jobs, low, high):
    opts = {"cores": 4, "grow_after_s": 2, "idle_after_s": 30}
    b = elastic_bounds(jobs, Provider.SLURM, opts)
    assert (b.low, b.high, b.slots_per_job, b.grow_after_s, b.idle_after_s) == (low, high, 4, 2, 30)
    assert opts == {"cores": 4}  # the thresholds are the scaler's, not dask-jobqueue's


def test_a_count_of_jobs_is_fixed_and_takes_no_thresholds():
    assert elastic_bounds(4, Provider.SLURM, {}) is None
    assert elastic_bounds("3", Provider.SLURM, {}) is None
    with pytest.raises(TypeError, match=r"idle_after_s= apply to an elastic pilot: give jobs=\(low, high\)"):
        elastic_bounds(4, Provider.SLURM, {"idle_after_s": 5})


@pytest.mark.parametrize("jobs, options, match", [
    ((1, 4), {}, "an elastic pilot needs provider='slurm'"),
    ((3, 1), {}, r"need 0 <= low <= high"),
    ("1-8", {}, "give a count"),
])
def test_bad_elastic_requests_name_the_culprit(jobs, options, match):
    provider = Provider.PBS if "provider" in match else Provider.SLURM
    with pytest.raises(ValueError, match=match):
        elastic_bounds(jobs, provider, options)


def test_a_negative_threshold_is_refused():
    with pytest.raises(ValueError, match="grow_after_s must be a number of seconds >= 0"):
        elastic_bounds((1, 2), Provider.SLURM, {"grow_after_s": -1})


def _run_args(*argv):
    import argparse

    from shoal.patterns.ensemble.resource_args import add_resource_arguments

    parser = argparse.ArgumentParser()
    parser.add_argument("workflow")
    parser.add_argument("--walltime")
    parser.add_argument("--dask", action="store_true")
    add_resource_arguments(parser)
    return parser.parse_args(["wf.py", *argv])


def test_shoal_run_slurm_jobs_low_high_asks_for_an_elastic_pilot():
    from shoal.patterns.ensemble.resource_args import resource_from_args

    args = _run_args("--slurm", "--jobs", "1:8", "--cores", "4")
    resource, _ = resource_from_args(args)
    assert resource.nodes == (1, 8)
    assert resource.pilot_options()["jobs"] == (1, 8)
    assert ("--jobs", "1:8") in args.extra_resume  # the resume hint repeats it
    resource, _ = resource_from_args(_run_args("--slurm", "--jobs", "3"))
    assert resource.nodes == 3


def test_jobs_and_nodes_together_or_a_bad_range_are_one_clear_error():
    from shoal.patterns.ensemble.model import EnsembleError
    from shoal.patterns.ensemble.resource import Resource
    from shoal.patterns.ensemble.resource_args import resource_from_args

    with pytest.raises(EnsembleError, match="--nodes and --jobs both give the batch jobs"):
        resource_from_args(_run_args("--slurm", "--jobs", "1:8", "--nodes", "2"))
    with pytest.raises(EnsembleError, match="nodes must be an integer >= 1 or a range 'low:high'"):
        Resource.of({"jobs": "8:1"})
    assert Resource.of({"jobs": [1, 4], "options": {"idle_after_s": 30}}).pilot_options()[
        "idle_after_s"] == 30


def test_the_job_notes_reach_the_journal_shoal_status_and_the_journal_dashboard(tmp_path):
    """What the engine does for a dask pilot: JobLog hears the "shoal.jobs" logger (INFO too,
    while attached), the notes are merged into the journal's meta, and shoal status's table
    and the journal page's state show them; detached, the logger is as it was."""
    from shoal.dashboard.journal import journal_state
    from shoal.patterns.ensemble import pilot_jobs
    from shoal.patterns.ensemble.journal import Journal
    from shoal.patterns.ensemble.status import RunStatus

    logger = logging.getLogger("shoal.jobs")
    level = logger.level
    heard = pilot_jobs.JobLog().attach()
    try:
        logger.info("elastic pilot: submitting a job: 3 tasks waiting, the oldest for 12 s")
        logger.debug("not kept")
    finally:
        heard.detach()
    logger.info("after detach: not kept")
    assert logger.level == level and heard not in logger.handlers
    path = str(tmp_path / "j.db")
    journal = Journal(path)
    try:
        for _ in range(2):  # two engine ticks: appended, not replaced
            events = heard.take() or [{"t": 1.0, "level": "INFO", "text": "SLURM job 7: PENDING -> RUNNING"}]
            journal.set_meta(pilot_jobs.JOURNAL_KEY,
                             pilot_jobs.merged(journal.meta(pilot_jobs.JOURNAL_KEY), events))
        journal.commit()
    finally:
        journal.close()
    st = RunStatus.load(path)
    assert [e["text"] for e in st.job_events] == [
        "elastic pilot: submitting a job: 3 tasks waiting, the oldest for 12 s",
        "SLURM job 7: PENDING -> RUNNING"]
    assert "elastic pilot: submitting a job: 3 tasks waiting" in st.table()
    page = journal_state(path)["job_events"]
    assert page[0]["text"] == "SLURM job 7: PENDING -> RUNNING"  # newest first


def test_a_damaged_job_notes_entry_reads_as_none():
    from shoal.patterns.ensemble import pilot_jobs

    assert pilot_jobs.read("{not json") == ()
    assert pilot_jobs.read('[{"text": 3}, {"t": 1, "text": "ok"}]') == ({"t": 1, "text": "ok"},)
    assert pilot_jobs.merged("{not json", [{"text": "a"}]) == '[{"text": "a"}]'


def test_shoal_run_threshold_flags_reach_the_pilot_and_need_a_range():
    from shoal.patterns.ensemble.model import EnsembleError
    from shoal.patterns.ensemble.resource_args import resource_from_args

    args = _run_args("--slurm", "--jobs", "1:4", "--grow-after", "2", "--idle-after", "30")
    resource, _ = resource_from_args(args)
    kw = resource.pilot_options()
    assert (kw["jobs"], kw["grow_after_s"], kw["idle_after_s"]) == ((1, 4), 2.0, 30.0)
    assert ("--grow-after", 2.0) in args.extra_resume
    with pytest.raises(EnsembleError, match="--idle-after apply to an elastic pilot: add --jobs LOW:HIGH"):
        resource_from_args(_run_args("--slurm", "--nodes", "2", "--idle-after", "30"))


def test_giving_back_a_job_never_hangs_on_a_scheduler_that_does_not_answer(monkeypatch, caplog):
    """``drop`` retires the job's worker through the scheduler before closing the job; a
    scheduler that never answers the retire must not stall the scaler's thread forever."""
    import asyncio

    from shoal.backends.dask import scaling

    class SilentScheduler:
        async def retire_workers(self, names):
            await asyncio.Event().wait()  # no answer, ever

    class Cluster:
        def __init__(self):
            self.worker_spec = {"job-1": {}, "job-2": {}}
            self.scheduler_comm = SilentScheduler()
            self.corrected = False

        async def _correct_state(self):
            self.corrected = True

    monkeypatch.setattr(scaling, "RETIRE_TIMEOUT_S", 0.05)
    cluster = Cluster()
    scaler = JobScaler(cluster=cluster, client=None, watch=None, bounds=Bounds(1, 3), start=False)
    with caplog.at_level(logging.WARNING, "shoal.jobs"):
        asyncio.run(scaler._drop("job-1"))
    assert cluster.corrected and list(cluster.worker_spec) == ["job-2"]
    assert "got no answer" in caplog.text
