"""RADICAL-EnTK's AppManager on shoal: move an EnTK script by changing its import line.

``from shoal.entk import AppManager, Pipeline, Stage, Task`` gives EnTK's
Pipeline/Stage/Task (entk_model.py: ``shoal.ensemble``'s classes with EnTK's uids,
names and shell; model.py accepts EnTK's attribute style: ``t.executable = ...``,
``t.cpu_reqs = {...}``, ``t.copy_input_data = [...]``, ``s.add_tasks(t)``,
``p.add_stages(s)``, no-argument ``post_exec``) and this ``AppManager`` facade::

    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 10, "cpus": 4})
    appman.workflow = [p]      # or set([p]) as EnTK scripts write it
    appman.run()               # -> the shoal Report; raises if a task failed

Mapping of ``resource_desc`` (EnTK's keys): ``resource`` must name this
machine (``local.localhost``/``local``/``localhost``: shoal's SLURM support
is ``shoal run --slurm``), ``walltime`` is **minutes** as in EnTK (drain and
leave the journal resumable), ``cpus`` -> ``cores``, ``gpus`` -> ``gpus``,
``memory`` -> ``memory``; ``project``, ``queue``, ``access_schema`` (or ``schema``, the
spelling of EnTK's own examples) are batch
system settings with no meaning on one machine and are accepted and ignored
only when ``resource`` is local.  Unknown keys are errors with a did-you-mean.
``appman.shared_data = ['path', 'path > name']`` is staged into the run's shared area
(``$SHARED``, ``<sandbox root>/~shared``) before any task starts.
EnTK's connection arguments (``hostname``, ``port``, ``username``,
``password``: RabbitMQ) are accepted and unused — shoal needs no broker.

shoal additions (keyword arguments): ``journal`` (default ``entk.db`` in the
working directory), ``resume`` (finish the run the journal holds, after a
crash or Ctrl-C), ``retry_failed``, ``progress`` (default: ``shoal run``'s progress line
on stderr when stderr is a terminal, nothing elsewhere; ``False``: none; a callable taking
the progress dict), ``pilot``, ``reuse`` (start afresh reusing every task whose key matches a
finished task of the previous run's journal: ``shoal run --reuse``) and ``cache`` (a folder
of finished tasks shared between runs: ``--cache``).  Without
``resume`` every ``run()`` starts afresh and keeps an earlier journal under a
dated name, as EnTK starts a new session each time.

``run()`` raises ``EnsembleError`` when tasks failed (after they all settled,
with the failures in the message), like EnTK's AppManager raises on failed
tasks with ``resubmit_failed=False``, and when the run stopped early (the
walltime, Ctrl-C, SIGTERM: resume to finish); ``appman.report`` keeps the
Report.
"""

from __future__ import annotations

import difflib
import sys

from .model import EnsembleError, Pipeline, in_creation_order

_LOCAL = {"local.localhost", "local", "localhost", "local.localhost_anaconda"}
_RESOURCE_KEYS = {"resource", "walltime", "cpus", "gpus", "memory", "project", "queue",
                  "access_schema", "schema", "job_name"}  # 'schema': EnTK's examples' spelling
_CONNECTION = {"hostname", "port", "username", "password", "reattempts", "resubmit_failed",
               "autoterminate", "write_workflow", "rts", "rmq_cleanup", "rts_config", "name"}


