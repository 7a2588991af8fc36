"""Watching a provider pilot's batch jobs: queue progress, replacing jobs that ended, failing fast.

dask-jobqueue submits the jobs and cancels them at close; between the two it
does nothing: a job that SLURM kills (``scancel``, its walltime, a node
failure) is not replaced, a job stuck in the queue is silent, and a job whose
dask worker never starts looks like a hang.  ``JobWatch`` fills that gap::

    JobWatch thread, every poll_s:
      squeue --me -o '%i|%T|%r|%S|%e' ──► observations {job id: (state, reason, start, end)}
      cluster.workers (name -> job id), scheduler's worker names (who connected)
         │
         ▼  JobPolicy.step(...)  (pure: observations in, actions out)
      Note(text)       ──► log INFO  (state changes: PENDING -> RUNNING)
      Warn(text)       ──► log WARNING (still PENDING after warn_after_s: why, from SLURM)
      Replace(name)    ──► on the cluster's loop: drop the job, cluster._correct_state()
                            submits a new one under the same name
      Fail(message)    ──► the backend settles every pending task with BackendUnavailable

Invariants: a listing that failed (slurmctld unreachable) changes nothing (no job
is taken for gone because squeue did not answer); a job is replaced only while the
pilot is open; ``max_start_failures`` jobs in a row that end before their dask
worker connected fail the pilot instead of resubmitting forever; ``close``
returns when squeue lists none of the pilot's jobs (bounded), so a closed pilot
leaves nothing in the queue.

Only SLURM is watched (squeue); PBS jobs are submitted and cancelled by
dask-jobqueue without this watch (docs/hpc.md says what is tested).

Rejected: dask-jobqueue's ``adapt()`` (it rescales by load, not by jobs that
died, and never reports why a job does not start); ``sacct`` (needs the
accounting database, which many test clusters and this repo's slurm-local lack).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import getpass
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable

log = logging.getLogger("shoal.jobs")
DROPPED = "<dropped>"  # job id of a job the cluster closed itself (after its worker was lost)


class JobState(enum.Enum):
    """A batch job as the pilot sees it (SLURM's many states folded into what matters)."""

    SUBMITTING = "SUBMITTING"  # dask-jobqueue has not got a job id yet
    PENDING = "PENDING"  # in the queue (PENDING, REQUEUED, SUSPENDED, held)
    RUNNING = "RUNNING"  # CONFIGURING or RUNNING
    ENDING = "ENDING"  # COMPLETING, SIGNALING, STAGE_OUT
    GONE = "GONE"  # no longer in squeue: ended (completed, cancelled, timed out, failed)


_WAITING = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED",
            "RESIZING"}
_RUNNING = {"CONFIGURING", "RUNNING"}
_ENDING = {"COMPLETING", "SIGNALING", "STAGE_OUT"}

# Pending reasons after which a job never starts without an administrator (SLURM's
# squeue(1) "JOB REASON CODES"); anything else (Resources, Priority, BeginTime,
# ReqNodeNotAvail while nodes reboot, ...) is waited for, with warnings.
FATAL_REASONS = frozenset({
    "BadConstraints", "PartitionNodeLimit", "PartitionTimeLimit", "InvalidAccount", "InvalidQOS",
    "DependencyNeverSatisfied", "JobHeldAdmin", "AccountNotAllowed", "QOSNotAllowed",
    "AssocMaxWallDurationPerJobLimit", "QOSMaxWallDurationPerJobLimit", "QOSMaxCpuPerJobLimit",
    "QOSMaxNodePerJobLimit", "AssocMaxCpuPerJobLimit", "AssocMaxNodePerJobLimit",
    "PartitionConfig", "BurstBufferOperation",
})


def fold_state(slurm_state: str | None) -> JobState:
    """SLURM's state word (``squeue %T``), or None when squeue no longer lists the job."""
    if slurm_state is None:
        return JobState.GONE
    s = slurm_state.upper()
    if s in _WAITING:
        return JobState.PENDING
    if s in _RUNNING:
        return JobState.RUNNING
    if s in _ENDING:
        return JobState.ENDING
    return JobState.GONE  # COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, ...


@dataclasses.dataclass
class Job:
    """What the watch knows of one job (one dask worker's batch job)."""

    name: str
    job_id: str | None = None
    state: JobState = JobState.SUBMITTING
    reason: str = ""
    since: float = 0.0  # when (monotonic) it entered ``state``
    warned: float = 0.0  # when (monotonic) it was last warned about
    connected: bool = False  # its dask worker reached the scheduler
    start: float | None = None  # epoch seconds, from SLURM
    end: float | None = None  # epoch seconds: SLURM's start + time limit

    def view(self) -> dict:
        return {"name": self.name, "job_id": self.job_id, "state": self.state.value,
                "reason": self.reason, "connected": self.connected, "start": self.start,
                "end": self.end}


@dataclasses.dataclass(frozen=True)
class Seen:
    """One squeue row."""

    state: str
    reason: str = ""
    start: float | None = None
    end: float | None = None


