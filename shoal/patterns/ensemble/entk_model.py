"""RADICAL-EnTK's Task, Stage and Pipeline: shoal's classes with EnTK's identity and execution.

``shoal.entk`` exports these.  They are subclasses of the ensemble model's
classes (model.py), so they mix with shoal's keyword style and features, and
differ only where EnTK's own classes behave otherwise:

* **uids at construction**: ``task.000000``, ``stage.0000``, ``pipeline.0000``
  — EnTK's formats (``ru.generate_id('task.%(counter)06d')`` and ``%04d`` for
  stages and pipelines), one counter per kind per process.  ``t.uid`` never
  changes (EnTK refuses to re-assign it); the key the run gives the object
  (``pipeline.stage.task``, its journal row and sandbox) is ``path_uid``, which
  EnTK calls ``luid``.
* **names**: EnTK's rule (model.NameRule.ENTK): letters, digits, '.' and
  spaces — and the characters shoal's names take; duplicates are allowed, as
  in EnTK (their journal keys get ``#<position>``, walker.py).
* **a shell around the command**: ``executable arguments`` runs through
  ``/bin/sh`` as RADICAL-Pilot runs it (launcher.command), so ``'>'`` and
  ``$VAR`` work; shoal's own Task keeps argv semantics.
* **EnTK's attributes**: ``Task(dict)`` (``from_dict``), ``stdout``/``stderr``
  (file names in the sandbox), ``sandbox`` (a directory several tasks may
  share), ``exit_code``/``path``/``state`` after the run, ``Pipeline.suspend()``
  / ``resume()``, and user attributes on Stage/Pipeline (EnTK's are plain
  objects; subclasses such as a ``Replica(Pipeline)`` keep their own state).

Why the journal key is not the EnTK uid: a resume must find each task again;
uids count objects in creation order, and stages created by ``post_exec``
callbacks of several pipelines are created in the order tasks happen to
finish, so the same script gives other uids in another run.  Positional
defaults (``t<k>``) and names are stable; uids stay the objects' own.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import enum
import itertools
from collections.abc import Mapping

from .model import (
    EnsembleError,
    NameRule,
    TaskState,
    _attrs,
    _unknown_attr,
    check_name,
)
from .model import (
    Pipeline as _Pipeline,
)
from .model import (
    Stage as _Stage,
)
from .model import (
    Task as _Task,
)

_COUNTERS: dict[str, itertools.count] = collections.defaultdict(itertools.count)


def _next_uid(kind: str, digits: int) -> str:
    return f"{kind}.{next(_COUNTERS[kind]):0{digits}d}"


class PipelineState(enum.Enum):
    """What ``Pipeline.state`` reports (EnTK's state names)."""

    DESCRIBED = "DESCRIBED"
    SCHEDULING = "SCHEDULING"
    SUSPENDED = "SUSPENDED"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


_ENTK_STATE = {TaskState.PENDING: "DESCRIBED", TaskState.RUNNING: "EXECUTED", TaskState.DONE: "DONE",
               TaskState.FAILED: "FAILED", TaskState.SKIPPED: "CANCELED", TaskState.CANCELED: "CANCELED"}
_ENTK_STATE_KEYS = {"uid", "state", "state_history", "parent_stage", "parent_pipeline", "rts_uid",
                    "exit_code", "path", "exception", "exception_detail"}  # to_dict()'s bookkeeping


class Task(_Task):
    """EnTK's Task: ``Task()``, ``Task({'executable': ..., 'arguments': [...]})`` or shoal's keywords."""

    _name_rule = NameRule.ENTK
    _shell = True

    def __init__(self, from_dict=None, *args, **kwargs):
        if isinstance(from_dict, str):  # shoal's positional style: Task("/bin/echo", ["hi"])
            args, from_dict = (from_dict, *args), None
        object.__setattr__(self, "_entk", {"uid": _next_uid("task", 6), "path": None, "stdout": "",
                                           "stderr": "", "sandbox": "", "exit_code": None, "state": None})
        super().__init__(*args, **kwargs)
        if from_dict is None:
            return
        if not isinstance(from_dict, Mapping):
            raise EnsembleError(f"Task() takes a dict of attributes (EnTK's from_dict), got {from_dict!r}")
        if from_dict.get("uid"):
            self._entk["uid"] = str(from_dict["uid"])
        for key, value in from_dict.items():
            if key not in _ENTK_STATE_KEYS:
                setattr(self, key, value)

    def __setattr__(self, name: str, value) -> None:
        if name in _ENTK_TASK_OWN:
            _ENTK_TASK_OWN[name](self, value)
            return
        if name not in _TASK_ATTRS:
            raise _unknown_attr(self, name, _TASK_ATTRS | set(_ENTK_TASK_OWN), _TASK_REFUSED)
        object.__setattr__(self, name, value)

    # -- identity ----------------------------------------------------------------------
    @property
    def uid(self) -> str:
        return self._entk["uid"]

    @uid.setter
    def uid(self, value) -> None:  # the dataclass __init__ sets None; EnTK refuses re-assignment
        if value is not None:
            raise EnsembleError(f"Task.uid is not allowed to be re-assigned ({self.uid}); name the task")

    @property
    def path_uid(self) -> str | None:
        return self._entk["path"]

    luid = path_uid

    def bind_path(self, path: str) -> None:
        self._entk["path"] = path

    def replace(self, **changes) -> Task:
        new = dataclasses.replace(self, **changes)
        new._entk.update(self._entk)
        return new

    # -- EnTK's attributes ---------------------------------------------------------------
    stdout = property(lambda self: self._entk["stdout"])
    stderr = property(lambda self: self._entk["stderr"])
    sandbox = property(lambda self: self._entk["sandbox"])
    exit_code = property(lambda self: self._entk["exit_code"],
                         doc="the exit code once the task ended (EnTK: 0 done, else failed); None before")

    @property
    def state(self) -> str:
        """EnTK's state name: DESCRIBED before the run, then DONE / FAILED / CANCELED."""
        return self._entk["state"] or "DESCRIBED"

    stdout_file = property(lambda self: self._entk["stdout"] or "stdout")
    stderr_file = property(lambda self: self._entk["stderr"] or "stderr")
    sandbox_dir = property(lambda self: self._entk["sandbox"] or None)

    def settle(self, state: TaskState, exit_code: int | None) -> None:
        """The engine reports the end of the task (EnTK's ``t.state``, ``t.exit_code``)."""
        self._entk["state"] = _ENTK_STATE[state]
        self._entk["exit_code"] = exit_code

    def from_dict(self, d) -> None:
        """EnTK's ``t.from_dict(d)``: re-initialise this task from ``d`` (its uid kept unless
        ``d`` gives one)."""
        uid = self.uid
        fresh = Task(d)
        for f in dataclasses.fields(_Task):
            if f.init:
                object.__setattr__(self, f.name, getattr(fresh, f.name))
        self._entk.update(fresh._entk)
        if not (isinstance(d, Mapping) and d.get("uid")):
            self._entk["uid"] = uid

    def to_dict(self) -> dict:
        return {"uid": self.uid, "name": self.name or "", "executable": self.executable or "",
                "arguments": [str(a) for a in self.arguments], "stdout": self.stdout,
                "stderr": self.stderr, "sandbox": self.sandbox, "state": self.state,
                "exit_code": self.exit_code, "path": self.path_uid or ""}

    as_dict = to_dict


def _set_file(field: str):
    def setter(task: Task, value) -> None:
        if not isinstance(value, str) or "/" in value or value in (".", ".."):
            raise EnsembleError(f"task {task.label}: {field} is a file name in the task's sandbox, got {value!r}")
        task._entk[field] = value
    return setter


def _set_sandbox(task: Task, value) -> None:
    if not isinstance(value, str) or ".." in value.split("/"):
        raise EnsembleError(f"task {task.label}: sandbox is a directory (relative to the run's sandbox root, "
                            f"or absolute), without '..', got {value!r}")
    task._entk["sandbox"] = value


def _read_only(field: str):
    def setter(task: Task, value) -> None:
        if value is not None:
            raise EnsembleError(f"Task.{field} is set by the run, not by the script")
    return setter


_ENTK_TASK_OWN = {"stdout": _set_file("stdout"), "stderr": _set_file("stderr"), "sandbox": _set_sandbox,
                  "exit_code": _read_only("exit_code"), "state": _read_only("state"),
                  "uid": Task.uid.fset, "luid": _read_only("luid")}
_TASK_ATTRS = _attrs(_Task)
_TASK_REFUSED = {
    "lfs_per_process": "local file-system space is not scheduled; drop it",
    "mem_per_process": "use memory= (bytes or '2G') for the whole task",
    "move_output_data": "use download_output_data / copy_output_data (copies), or stage_out",
    "link_output_data": "use download_output_data / copy_output_data (copies), or stage_out",
    "tag": "placement tags are not supported (one machine, or dask's placement); drop it",
    "tags": "placement tags ({'colocate': uid}) are not supported (one machine, or dask's placement); drop them",
    "executor": "shoal runs executables without an MPI launcher; put srun/mpirun in executable/arguments",
    "pre_launch": "use pre_exec (shell lines run before the executable, in its sandbox)",
    "post_launch": "use post_exec (shell lines run after the executable, in its sandbox)",
}


class _Extensible:
    """EnTK's Stage and Pipeline are plain objects: a script (or a subclass) may keep its own
    attributes on them (``pipeline.iteration = 3``).  A name close to one of the class's own
    still raises with a did-you-mean (``p.stage = [...]``), since that is a typo, not state."""

    def __setattr__(self, name: str, value) -> None:
        allowed = type(self)._ATTRS
        if name in allowed:
            super().__setattr__(name, value)  # the model's own checks (a set of tasks in order, ...)
            return
        if not name.startswith("_") and difflib.get_close_matches(
                name, sorted(a for a in allowed if not a.startswith("_")), n=1):
            raise _unknown_attr(self, name, allowed, {})
        object.__setattr__(self, name, value)


def _from_dict(obj, d) -> None:
    """EnTK's ``Stage.from_dict`` / ``Pipeline.from_dict``: ``uid`` and ``name`` from a dict (a
    run's state in it is bookkeeping of another run: ignored)."""
    if not isinstance(d, Mapping):
        raise EnsembleError(f"{type(obj).__name__}.from_dict takes a dict, got {d!r}")
    if d.get("uid"):
        object.__setattr__(obj, "_entk_uid", str(d["uid"]))
    if d.get("name"):
        obj.name = d["name"]
        check_name(obj, f"{type(obj).__name__.lower()} {obj.uid}")


class Stage(_Extensible, _Stage):
    """EnTK's Stage: ``Stage()`` then ``add_tasks``; also shoal's ``Stage([tasks], name=...)``."""

    _name_rule = NameRule.ENTK

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_entk_uid", _next_uid("stage", 4))
        object.__setattr__(self, "_path", None)
        super().__init__(*args, **kwargs)

    uid = property(lambda self: self._entk_uid, lambda self, v: None)
    path_uid = property(lambda self: self._path)
    luid = path_uid
    from_dict = _from_dict

    def bind_path(self, path: str) -> None:
        object.__setattr__(self, "_path", path)

    def as_dict(self) -> dict:
        return {"uid": self.uid, "name": self.name, "state": "DESCRIBED" if self._path is None else "SCHEDULING"}

    to_dict = as_dict


class Pipeline(_Extensible, _Pipeline):
    """EnTK's Pipeline: ``Pipeline()`` then ``add_stages``; ``suspend()``/``resume()``."""

    _name_rule = NameRule.ENTK

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_entk_uid", _next_uid("pipeline", 4))
        object.__setattr__(self, "_path", None)
        object.__setattr__(self, "_state", PipelineState.DESCRIBED)
        object.__setattr__(self, "_state_history", [PipelineState.DESCRIBED])
        super().__init__(*args, **kwargs)

    uid = property(lambda self: self._entk_uid, lambda self, v: None)
    path_uid = property(lambda self: self._path)
    luid = path_uid
    from_dict = _from_dict

    def as_dict(self) -> dict:
        return {"uid": self.uid, "name": self.name, "state": self.state, "state_history": self.state_history}

    to_dict = as_dict

    def bind_path(self, path: str) -> None:
        object.__setattr__(self, "_path", path)
        if self._state is PipelineState.DESCRIBED:
            self._move(PipelineState.SCHEDULING)

    @property
    def state(self) -> str:
        return self._state.value

    @property
    def state_history(self) -> list[str]:
        return [s.value for s in self._state_history]

    @property
    def suspended(self) -> bool:
        return self._state is PipelineState.SUSPENDED

    def _move(self, state: PipelineState) -> None:
        object.__setattr__(self, "_state", state)
        self._state_history.append(state)

    def suspend(self) -> None:
        """EnTK's suspend(): running tasks go on; no further stage of this pipeline starts until
        ``resume()`` (the walker waits; a run whose only pipelines are suspended raises)."""
        if self._state is PipelineState.SUSPENDED:
            raise EnsembleError(f"suspend() called on suspended Pipeline {self.uid}")
        if self._state in (PipelineState.DONE, PipelineState.FAILED, PipelineState.CANCELED):
            raise EnsembleError(f"suspend() called on finished Pipeline {self.uid} ({self.state})")
        self._move(PipelineState.SUSPENDED)

    def resume(self) -> None:
        """EnTK's resume(): the pipeline goes on from where it was suspended."""
        if self._state is not PipelineState.SUSPENDED:
            raise EnsembleError(f"Cannot resume Pipeline {self.uid}: not suspended [{self.state}]")
        self._move(self._state_history[-2])

    def settle(self, state: TaskState) -> None:
        """The walker reports the pipeline's end."""
        self._move({TaskState.DONE: PipelineState.DONE, TaskState.FAILED: PipelineState.FAILED}.get(
            state, PipelineState.CANCELED))


Stage._ATTRS = _attrs(_Stage) | {"uid", "luid"}
Pipeline._ATTRS = _attrs(_Pipeline) | {"uid", "luid"}