class AppManager:
    """EnTK's AppManager: ``resource_desc``, ``workflow``, ``run()``.  Owner only (one thread)."""

    def __init__(self, resource_desc: dict | None = None, *, journal: str = "entk.db",
                 resume: bool = False, retry_failed: bool = False, progress=None, pilot=None,
                 retries: int = 0, retry_delay=None, reuse: bool = False, cache=None, **entk_kwargs):
        for key in entk_kwargs:
            if key not in _CONNECTION:
                close = difflib.get_close_matches(key, sorted(_CONNECTION | {"journal", "resume",
                                                                            "retry_failed", "progress",
                                                                            "pilot", "resource_desc",
                                                                            "retries", "retry_delay",
                                                                            "reuse", "cache"}), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise EnsembleError(f"AppManager() got an unknown argument {key!r}{hint}")
        self.journal = journal
        self.resume = resume
        self.retry_failed = retry_failed
        self.retries, self.retry_delay = retries, retry_delay  # every task's default (shoal's)
        self.reuse, self.cache = reuse, cache  # reuse finished tasks of the last run / a cache folder
        self.progress = progress
        self.pilot = pilot
        self.report = None
        self._resource: dict = {}
        self._workflow: list[Pipeline] | None = None
        self._shared_data: list[str] = []
        if resource_desc is not None:
            self.resource_desc = resource_desc

    def __setattr__(self, name: str, value) -> None:
        if name not in _APPMAN_ATTRS and not (name.startswith("_") and type(self) is not AppManager):
            # a subclass (EnTK's examples subclass AppManager) keeps its own _private state
            public = sorted(a for a in _APPMAN_ATTRS if not a.startswith("_"))
            close = difflib.get_close_matches(name, public, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EnsembleError(f"AppManager has no attribute {name!r}{hint}; it has: {', '.join(public)}")
        object.__setattr__(self, name, value)

    # -- EnTK's properties ------------------------------------------------------------
    @property
    def resource_desc(self) -> dict:
        return dict(self._resource)

    @resource_desc.setter
    def resource_desc(self, desc: dict) -> None:
        if not isinstance(desc, dict):
            raise EnsembleError(f"AppManager.resource_desc must be a dict, got {desc!r}")
        for key in desc:
            if key not in _RESOURCE_KEYS:
                close = difflib.get_close_matches(str(key), sorted(_RESOURCE_KEYS), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise EnsembleError(f"resource_desc: unknown key {key!r}{hint}; allowed: "
                                    f"{', '.join(sorted(_RESOURCE_KEYS))}")
        resource = desc.get("resource", "local.localhost")
        if resource not in _LOCAL and not str(resource).startswith("local."):  # local.localhost_test, ...
            raise EnsembleError(
                f"resource_desc: resource {resource!r}: AppManager runs on this machine "
                "('local.localhost'); for a batch allocation run the workflow with shoal run --slurm, "
                "or start a dask cluster there and pass pilot=shoal.Pilot(backend='dask', address=...)")
        if "schema" in desc and "access_schema" in desc and desc["schema"] != desc["access_schema"]:
            raise EnsembleError(f"resource_desc: 'schema' ({desc['schema']!r}) is another name of "
                                f"'access_schema' ({desc['access_schema']!r}); give one")
        for key in ("walltime", "cpus", "gpus"):
            v = desc.get(key)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v < 0):
                raise EnsembleError(f"resource_desc: {key} must be a number >= 0, got {v!r}")
        self._resource = dict(desc)
        if "schema" in self._resource:
            self._resource["access_schema"] = self._resource.pop("schema")

    @property
    def shared_data(self) -> list[str]:
        """EnTK's shared data: files (``'path'`` or ``'path > name'``) copied into the run's shared
        area before any task starts; tasks name them ``$SHARED/name`` (in ``*_input_data``, in
        arguments and in ``copy_output_data`` destinations)."""
        return list(self._shared_data)

    @shared_data.setter
    def shared_data(self, data) -> None:
        if isinstance(data, str):
            data = [data]
        if not isinstance(data, list | tuple) or not all(isinstance(d, str) for d in data):
            raise EnsembleError(f"AppManager.shared_data takes a list of paths, got {data!r}")
        self._shared_data = list(data)

    @property
    def workflow(self) -> list[Pipeline] | None:
        return self._workflow

    @workflow.setter
    def workflow(self, pipelines) -> None:
        if isinstance(pipelines, Pipeline):
            pipelines = [pipelines]
        if isinstance(pipelines, set | frozenset):
            # a set has no order; EnTK scripts write set([p1, p2]): the order they were created in
            # (the same in every run of the script, so unnamed pipelines keep their p<i> on resume)
            pipelines = in_creation_order(pipelines)
        pipelines = list(pipelines)
        for p in pipelines:
            if not isinstance(p, Pipeline):
                raise EnsembleError(f"AppManager.workflow takes Pipelines, got {p!r}")
        self._workflow = pipelines

    # -- running ----------------------------------------------------------------------
    def run(self):
        """Run the workflow to the end; return the Report, raise EnsembleError if tasks failed."""
        from .config import EngineConfig
        from .drive import run_workflow

        if not self._workflow:
            raise EnsembleError("AppManager.run(): set appman.workflow = [pipeline, ...] first")
        desc = self._resource
        minutes = desc.get("walltime")
        progress = self.progress
        if progress is None:  # as shoal run: the progress line on a terminal, none in a log
            isatty = getattr(sys.stderr, "isatty", None)
            progress = bool(isatty and isatty())
        config = EngineConfig.for_run(
            journal=self.journal, resume=self.resume, new=not self.resume, retry_failed=self.retry_failed,
            cores=int(desc["cpus"]) if desc.get("cpus") else None, gpus=int(desc.get("gpus") or 0),
            memory=desc.get("memory"), walltime=minutes * 60 if minutes else None, progress=progress,
            shared_data=self._shared_data, retries=self.retries, retry_delay=self.retry_delay,
            reuse=self.reuse and not self.resume, cache=self.cache)
        report = run_workflow(self._workflow, config, pilot=self.pilot)
        self.report = report
        if report.drained:
            raise EnsembleError(
                f"the run stopped before the end ({report.drain_reason or 'drained'}); finish it with "
                f"AppManager(..., resume=True) (journal {self.journal}); appman.report has the counts")
        if report.failed:
            first = report.failures[0]
            raise EnsembleError(
                f"{report.failed} task(s) failed, first {first['uid']}: {first['reason']}; "
                f"see appman.report or shoal status {self.journal}; re-run them with "
                "AppManager(..., resume=True, retry_failed=True)")
        return report

    def terminate(self) -> None:
        """EnTK's terminate(): nothing to stop (run() returns when the workflow ends)."""


_APPMAN_ATTRS = frozenset({"journal", "resume", "retry_failed", "progress", "pilot", "report", "_resource",
                           "retries", "retry_delay", "reuse", "cache",
                           "_workflow", "resource_desc", "workflow", "shared_data", "_shared_data"})
