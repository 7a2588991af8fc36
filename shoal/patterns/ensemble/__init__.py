"""Ensembles on pilots: Pipeline/Stage/Task workflows of executables and functions.

Modules, bottom to top: ``model`` (Task/Stage/Pipeline, Enums, validation,
the EnTK attribute style), ``identity`` (a run's plan, identity and task
specs), ``values`` (results as data; pickle opt-in), ``scheduler`` (pure
placement and backfill policy), ``journal`` (SQLite WAL, write-ahead state,
the driver lock), ``status`` (RunStatus: a run's honest status from its
journal), ``launcher`` (sandboxes, staging, Popen, reaping), ``remote``
(executables as pilot tasks on the nodes of a dask pilot), ``functions``
(function tasks on N CPUs; local code travelling to dask), ``report``
(Results/StageContext/Report), ``walker`` (the Walker: pipelines, stages,
the stage barrier), ``progress`` (the progress line), ``config`` (``EngineConfig``: a run's
settings, checked once), ``launch`` (the ``Launch`` a run starts its tasks with: local runners
or dask pilot tasks, chosen once), ``engine`` (the Engine, the driver loop: place, launch, reap;
the Walker's ``Intake``), ``drive`` (the pilot or allocation a run opens, then the engine),
``entk`` (EnTK's AppManager),
``entk_model``/``entk_states`` (EnTK's Task/Stage/Pipeline and state names), and ``commands``
(``shoal run`` / ``shoal status``) with ``yamlfile`` (YAML workflow files) and ``resource_args``
(``shoal run --slurm``'s flags), and ``reuse`` (task keys by content: ``run(reuse=True,
cache=)``, ``explain``).  No module imports another in a cycle (tests/test_layers.py).
The public faces are ``shoal.ensemble`` and ``shoal.entk``; see
docs/ensemble.md and docs/entk.md.
"""

from __future__ import annotations

from .config import EngineConfig, parse_walltime
from .model import (
    EnsembleError,
    Failure,
    FailureKind,
    Input,
    Pipeline,
    Stage,
    Staging,
    Task,
    TaskKind,
    TaskState,
)
from .report import Report, Results, StageContext
from .reuse import explain
from .scheduler import Grant, Request, Scheduler
from .status import Driver, DriverState, PipelineStatus, RunStatus, StageStatus, TaskFailure
from .values import Values


