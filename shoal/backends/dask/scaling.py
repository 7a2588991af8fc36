"""The elastic pilot's I/O: read a snapshot, ask ``elastic.decide``, carry out its steps.

``Pilot(backend="dask", provider="slurm", jobs=(1, 8), cores=..., memory=...)`` keeps between
1 and 8 batch jobs; ``JobScaler`` is the thread that moves the count::

    JobScaler thread, every poll_s:
      scheduler (run_on_scheduler(on_scheduler.load)): keys of tasks that wait for a dask
          worker, tasks processing per dask worker (= per batch job, by its name)
      cluster.worker_spec (the jobs asked for) + JobWatch.snapshot() (their SLURM states)
         │  Observation ──► ScalerState.view(now, ...) ──► elastic.View
         ▼  elastic.decide(view, bounds)  (pure: docs/hpc.md "Elastic pilots")
      SUBMIT  ──► cluster.scale(jobs=asked + n)         (dask-jobqueue runs sbatch)
      CANCEL  ──► drop the pending job from worker_spec; dask-jobqueue's job close runs scancel
      RETIRE  ──► drop the idle job from worker_spec; the cluster retires its dask worker,
                  then cancels its job
      every step ──► log INFO (logger "shoal.jobs", the job watch's) with its reason, and ``decisions`` (the
                     pilot's stats()["driver"]["elastic"], which the dashboard's state carries)

Explicit state (``ScalerState``): since when each waiting task has been seen waiting (its
age, to within one ``poll_s``), and since when each running job last had a task (its idle
time).  A job whose SLURM state is RUNNING but whose dask worker has not connected yet counts
as pending: it brings capacity soon and has no idle time to give back.

Invariants: at most ``high`` jobs are asked for at any time (the count is read from
``worker_spec``, which a step changes before the next snapshot is read); a job with a task
processing is never retired; a snapshot that could not be read (the scheduler is closing)
changes nothing.

Rejected: ``cluster.adapt`` (elastic.py says why); sizing from the driver's own pending
futures (they do not say which tasks already run, nor where).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time

from . import on_scheduler
from .elastic import Action, Bounds, Job, Step, View, decide
from .jobs import JobState

log = logging.getLogger("shoal.jobs")
RETIRE_TIMEOUT_S = 60.0  # a scheduler that does not answer a retire: the job is closed anyway
KEEP_DECISIONS = 200  # the newest steps kept for stats() and the dashboard


@dataclasses.dataclass(frozen=True)
class Observation:
    """One raw snapshot: ``waiting`` task keys, ``busy`` {job name: tasks processing},
    ``asked`` the job names asked for (worker_spec), ``jobs`` the job watch's view
    ({name: (job id or None, JobState, worker connected)})."""

    waiting: tuple[str, ...] = ()
    busy: dict = dataclasses.field(default_factory=dict)
    asked: tuple[str, ...] = ()
    jobs: dict = dataclasses.field(default_factory=dict)


class ScalerState:
    """The ages and idle times the policy needs, kept between snapshots (pure: no I/O)."""

    def __init__(self):
        self.waiting_since: dict[str, float] = {}
        self.busy_at: dict[str, float] = {}  # job name -> last time it had a task (or started)

    def view(self, now: float, obs: Observation) -> View:
        waiting = set(obs.waiting)
        self.waiting_since = {k: self.waiting_since.get(k, now) for k in waiting}
        running, pending = [], []
        for name in obs.asked:
            _, state, connected = obs.jobs.get(name, (None, JobState.SUBMITTING, False))
            if state is JobState.RUNNING and connected:
                tasks = int(obs.busy.get(name, 0))
                if tasks or name not in self.busy_at:
                    self.busy_at[name] = now
                running.append(Job(name, idle_s=now - self.busy_at[name], tasks=tasks))
            elif state in (JobState.SUBMITTING, JobState.PENDING, JobState.RUNNING):
                pending.append(name)
        asked = set(obs.asked)
        self.busy_at = {n: t for n, t in self.busy_at.items() if n in asked}
        return View(waiting=tuple(now - t for t in self.waiting_since.values()),
                    running=tuple(running), pending=tuple(pending))


class JobScaler:
    """The thread that keeps a provider cluster between ``bounds.low`` and ``bounds.high`` jobs.

    ``read()`` -> Observation and the three actions are methods, so a test can feed
    snapshots (``step``) and record the calls without a batch system."""

    def __init__(self, cluster, client, watch, bounds: Bounds, *, poll_s: float = 1.0,
                 start: bool = True):
        self.cluster = cluster
        self.client = client
        self.watch = watch
        self.bounds = bounds
        self.poll_s = poll_s
        self.state = ScalerState()
        self.decisions: collections.deque = collections.deque(maxlen=KEEP_DECISIONS)
        self.peak = 0  # the most jobs asked for at once
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shoal-scaler", daemon=True)
        if start:
            self._thread.start()

    # -- reading -----------------------------------------------------------------------

    def read(self) -> Observation | None:
        sched = getattr(self.cluster, "scheduler", None)  # dask-jobqueue's runs in this process
        try:
            if hasattr(sched, "tasks"):  # read on its loop: no torn reads, no remote call
                load = self.cluster.sync(self._on_loop, on_scheduler.load, dask_scheduler=sched)
            else:
                load = self.client.run_on_scheduler(on_scheduler.load)
        except Exception:  # the client or scheduler is closing: decide nothing this round
            return None
        jobs = {j["name"]: (j["job_id"], JobState(j["state"]), j["connected"])
                for j in self.watch.snapshot()} if self.watch is not None else {}
        return Observation(waiting=tuple(load["waiting"]), busy=dict(load["busy"]),
                           asked=self._asked(), jobs=jobs)

    def _asked(self) -> tuple[str, ...]:
        for _ in range(5):
            try:
                return tuple(self.cluster.worker_spec)
            except RuntimeError:  # changed size while copied (the loop thread): again
                continue
        return ()

    # -- deciding and acting -----------------------------------------------------------

    def step(self, now: float, obs: Observation) -> tuple[Step, ...]:
        """One round on a snapshot: decide, act, record; returns the steps taken."""
        view = self.state.view(now, obs)
        decision = decide(view, self.bounds)
        submit = decision.submit
        self._record(obs, decision.steps)  # said first: stats() never shows a step unexplained
        if submit:
            self.submit(len(obs.asked) + submit)
        for step in decision.steps:
            if step.action is not Action.SUBMIT:
                self.drop(step.job_id)
        self.peak = max(self.peak, len(obs.asked) + submit - len(decision.cancel)
                        - len(decision.retire))
        return decision.steps

    def submit(self, jobs: int) -> None:
        """Ask for ``jobs`` jobs in all (dask-jobqueue submits the new ones with sbatch)."""
        self.cluster.sync(self._on_loop, self.cluster.scale, jobs=jobs)

    def drop(self, name: str) -> None:
        """Give job ``name`` back: out of worker_spec (so the job watch does not replace it),
        its dask worker retired through the scheduler (the results it holds move to the
        other workers first: a result lost with it would be computed again, a task run
        twice), then the cluster closes the job (dask-jobqueue runs scancel)."""
        self.cluster.sync(self._drop, name)

    async def _drop(self, name: str) -> None:
        cluster = self.cluster
        cluster.worker_spec.pop(name, None)
        try:
            await asyncio.wait_for(cluster.scheduler_comm.retire_workers(names=[name]),
                                   RETIRE_TIMEOUT_S)
        except asyncio.TimeoutError:  # the scheduler is gone or stuck: never hang the scaler
            log.warning("elastic pilot: retiring %s got no answer in %.0f s; closing its job",
                        name, RETIRE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - not connected (a pending job): nothing to move
            pass
        await cluster._correct_state()

    @staticmethod
    async def _on_loop(fn, *args, **kwargs):
        """``fn`` on the cluster's event loop (worker_spec is the loop's: no torn reads)."""
        return fn(*args, **kwargs)

    def _record(self, obs: Observation, steps) -> None:
        for step in steps:
            job_id = obs.jobs.get(step.job_id, (None,))[0] if step.job_id else None
            entry = {"t": time.time(), "action": step.action.value, "job": step.job_id,
                     "job_id": job_id, "reason": step.reason}
            with self._lock:
                self.decisions.append(entry)
            what = {Action.SUBMIT: "submitting a job",
                    Action.CANCEL: f"cancelling pending job {job_id or step.job_id}",
                    Action.RETIRE: f"giving back job {job_id or step.job_id}"}[step.action]
            log.info("elastic pilot: %s: %s", what, step.reason)

    def snapshot(self) -> dict:
        """For stats(): the bounds, the jobs asked for now, the peak, the newest decisions."""
        with self._lock:
            decisions = list(self.decisions)
        return {"low": self.bounds.low, "high": self.bounds.high,
                "grow_after_s": self.bounds.grow_after_s, "idle_after_s": self.bounds.idle_after_s,
                "jobs": len(self._asked()), "peak": self.peak, "decisions": decisions}

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                obs = self.read()
                if obs is not None and not self._stop.is_set():
                    self.step(time.monotonic(), obs)
            except Exception:  # pragma: no cover - keep scaling; a bug must not end the thread
                log.exception("the elastic pilot's scaler failed one round")

    def stop(self) -> None:
        """Stop deciding (before the cluster closes)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)


__all__ = ["JobScaler", "Observation", "ScalerState"]