@dataclasses.dataclass(frozen=True)
class Note:
    text: str


@dataclasses.dataclass(frozen=True)
class Warn:
    text: str


@dataclasses.dataclass(frozen=True)
class Replace:
    name: str
    why: str


@dataclasses.dataclass(frozen=True)
class Fail:
    message: str


class JobPolicy:
    """Pure: the jobs' last states and each poll's observations in, actions out.  Owner only."""

    def __init__(self, *, warn_after_s: float = 10.0, warn_every_s: float = 60.0,
                 max_start_failures: int = 3, label: str = "SLURM"):
        self.jobs: dict[str, Job] = {}
        self.warn_after_s = warn_after_s
        self.warn_every_s = warn_every_s
        self.max_start_failures = max_start_failures
        self.start_failures = 0  # jobs in a row that ended before their worker connected
        self.label = label
        self.failed = False

    def step(self, now: float, submitted: dict[str, str | None], seen: dict[str, Seen],
             connected: set[str], closing: bool = False) -> list:
        """``submitted``: job name -> job id (None while submitting) as dask-jobqueue holds
        them; ``seen``: squeue's rows by job id; ``connected``: names of connected workers."""
        actions: list = []
        for name in list(self.jobs):
            if name not in submitted and self.jobs[name].state is not JobState.GONE:
                del self.jobs[name]  # dropped by the cluster itself (scale down, lost worker)
        for name, job_id in submitted.items():
            if job_id == DROPPED:  # dask-jobqueue gave up on it (worker lost for 15 s): replace
                old = self.jobs.get(name)
                if old is None:  # asked for (a scale up) and not launched yet: not dropped
                    self.jobs[name] = Job(name, None, since=now)
                    continue
                if not self.failed and not closing and old.state is not JobState.SUBMITTING:
                    old.state = JobState.SUBMITTING
                    actions.append(Replace(name, f"{self.label} job {old.job_id} ({name}) was "
                                                 "closed after its worker was lost"))
                continue
            job = self.jobs.get(name)
            if job is None or (job_id is not None and job.job_id not in (None, job_id)):
                job = self.jobs[name] = Job(name, job_id, since=now)  # new, or resubmitted
            job.job_id = job_id
            job.connected |= name in connected
            if job_id is None:
                continue
            row = seen.get(job_id)
            state = fold_state(row.state if row else None)
            if row is not None:
                job.reason = row.reason if row.reason not in ("None", "(null)") else ""
                job.start, job.end = row.start or job.start, row.end or job.end
            if state is not job.state:
                actions.append(Note(f"{self.label} job {job_id} ({name}): {job.state.value} -> "
                                    f"{state.value}" + (f" ({job.reason})" if job.reason else "")))
                job.state, job.since, job.warned = state, now, now
            actions += self._judge(job, now, closing)
        return actions

    def _judge(self, job: Job, now: float, closing: bool) -> list:
        if self.failed or closing:
            return []
        if job.state is JobState.PENDING:
            if job.reason in FATAL_REASONS:
                self.failed = True
                return [Fail(f"{self.label} job {job.job_id} can never start: it is pending with "
                             f"reason {job.reason} (squeue); the pilot's tasks fail instead of "
                             "waiting. Check the partition, account, cores, memory and walltime")]
            waited = now - job.since
            if waited >= self.warn_after_s and now - job.warned >= min(self.warn_after_s,
                                                                         self.warn_every_s):
                job.warned = now + self.warn_every_s - min(self.warn_after_s, self.warn_every_s)
                return [Warn(f"{self.label} job {job.job_id} ({job.name}) still PENDING after "
                             f"{waited:.0f} s ({job.reason or 'no reason given'}); submitted "
                             "tasks wait for it")]
            return []
        if job.state is not JobState.GONE:
            if job.connected:
                self.start_failures = 0
            return []
        if job.connected:
            self.start_failures = 0
        else:
            self.start_failures += 1
            if self.start_failures >= self.max_start_failures:
                self.failed = True
                return [Fail(f"{self.start_failures} {self.label} jobs in a row ended before their "
                             f"dask worker connected (the last: job {job.job_id}); see its output "
                             f"file (slurm-{job.job_id}.out where sbatch ran, or log_directory=)")]
        job.state = JobState.SUBMITTING  # until the replacement has an id
        return [Replace(job.name, f"{self.label} job {job.job_id} ended")]