def run(workflow, pilot=None, journal: str = "run.db", resume: bool = False, *,
        workers: int | None = None, cores=None, gpus: int = 0, memory=None, walltime=None,
        sandbox: str | None = None, window: int | None = None, durability: str = "normal",
        progress=None, patience: int = 64, new: bool = False, retry_failed: bool = False,
        values: str = "data", resource=None, shared_data=(), launcher=None,
        resume_command: str | None = None, retries: int = 0, retry_delay=None, reuse: bool = False,
        cache=None) -> Report:
    """Run ``workflow`` (a Pipeline, a list or lazy iterable of them) to the end; return a Report.

    ``pilot``: run function tasks on this open ``shoal.Pilot`` (default: one is
    started on the first function task and closed at the end; in the batch step of a SLURM
    job of several nodes, one over every node of the job is opened first and every task
    runs on it, docs/hpc.md "One pilot, many nodes").  ``journal``:
    the SQLite file recording every state change; ``resume=True`` finishes
    the run it holds.  ``cores`` (a count or CPU ids), ``gpus`` (a count, for
    CUDA_VISIBLE_DEVICES) and ``memory`` (bytes or '64G') describe what
    tasks may be placed on.  ``walltime`` (seconds or '2h'): stop starting
    tasks that cannot finish in time, drain, and leave the journal resumable.
    ``sandbox``: root of the per-task directories (default ``<journal>.sandbox``).

    Re-runs: a journal that already holds a run is refused unless ``resume=True``
    (finish it: only tasks not DONE run; a *different* workflow is refused,
    saying what differs) or ``new=True`` (start afresh: the old journal and its
    sandboxes are kept as ``<name>.<date>.db`` / ``.sandbox``).  ``retry_failed=True``
    (with ``resume``) runs FAILED and CANCELED tasks again.  One driver per
    journal: a second live one is refused with the first one's pid.

    ``progress``: True prints the ``shoal run`` progress line on stderr;
    False/None nothing; a callable gets a dict (done, running, failed, skipped,
    waiting, total, rate, eta, elapsed, final) at most every 0.5 s.
    ``values``: how function results are journaled — ``"data"`` (msgpack: plain
    data, numpy arrays; reading never runs code) or ``"pickle"`` (any value;
    reading a journal then runs code its author chose: trusted journals only).
    Ctrl-C / SIGTERM drain like the walltime (the report says so; resume to finish).
    ``resume_command``: what ``shoal status`` tells the user to run to finish the run
    (``shoal run`` records its own); by default the driver's command line prefixed with
    ``SHOAL_RESUME=1``: with that variable set to 1, ``run()`` resumes (``resume=True``,
    ``new`` ignored), so a script, also an EnTK one, resumes without an edit.

    ``launcher``: how MPI tasks (``Task(ranks=R, cores_per_rank=C)``) start their ranks —
    ``"srun"``, ``"mpirun"`` (Open MPI) or ``"none"`` (the executable once, with all R x C
    cores); default: srun inside a SLURM job, else mpirun when on PATH (mpi.py, docs/hpc.md).

    On a dask pilot (``pilot.backend is BackendKind.DASK``) executables run on
    the cluster's nodes as pilot tasks, ``cores`` is a number of slots
    (default ``pilot.workers``), ``gpus`` is refused (a task's ``gpus=k`` becomes
    the dask worker resource ``GPU=k``), ``memory`` is tracked only
    when given, and sandboxes and inputs must be on a filesystem the nodes
    share with the driver; the journal stays here (docs/ensemble.md).

    ``shared_data``: EnTK's ``appman.shared_data`` — paths (``'path'`` or ``'path > name'``)
    copied into the run's shared area ``<sandbox>/~shared`` before any task starts; a task
    names them ``$SHARED/name`` (inputs, EnTK tasks' arguments, ``stage_out`` destinations).

    ``resource``: run in a batch allocation instead (a mapping or ``Resource``:
    ``{"backend": "slurm", "nodes": 2, "cores": 16, "partition": ..., "walltime": "2h"}``):
    a dask pilot of batch jobs is opened, the walltime counts from when the
    first job starts, the engine drains before the allocation ends, and the
    jobs leave the queue when the run returns (resource.py, docs/hpc.md).

    ``retries`` / ``retry_delay``: what a task whose stage and itself give none gets — re-run
    up to ``retries`` times after a failure, waiting ``retry_delay`` before each retry
    (seconds, or ``shoal.Backoff(base=1, factor=2, cap=60, jitter=0.1)``: 1, 2, 4, ... s).
    A task's ``priority`` (or its stage's) orders the tasks that are ready: higher first.

    ``reuse=True``: start afresh (the journal there is kept under its dated name, as with
    ``new``) and reuse every task whose key -- its code or executable, arguments, named
    environment and the contents of its input files -- matches a task the old journal holds DONE:
    its outputs are staged back and it is not run.  ``cache``: a folder shared between runs where
    every finished task's key, outputs and result are kept, and matched the same way (reuse.py,
    docs/ensemble.md "Reusing results across runs").
    """
    from .drive import run_workflow

    config = EngineConfig.for_run(
        journal=journal, resume=resume, new=new, retry_failed=retry_failed, workers=workers,
        cores=cores, gpus=gpus, memory=memory, walltime=walltime, sandbox=sandbox, window=window,
        durability=durability, progress=progress, patience=patience, values=values,
        shared_data=shared_data, launcher=launcher, resume_command=resume_command,
        retries=retries, retry_delay=retry_delay, reuse=reuse, cache=cache)
    return run_workflow(workflow, config, pilot=pilot, resource=resource)


__all__ = [
    "Task", "Stage", "Pipeline", "run", "Report", "Results", "StageContext", "TaskState",
    "TaskKind", "FailureKind", "Failure", "Staging", "Input", "EnsembleError", "Scheduler",
    "Request", "Grant", "parse_walltime", "RunStatus", "PipelineStatus", "StageStatus",
    "TaskFailure", "Driver", "DriverState", "Values", "explain",
]
