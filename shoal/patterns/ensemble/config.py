"""``EngineConfig``: everything one ensemble run is told, checked once, before anything opens.

The three entry points — ``shoal.ensemble.run(...)``, EnTK's ``AppManager.run()`` and
``shoal run`` — keep their own keyword names (a public contract); each builds one
``EngineConfig`` with ``EngineConfig.for_run(...)`` and hands it, with the pilot or the
batch allocation to run on, to ``drive.run_workflow``, which gives it to the ``Engine``.
A bad value is refused here with a one-line ``EnsembleError`` naming its keyword (the
messages are the ones the entry points always gave), before a pilot, an allocation or a
journal is opened; the ``Engine`` reads only checked, normalised values (seconds, bytes,
Enums).

What a run is given that is not configuration stays out: the workflow, the pilot (an
open object with a lifetime), the batch allocation (``resource=``: it decides the pilot)
and the nodes of a pilot opened over a SLURM job (they belong to the dask launch,
launch.py).

Rejected: forwarding the keywords from ``run`` to ``Engine`` (two signatures of ~20
parameters to keep equal, once per entry point, and each check made where a value was
first used, some after an allocation had been requested); a mutable options object (a
value changed after the checks would not be checked); ``**kwargs`` passed through (a
misspelt keyword would reach the engine unnoticed).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable, Sequence

from shoal._backoff import Backoff, check_retry_delay
from shoal._walltime import walltime_seconds

from . import mpi
from .model import EnsembleError, parse_size
from .values import Values

RESUME_ENV = "SHOAL_RESUME"  # =1: the resume command journaled for a script (rerun.script_resume_command)


class Durability(enum.Enum):
    """How often the journal reaches the disk (SQLite's ``synchronous``, journal.py)."""

    NORMAL = "normal"
    FULL = "full"
    OFF = "off"


def parse_walltime(value) -> float | None:
    """``3600``, ``"90s"``, ``"30m"``, ``"2h"``, ``"1:30:00"``, Slurm's ``"1-12:00:00"`` -> seconds
    (shoal/_walltime.py has the forms); None stays None; a bad value is an EnsembleError."""
    if value is None:
        return None
    try:
        return walltime_seconds(value)
    except ValueError as exc:
        raise EnsembleError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """One run's settings (``run()``'s keywords; see its docstring for each one's meaning).

    Normalised on construction: ``walltime`` in seconds, ``memory`` in bytes (None: what
    the machine or allocation has), ``values``/``durability``/``launcher`` as Enums,
    ``shared_data`` a tuple."""

    journal: str = "run.db"
    resume: bool = False
    new: bool = False
    retry_failed: bool = False
    workers: int | None = None
    cores: int | Sequence[int] | None = None  # as given (its errors quote it so)
    gpus: int = 0
    memory: int | None = None
    walltime: float | None = None
    sandbox: str | None = None
    window: int | None = None
    max_pipelines: int = 4096
    durability: Durability = Durability.NORMAL
    progress: Callable[[dict], None] | bool | None = None
    patience: int = 64
    values: Values = Values.DATA
    shared_data: tuple[str, ...] = ()
    launcher: mpi.LauncherKind | None = None
    resume_command: str | None = None
    retries: int = 0
    retry_delay: float | Backoff | None = None
    reuse: bool = False  # start afresh, reusing the old journal's finished tasks (reuse.py)
    cache: str | None = None  # a folder of finished tasks shared between runs (reuse.py)

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        w = self.workers
        if w is not None and (type(w) is not int or w < 1):
            raise EnsembleError(f"run(): workers must be an integer >= 1 (the cores to use), got {w!r}")
        if type(self.gpus) is not int or self.gpus < 0:
            raise EnsembleError(f"run(): gpus must be an integer >= 0 (GPUs to hand out), got {self.gpus!r}")
        r = self.retries
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise EnsembleError(f"run(retries=): must be an integer >= 0 (each task's default), got {r!r}")
        try:
            check_retry_delay(self.retry_delay, "run(retry_delay=)")
        except ValueError as exc:
            raise EnsembleError(str(exc)) from None
        if self.retry_failed and not self.resume:
            raise EnsembleError("retry_failed=True (--retry-failed) re-runs the failed tasks of a "
                                "journaled run: it needs resume=True (--resume)")
        if self.new and self.resume:
            raise EnsembleError("new=True (--new) starts a fresh run and resume=True (--resume) finishes "
                                "the journaled one: choose one")
        if self.memory is not None:
            put("memory", parse_size(self.memory, "run(memory=)"))
        put("walltime", parse_walltime(self.walltime))
        if not isinstance(self.durability, Durability):
            try:
                put("durability", Durability(self.durability))
            except ValueError:
                raise EnsembleError(f"durability={self.durability!r}: choose 'normal', 'full' or "
                                    "'off'") from None
        p = self.progress
        if p is not None and not isinstance(p, bool) and not callable(p):
            raise EnsembleError(f"progress={p!r}: give True, False or a callable taking a dict")
        put("values", Values.parse(self.values))
        put("launcher", mpi.parse_kind(self.launcher))
        put("shared_data", tuple(self.shared_data))
        if self.cache is not None:
            if not isinstance(self.cache, str | os.PathLike):
                raise EnsembleError(f"run(): cache must be a folder path, got {self.cache!r}")
            put("cache", os.fspath(self.cache))
        if self.reuse and not self.resume:
            put("new", True)  # a fresh run beside the old one, whose journal and sandbox are read

    @classmethod
    def for_run(cls, **settings) -> EngineConfig:
        """The config of a run started now: ``SHOAL_RESUME=1`` in the environment (the resume
        command journaled for a script) makes it a resume (``resume=True``, ``new`` ignored)."""
        if os.environ.get(RESUME_ENV) == "1":
            settings.update(resume=True, new=False)
        return cls(**settings)


__all__ = ["EngineConfig", "Durability", "parse_walltime", "RESUME_ENV"]