def _epoch(text: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(text).timestamp()  # squeue prints local time
    except ValueError:  # N/A, Unknown
        return None


def squeue(user: str | None = None, timeout: float = 20.0) -> dict[str, Seen] | None:
    """This user's jobs as squeue lists them, or None when squeue did not answer."""
    cmd = ["squeue", "-h", "-u", user or getpass.getuser(), "-o", "%i|%T|%r|%S|%e"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "LC_ALL": "C", "SLURM_TIME_FORMAT": "standard"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("squeue failed: %s", exc)
        return None
    if out.returncode != 0:
        log.debug("squeue failed: %s", out.stderr.strip())
        return None
    rows = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5:
            rows[parts[0]] = Seen(parts[1], parts[2], _epoch(parts[3]), _epoch(parts[4]))
    return rows


class JobWatch:
    """The thread that carries out ``JobPolicy``'s actions for one provider cluster."""

    replaces = True  # a job that ended is submitted again (else the pilot fails: no_replace)
    no_replace = ""

    def __init__(self, cluster, client, on_fail: Callable[[str], None], *, poll_s: float = 2.0,
                 policy: JobPolicy | None = None, list_jobs=squeue):
        self.cluster = cluster
        self.client = client
        self.on_fail = on_fail
        self.poll_s = poll_s
        self.policy = policy or JobPolicy()
        self.list_jobs = list_jobs
        self.ids: set[str] = set()  # every job id this pilot ever had
        self.replaced = 0
        self.blind_since: float | None = None  # squeue has not answered since then
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shoal-jobs", daemon=True)
        self._thread.start()

    def snapshot(self) -> list[dict]:
        with self._lock:
            return [j.view() for j in self.policy.jobs.values()]

    def _submitted(self) -> dict[str, str | None]:
        for _ in range(5):
            try:
                spec = list(self.cluster.worker_spec)
                # a job in workers but no longer in worker_spec is being given back (scale
                # down, the elastic pilot's shrink): not the pilot's any more, never replaced
                jobs = {name: getattr(job, "job_id", None)
                        for name, job in list(self.cluster.workers.items()) if name in spec}
                for name in spec:
                    jobs.setdefault(name, DROPPED)  # closed by the cluster: replace it
                return jobs
            except RuntimeError:  # changed size while copied (the loop thread): again
                continue
        return {}

    def _connected(self) -> set[str]:
        try:
            workers = self.client.scheduler_info().get("workers", {})
            return {w.get("name") for w in workers.values()}
        except Exception:  # the client is closing
            return set()

    def poll(self) -> None:
        """One round: list, decide, act (the thread calls it every ``poll_s``)."""
        seen = self.list_jobs()
        now = time.monotonic()
        if seen is None:  # nothing is concluded from a listing that failed; said once a minute
            if self.blind_since is None or now - self.blind_since >= 60:
                log.warning("squeue does not answer: the pilot's jobs are not watched meanwhile "
                            "(is slurmctld up? sinfo)")
                self.blind_since = now
            return
        self.blind_since = None
        submitted = self._submitted()
        with self._lock:
            self.ids.update(i for i in submitted.values() if i and i != DROPPED)
            actions = self.policy.step(now, submitted, seen, self._connected(),
                                       closing=self._stop.is_set())
        for action in actions:
            if isinstance(action, Note):
                log.info("%s", action.text)
            elif isinstance(action, Warn):
                log.warning("%s", action.text)
            elif isinstance(action, Replace) and not self.replaces:
                message = f"{action.why}; {self.no_replace}"
                log.error("%s", message)
                self.on_fail(message)
            elif isinstance(action, Replace):
                log.warning("%s; submitting a new job in its place", action.why)
                self.replaced += 1
                self.cluster.loop.add_callback(self._replace, action.name)
            elif isinstance(action, Fail):
                log.error("%s", action.message)
                self.on_fail(action.message)

    async def _replace(self, name: str) -> None:
        if self._stop.is_set():
            return
        job = self.cluster.workers.pop(name, None)
        if job is not None:
            with contextlib.suppress(Exception):
                await job.close()  # scancel; the job is gone already, so mostly a no-op
        await self.cluster._correct_state()  # name is still in worker_spec: a new job

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # pragma: no cover - keep watching; a bug must not end the watch
                log.exception("the job watch failed one round")

    def stop(self) -> None:
        """Stop watching (before the cluster closes: nothing is replaced from now on)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        ids = [i for i in self._submitted().values() if i and i != DROPPED]
        with self._lock:
            self.ids.update(ids)  # jobs submitted since the last poll count too

    def wait_gone(self, timeout: float = 60.0) -> list[str]:
        """After the cluster closed: wait until squeue lists none of this pilot's jobs
        (cancelling stragglers once); returns the ids still listed at the timeout."""
        with self._lock:
            ids = set(self.ids)
        if not ids:
            return []
        deadline = time.monotonic() + timeout
        cancelled = False
        while True:
            seen = self.list_jobs()
            left = sorted(i for i in ids if seen is None or i in seen)
            if not left:
                return []
            if seen is not None and not cancelled:
                live = [i for i in left if fold_state(seen[i].state) is not JobState.ENDING]
                if live:
                    subprocess.run(["scancel", *live], capture_output=True, timeout=30)
                cancelled = True
            if time.monotonic() > deadline:
                log.warning("jobs %s are still in squeue %.0f s after the pilot closed", left, timeout)
                return left
            time.sleep(0.5)
