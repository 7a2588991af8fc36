"""The ensemble model: Task, Stage, Pipeline (the RADICAL-EnTK PST model) and their validation.

Data flow: the user builds ``Pipeline``s of ``Stage``s of ``Task``s (plain
objects, no I/O); ``engine.run`` walks them.  A Stage's ``tasks`` may be any
iterable — a generator is consumed lazily, a window at a time, which is how a
million-task stage runs in bounded driver memory.  A workflow is a Pipeline,
a list of them, or an iterable (also lazy) of them.

Identity: every task has a *uid* ``"pipeline.stage.task"``.  Names default to
``p<i>`` / ``s<j>`` / ``t<k>`` by position, so re-running the same workflow
script yields the same uids — which is what makes the journal (and resume)
work.  Names may not contain ``.``, ``/``, ``$`` or whitespace.

Invariants checked here (``Task.validate``), each error naming the task and
field: exactly one of ``executable``/``function``; ``cores >= 1``,
``gpus >= 0``, ``memory >= 0``; ``retries >= 0``; callables where callables
are expected; staging references well formed.

Rejected alternatives: string states (Enums instead, see ``TaskState``);
one class per task kind (a single ``Task`` with a ``kind`` property keeps
``on_retry`` able to change anything, EnTK-style); dependencies as a global
DAG (EnTK's stage barrier + explicit ``after=`` keeps the driver's state
per pipeline, so lazily generated workflows stay bounded).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import inspect
import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import shoal
from shoal._backoff import RetryDelay, check_retry_delay

NAME_RE = re.compile(r"^[A-Za-z0-9_\-:+@%=,]+$")
REF_RE = re.compile(r"^\$([^./\s$]+)\.([^./\s$]+)\.([^./\s$]+)(?:/(.*))?$")
# a reference inside a longer argument (a shell line): "$p.s.t" or "$p.s.t/some/path"
EMBEDDED_REF_RE = re.compile(r"\$([A-Za-z0-9_\-:+@%=,~#]+)\.([A-Za-z0-9_\-:+@%=,~#]+)\.([A-Za-z0-9_\-:+@%=,~#]+)"
                             r"((?:/[A-Za-z0-9_\-.+@%=,]+)*)")


class NameRule(enum.Enum):
    """Which names a class accepts: shoal's own (they are their journal keys as they are) or
    RADICAL-EnTK's (any text without the punctuation EnTK refuses; mapped by ``name_key``)."""

    SHOAL = "shoal"
    ENTK = "entk"


# EnTK refuses every ASCII punctuation mark but '.' in a name (task.py/stage.py/pipeline.py:
# ``punctuation.replace('.', '')``): '_' separates the parts of its $Pipeline_p_Stage_s_Task_t
# references.  shoal's own names may hold _-:+@%=, and the classes mix, so the EnTK rule here
# refuses only what both refuse: a script EnTK accepts is accepted, and so is a shoal name.
ENTK_REFUSED = frozenset("!\"#$&'()*/;<>?[\\]^`{|}~")
_KEY_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-:+@%=,")


def name_key(name: str) -> str:
    """A name as its journal key and directory name: itself when it is a shoal name, else each
    character outside shoal's set as ``~XX`` (its UTF-8 bytes in hex): ``'my.task'`` ->
    ``'my~2Etask'``.  Injective, and the identity on shoal's names (which never hold '~'), so
    journals written before EnTK names were accepted keep their keys.

    Rejected: allowing '.' in keys (a uid ``p.s.t`` splits on '.'; ``$p.s.t/file`` references
    and ``sandbox/p/s/t`` directories follow from it) and percent-encoding (``%`` is a legal
    shoal name character, so old names holding it would change key)."""
    if NAME_RE.match(name):
        return name
    return "".join(c if c in _KEY_SAFE else "".join(f"~{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in name)


def check_name(obj, who: str) -> None:
    """EnsembleError unless ``obj.name`` is None/'' or a name its class's ``NameRule`` accepts."""
    name = obj.name
    if name is None or name == "":
        return
    if obj._name_rule is NameRule.ENTK:
        if not isinstance(name, str):
            raise EnsembleError(f"{who}: name must be a string, got {name!r}")
        bad = sorted(set(name) & ENTK_REFUSED)
        if bad:
            raise EnsembleError(f"{who}: name {name!r} holds {' '.join(bad)}; EnTK names are letters, "
                                "digits, '.' and spaces (shoal also takes _-:+@%=,)")
        return
    if not (isinstance(name, str) and NAME_RE.match(name)):
        raise EnsembleError(f"{who}: name {name!r} must be letters, digits or _-:+@%=, (no '.', '/', '$')")


_CREATED = itertools.count()  # creation order of Tasks/Stages/Pipelines: how a set of them is ordered
# (EnTK scripts write add_tasks(set([...])) and workflow = set([p1, p2]); a set iterates in hash
# order, and these objects hash by address: another order in every process, so positional names
# p<i>/t<k> and a resume would not match the run they continue)


def in_creation_order(items) -> list:
    """A set or frozenset of model objects as a list in the order they were created."""
    return sorted(items, key=lambda x: getattr(x, "_order", 0))


class EnsembleError(shoal.ShoalError, ValueError):
    """A workflow that cannot run as written (bad field, unknown reference, journal mismatch)."""


class TaskKind(enum.Enum):
    EXECUTABLE = "executable"
    FUNCTION = "function"


class TaskState(enum.Enum):
    """Life of a task.  Terminal: DONE, FAILED, SKIPPED, CANCELED."""

    PENDING = "pending"  # known, not started (also: never journaled)
    RUNNING = "running"  # journaled before the process/future starts
    DONE = "done"
    FAILED = "failed"  # retries exhausted
    SKIPPED = "skipped"  # when= was false, or a dependency failed/was skipped
    CANCELED = "canceled"  # pipeline stopped by post_exec, or run aborted

    @property
    def terminal(self) -> bool:
        return self in (TaskState.DONE, TaskState.FAILED, TaskState.SKIPPED, TaskState.CANCELED)


class FailureKind(enum.Enum):
    EXIT_CODE = "exit_code"  # executable exited non-zero / died of a signal
    EXCEPTION = "exception"  # function raised
    TIMEOUT = "timeout"
    SPAWN = "spawn"  # executable missing / not executable
    SANDBOX = "sandbox"  # sandbox directory could not be created
    STAGING = "staging"  # an input could not be staged / an output is missing
    WORKER_LOST = "worker_lost"
    DEPENDENCY = "dependency"  # an after= dependency did not complete


class Staging(enum.Enum):
    COPY = "copy"
    LINK = "link"  # symbolic link
    MOVE = "move"


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why one attempt of a task failed; given to ``on_retry`` and listed in the Report."""

    kind: FailureKind
    message: str
    exit_code: int | None = None
    stderr_tail: str = ""
    attempt: int = 1


@dataclasses.dataclass(frozen=True)
class Input:
    """One file staged into a task's sandbox before it starts."""

    source: str  # "$pipeline.stage.task/path" or a plain path
    target: str  # relative to the sandbox
    mode: Staging = Staging.COPY


def parse_size(value: int | str | None, what: str) -> int:
    """``512``, ``"512M"``, ``"2G"`` -> bytes (ints are bytes)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise EnsembleError(f"{what}: expected bytes or a size like '2G', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise EnsembleError(f"{what}: must be >= 0, got {value}")
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.I)
    if not m:
        raise EnsembleError(f"{what}: expected bytes or a size like '512M' or '2G', got {value!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def check_policy(obj, who: str) -> None:
    """EnsembleError naming ``who`` unless ``obj``'s ``priority`` is an integer (or None) and
    its ``retry_delay`` seconds >= 0, a ``shoal.Backoff`` or None."""
    p = obj.priority
    if p is not None and (not isinstance(p, int) or isinstance(p, bool)):
        raise EnsembleError(f"{who}: priority must be an integer (higher starts first), got {p!r}")
    try:
        check_retry_delay(obj.retry_delay, who)
    except ValueError as exc:
        raise EnsembleError(str(exc)) from None


def parse_ref(text: str) -> tuple[str, str] | None:
    """``"$p.s.t/out.dat"`` -> (``"p.s.t"``, ``"out.dat"``); None if not a reference."""
    m = REF_RE.match(text)
    if not m:
        return None
    return f"{m.group(1)}.{m.group(2)}.{m.group(3)}", m.group(4) or ""


def _ref_uid(item: Any, what: str) -> str:
    if isinstance(item, str):
        return item
    uid = getattr(item, "path_uid", None)
    if uid is None:
        raise EnsembleError(
            f"{what}: {item!r} has no uid yet; add it to a Stage/Pipeline first or name it by uid string"
        )
    return uid


@dataclasses.dataclass(eq=False)
class Task:
    """One executable or function call with its resource needs.

    Executable: ``Task(executable="/bin/echo", arguments=["hi"])``; function:
    ``Task(function=f, args=(1,), kwargs={})``.  ``after``: tasks/stages/
    pipelines (objects or uid strings) that must be DONE first; ``when``:
    ``callable(results) -> bool`` evaluated right before the task would start.
    """

    executable: str | None = None
    arguments: Sequence[str] = ()
    function: Callable | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str | None = None
    environment: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pre_exec: Sequence[str] = ()
    post_exec: Sequence[str] = ()
    stdin: str | None = None
    cores: int = 1
    ranks: int | None = None  # an MPI task: this many ranks (mpi.py), cores_per_rank cores each
    cores_per_rank: int = 1
    gpus: int = 0
    memory: int | str = 0
    timeout: float | None = None
    estimate: float | None = None  # expected seconds, for walltime draining
    retries: int | None = None  # None: the stage's, else run(retries=), else 0
    retry_delay: RetryDelay = None  # seconds or shoal.Backoff before each retry; None: the stage's/run's
    priority: int | None = None  # higher starts first among ready tasks; None: the stage's
    on_retry: Callable[[Task, Failure], Task] | None = None
    inputs: Sequence[str | Input | tuple] = ()
    outputs: Sequence[str] = ()
    after: Sequence[Any] = ()
    when: Callable[[Any], bool] | None = None
    tags: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stage_out: Sequence[tuple[str, str]] = ()  # (file in the sandbox, destination) copied before DONE
    uid: str | None = dataclasses.field(default=None, init=False)
    _order: int = dataclasses.field(default_factory=lambda: next(_CREATED), init=False, repr=False, compare=False)
    _name_rule: ClassVar[NameRule] = NameRule.SHOAL
    _shell: ClassVar[bool] = False  # EnTK's tasks run `executable arguments` in a shell (launcher.command)

    def __setattr__(self, name: str, value) -> None:
        if name not in _TASK_ATTRS:
            raise _unknown_attr(self, name, _TASK_ATTRS, ENTK_TASK_UNSUPPORTED)
        object.__setattr__(self, name, value)

    # -- the RADICAL-EnTK attribute style (entk.py documents the mapping) -------------
    @property
    def cpu_reqs(self) -> dict:
        if self.ranks is not None:
            return {"cpu_processes": self.ranks, "cpu_process_type": "MPI",
                    "cpu_threads": self.cores_per_rank, "cpu_thread_type": None}
        return {"cpu_processes": 1, "cpu_process_type": None, "cpu_threads": self.cores,
                "cpu_thread_type": None}

    @cpu_reqs.setter
    def cpu_reqs(self, reqs) -> None:
        procs, threads = _reqs(self, "cpu_reqs", reqs, "cpu")
        if _is_mpi(reqs):  # EnTK's MPI task: procs ranks of threads cores each
            self.ranks, self.cores_per_rank, self.cores = max(1, procs), max(1, threads), 1
        else:
            self.ranks, self.cores_per_rank = None, 1
            self.cores = max(1, procs) * max(1, threads)

    @property
    def gpu_reqs(self) -> dict:
        return {"gpu_processes": self.gpus, "gpu_process_type": None, "gpu_threads": 1,
                "gpu_thread_type": None}

    @gpu_reqs.setter
    def gpu_reqs(self, reqs) -> None:
        procs, threads = _reqs(self, "gpu_reqs", reqs, "gpu")
        self.gpus = procs * max(1, threads) if procs else 0

    def _entk_inputs(self, field: str, mode: Staging, value) -> None:
        self.inputs = [i for i in self.staged_inputs() if getattr(i, "_entk", None) != field] + [
            _entk_input(self, field, v, mode) for v in _entk_list(self, field, value)]

    def _entk_outputs(self, value, field: str) -> None:
        pairs = []
        for v in _entk_list(self, field, value):
            src, dst = _split_arrow(v)
            pairs.append((src, dst or os.path.basename(src)))
        self.stage_out = pairs

    upload_input_data = property(lambda self: [i.source for i in self.staged_inputs()],
                                 lambda self, v: self._entk_inputs("upload_input_data", Staging.COPY, v))
    copy_input_data = property(lambda self: [i.source for i in self.staged_inputs()],
                               lambda self, v: self._entk_inputs("copy_input_data", Staging.COPY, v))
    link_input_data = property(lambda self: [i.source for i in self.staged_inputs()],
                               lambda self, v: self._entk_inputs("link_input_data", Staging.LINK, v))
    move_input_data = property(lambda self: [i.source for i in self.staged_inputs()],
                               lambda self, v: self._entk_inputs("move_input_data", Staging.MOVE, v))
    download_output_data = property(lambda self: list(self.stage_out),
                                    lambda self, v: self._entk_outputs(v, "download_output_data"))
    copy_output_data = property(lambda self: list(self.stage_out),
                                lambda self, v: self._entk_outputs(v, "copy_output_data"))

    @property
    def kind(self) -> TaskKind:
        return TaskKind.FUNCTION if self.function is not None else TaskKind.EXECUTABLE

    @property
    def mpi(self) -> bool:
        """An MPI task (``ranks=`` given): its ranks are started by the run's launcher (mpi.py)."""
        return self.ranks is not None

    @property
    def reserved_cores(self) -> int:
        """The cores the task holds while it runs: ``ranks * cores_per_rank`` for an MPI task."""
        return self.ranks * self.cores_per_rank if self.ranks is not None else self.cores

    @property
    def memory_bytes(self) -> int:
        m = self.memory
        if m is None or (type(m) is int and m >= 0):  # the common case (default 0), asked several
            return m or 0  # times per task: no message built, no parsing
        return parse_size(m, f"task {self.label}: memory")

    @property
    def label(self) -> str:
        return self.path_uid or self.name or "<unnamed task>"

    # where the launcher writes stdout/stderr (names in the sandbox) and a sandbox several tasks
    # share (None: the task's own <root>/p/s/t); EnTK's Task sets them (entk_model.py)
    stdout_file = property(lambda self: "stdout")
    stderr_file = property(lambda self: "stderr")
    sandbox_dir = property(lambda self: None)

    def settle(self, state: TaskState, exit_code: int | None) -> None:
        """Told by the engine when the task is terminal (EnTK's Task keeps state and exit code)."""

    @property
    def path_uid(self) -> str | None:
        """The ``pipeline.stage.task`` key the run gives this task (its journal row, its sandbox
        ``<root>/pipeline/stage/task``); None before the run reaches it.  EnTK's classes keep
        their own ``uid`` (``task.000000``) and hold this one apart (entk_model.py)."""
        return self.uid

    def bind_path(self, path: str) -> None:
        """Set by the walker when the run reaches this task (see ``path_uid``)."""
        object.__setattr__(self, "uid", path)

    def replace(self, **changes) -> Task:
        """A copy with ``changes`` (what an ``on_retry`` hook usually returns)."""
        new = dataclasses.replace(self, **changes)
        new.uid = self.uid
        return new

    def staged_inputs(self) -> list[Input]:
        out = []
        for item in self.inputs:
            if isinstance(item, Input):
                out.append(item)
            elif isinstance(item, str):
                ref = parse_ref(item)
                target = (ref[1] if ref else item).rsplit("/", 1)[-1]
                out.append(Input(item, target))
            elif isinstance(item, tuple) and 2 <= len(item) <= 3:
                mode = Staging(item[2]) if len(item) == 3 else Staging.COPY
                out.append(Input(item[0], item[1], mode))
            else:
                raise EnsembleError(
                    f"task {self.label}: inputs entries are 'path', (source, target[, Staging]) "
                    f"or Input(...), got {item!r}"
                )
        return out

    def _no_unresolved_refs(self, who: str) -> None:
        """A ``$p.s.t/file`` reference where none is resolved: in a pre_exec/post_exec line the
        shell expanded ``$p`` to nothing (``cp: cannot stat '.sim.r0/out.txt'``), in the
        environment the task got the text itself.  Refused, saying where references work."""
        where = [(f"pre_exec line {x!r}", x) for x in self.pre_exec]
        where += [(f"post_exec line {x!r}", x) for x in self.post_exec]
        if isinstance(self.environment, Mapping):
            where += [(f"environment {k}={v!r}", v) for k, v in self.environment.items() if isinstance(v, str)]
        for what, text in where:
            m = EMBEDDED_REF_RE.search(text) if "$" in text else None
            if m:
                raise EnsembleError(
                    f"{who}: {what} holds the reference ${m[1]}.{m[2]}.{m[3]}, which is not resolved "
                    "there; references work in arguments, stdin, inputs and a function's args/kwargs: "
                    "stage the file with inputs=[...] and use its name")

    def validate(self) -> None:
        """Raise EnsembleError naming this task and the bad field; return None when fine."""
        who = f"task {self.label}"
        if (self.executable is None) == (self.function is None):
            raise EnsembleError(f"{who}: give exactly one of executable= or function=")
        if self.executable is not None:
            if not isinstance(self.executable, str) or not self.executable:
                raise EnsembleError(f"{who}: executable must be a non-empty string, got {self.executable!r}")
            if isinstance(self.arguments, str) or not all(isinstance(a, str | int | float) for a in self.arguments):
                raise EnsembleError(f"{who}: arguments must be a list of strings, got {self.arguments!r}")
            for field in ("pre_exec", "post_exec"):
                v = getattr(self, field)
                if isinstance(v, str) or not all(isinstance(x, str) for x in v):
                    raise EnsembleError(f"{who}: {field} must be a list of shell lines, got {v!r}")
            self._no_unresolved_refs(who)
        else:
            if not callable(self.function):
                raise EnsembleError(f"{who}: function must be callable, got {self.function!r}")
            if self.pre_exec or self.post_exec or self.stdin:
                raise EnsembleError(f"{who}: pre_exec/post_exec/stdin apply to executables only")
        check_name(self, who)
        for field, low in (("cores", 1), ("gpus", 0), ("retries", 0)):
            v = getattr(self, field)
            if field == "retries" and v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise EnsembleError(f"{who}: {field} must be an integer >= {low}, got {v!r}")
        check_policy(self, who)
        if self.ranks is not None or self.cores_per_rank != 1:
            for field in ("ranks", "cores_per_rank"):
                v = getattr(self, field)
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise EnsembleError(f"{who}: {field} must be an integer >= 1, got {v!r}")
            if self.function is not None:
                raise EnsembleError(f"{who}: ranks= applies to executables (the launcher starts "
                                    "the program on each rank); run an mpi4py script as an "
                                    "executable task (docs/hpc.md, MPI tasks)")
            if self.cores != 1:
                raise EnsembleError(f"{who}: an MPI task's cores are ranks x cores_per_rank; give "
                                    f"cores_per_rank= instead of cores={self.cores!r}")
        for field in ("timeout", "estimate"):
            v = getattr(self, field)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)
                                  or not math.isfinite(v) or v <= 0):
                raise EnsembleError(f"{who}: {field} must be a finite number of seconds > 0, got {v!r}")
        self.memory_bytes  # noqa: B018 - parse for the error
        for field in ("on_retry", "when"):
            v = getattr(self, field)
            if v is not None and not callable(v):
                raise EnsembleError(f"{who}: {field} must be callable, got {v!r}")
        if not isinstance(self.environment, Mapping):
            raise EnsembleError(f"{who}: environment must be a mapping, got {self.environment!r}")
        for k in self.environment:  # execve would make 'A=B': 'c' the variable A, '' a nameless one
            if not isinstance(k, str) or not k or "=" in k or "\0" in k:
                raise EnsembleError(f"{who}: environment variable names must be non-empty strings "
                                    f"without '=' or NUL, got {k!r}")
        for inp in self.staged_inputs():
            if inp.source.startswith("$") and parse_ref(inp.source) is None and not (
                    inp.source == "$SHARED" or inp.source.startswith("$SHARED/")):
                raise EnsembleError(
                    f"{who}: input {inp.source!r} is not a reference '$pipeline.stage.task/path'"
                )
            if not inp.target or inp.target.startswith("/") or ".." in inp.target.split("/"):
                raise EnsembleError(f"{who}: input target {inp.target!r} must be a path inside the sandbox")
        if isinstance(self.outputs, str):
            raise EnsembleError(f"{who}: outputs must be a list of file names, got {self.outputs!r}")
        for pair in self.stage_out:
            if not (isinstance(pair, tuple | list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise EnsembleError(f"{who}: stage_out entries are (file in the sandbox, destination), got {pair!r}")
            if pair[0].startswith("/") or ".." in pair[0].split("/"):
                raise EnsembleError(f"{who}: stage_out source {pair[0]!r} must be a path inside the sandbox")

    def dependency_uids(self) -> list[str]:
        return [_ref_uid(a, f"task {self.label}: after") for a in self.after]


@dataclasses.dataclass(eq=False)
class Stage:
    """Tasks that run concurrently; the next stage starts when all of them are terminal.

    ``post_exec(ctx)`` runs in the driver after the stage; ``ctx`` (a
    ``StageContext``) can read results, ``append`` stages to this pipeline,
    ``add_pipeline``, or ``stop()`` the pipeline.  EnTK's no-argument
    ``post_exec()`` works too (it usually calls ``pipeline.add_stages``).
    """

    tasks: Iterable[Task] = dataclasses.field(default_factory=list)
    name: str | None = None
    post_exec: Callable[..., None] | None = None
    after: Sequence[Any] = ()
    when: Callable[[Any], bool] | None = None
    priority: int = 0  # its tasks' priority, where a task gives none
    retries: int | None = None  # its tasks' retries, where a task gives none (None: run(retries=))
    retry_delay: RetryDelay = None  # its tasks' retry_delay, where a task gives none
    uid: str | None = dataclasses.field(default=None, init=False)
    _order: int = dataclasses.field(default_factory=lambda: next(_CREATED), init=False, repr=False, compare=False)
    _name_rule: ClassVar[NameRule] = NameRule.SHOAL

    def __setattr__(self, name: str, value) -> None:
        if name not in _STAGE_ATTRS:
            raise _unknown_attr(self, name, _STAGE_ATTRS, {})
        if name == "tasks" and isinstance(value, set | frozenset):
            value = in_creation_order(value)  # EnTK's s.tasks = set([...])
        object.__setattr__(self, name, value)

    def add_tasks(self, *tasks) -> Stage:
        """Add a Task, several, or a list/set of them (EnTK's ``add_tasks(t)`` / ``add_tasks([...])``)."""
        flat = _flatten(tasks, Task, f"stage {self.name or '<unnamed>'}: add_tasks")
        if isinstance(self.tasks, tuple):
            self.tasks = list(self.tasks)
        if not isinstance(self.tasks, list):
            raise EnsembleError(f"stage {self.name or '<unnamed>'}: add_tasks cannot add to a lazy "
                                f"{type(self.tasks).__name__} of tasks; give all of them to Stage(tasks=...)")
        self.tasks.extend(flat)
        return self

    path_uid = property(lambda self: self.uid, doc="``pipeline.stage``: see Task.path_uid")

    def bind_path(self, path: str) -> None:
        object.__setattr__(self, "uid", path)

    def post_exec_arity(self) -> int:
        """0 for EnTK's ``post_exec()``, 1 for ``post_exec(ctx)``; EnsembleError otherwise."""
        return _arity(self.post_exec, f"stage {self.path_uid or self.name or '<unnamed>'}: post_exec")

    def validate(self) -> None:
        who = f"stage {self.path_uid or self.name or '<unnamed>'}"
        check_name(self, who)
        if isinstance(self.tasks, Task | str | bytes) or not isinstance(self.tasks, Iterable):
            raise EnsembleError(f"{who}: tasks must be an iterable of Task, got {self.tasks!r}")
        for field in ("post_exec", "when"):
            v = getattr(self, field)
            if v is not None and not callable(v):
                raise EnsembleError(f"{who}: {field} must be callable, got {v!r}")
        if self.post_exec is not None:
            self.post_exec_arity()
        if self.retries is not None and (not isinstance(self.retries, int) or isinstance(self.retries, bool)
                                         or self.retries < 0):
            raise EnsembleError(f"{who}: retries must be an integer >= 0, got {self.retries!r}")
        check_policy(self, who)

    def dependency_uids(self) -> list[str]:
        return [_ref_uid(a, f"stage {self.uid}: after") for a in self.after]


@dataclasses.dataclass(eq=False)
class Pipeline:
    """An ordered list of stages (``add_stages`` may be called by a post_exec callback)."""

    stages: list[Stage] = dataclasses.field(default_factory=list)
    name: str | None = None
    after: Sequence[Any] = ()
    uid: str | None = dataclasses.field(default=None, init=False)
    _order: int = dataclasses.field(default_factory=lambda: next(_CREATED), init=False, repr=False, compare=False)
    _name_rule: ClassVar[NameRule] = NameRule.SHOAL

    def __post_init__(self):
        stages = self.stages
        self.stages = in_creation_order(stages) if isinstance(stages, set | frozenset) else list(stages)

    def __setattr__(self, name: str, value) -> None:
        if name not in _PIPELINE_ATTRS:
            raise _unknown_attr(self, name, _PIPELINE_ATTRS, {})
        object.__setattr__(self, name, value)

    path_uid = property(lambda self: self.uid, doc="the pipeline's key: see Task.path_uid")

    def bind_path(self, path: str) -> None:
        object.__setattr__(self, "uid", path)

    def add_stages(self, *stages) -> Pipeline:
        """Add a Stage, several, or a list of them (also from a running ``post_exec``)."""
        self.stages.extend(_flatten(stages, Stage, f"pipeline {self.name or '<unnamed>'}: add_stages"))
        return self

    def validate(self) -> None:
        who = f"pipeline {self.path_uid or self.name or '<unnamed>'}"
        check_name(self, who)
        for s in self.stages:
            if not isinstance(s, Stage):
                raise EnsembleError(f"{who}: stages must be Stage objects, got {s!r}")

    def dependency_uids(self) -> list[str]:
        return [_ref_uid(a, f"pipeline {self.uid}: after") for a in self.after]


def as_pipelines(workflow) -> Iterable[Pipeline]:
    """A Pipeline, a list/iterable of them (lazy), or a callable returning one of those."""
    if callable(workflow) and not isinstance(workflow, Pipeline):
        workflow = workflow()
    if isinstance(workflow, Pipeline):
        return [workflow]
    if isinstance(workflow, Stage | Task):
        raise EnsembleError(
            f"a workflow is Pipeline(s); wrap this {type(workflow).__name__} as Pipeline([Stage([...])])"
        )
    if not isinstance(workflow, Iterable):
        raise EnsembleError(f"a workflow is a Pipeline or an iterable of them, got {workflow!r}")
    if isinstance(workflow, set | frozenset):
        return in_creation_order(workflow)
    return workflow


# -- attribute checks and the EnTK vocabulary ------------------------------------------
ENTK_TASK_UNSUPPORTED = {
    "stdout": "shoal.ensemble writes a task's stdout to <sandbox>/stdout (read it with results.path(task, 'stdout')); shoal.entk.Task takes t.stdout",
    "stderr": "shoal.ensemble writes a task's stderr to <sandbox>/stderr; shoal.entk.Task takes t.stderr",
    "sandbox": "sandboxes are <journal>.sandbox/<pipeline>/<stage>/<task>; pass run(sandbox=root); shoal.entk.Task takes t.sandbox",
    "lfs_per_process": "local file-system space is not scheduled; drop it",
    "mem_per_process": "use memory= (bytes or '2G') for the whole task",
    "move_output_data": "use download_output_data / copy_output_data (copies), or stage_out",
    "tag": "placement tags are not supported; use after= for ordering",
    "executor": "the MPI launcher is chosen per run: run(launcher='srun'|'mpirun'|'none') "
                "(shoal run --launcher); ask for ranks with cpu_reqs' cpu_process_type='MPI'",
}


def _attrs(cls) -> frozenset:
    names = {f.name for f in dataclasses.fields(cls)}
    names |= {n for n in dir(cls) if isinstance(getattr(cls, n, None), property)}
    return frozenset(names)


def _unknown_attr(obj, name: str, allowed, reasons: dict) -> EnsembleError:
    what = type(obj).__name__
    if name in reasons:
        return EnsembleError(f"{what}.{name}: not supported by shoal: {reasons[name]}")
    public = sorted(a for a in allowed if not a.startswith("_"))
    close = difflib.get_close_matches(name, public, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return EnsembleError(f"{what} has no attribute {name!r}{hint}; it has: {', '.join(public)}")


def _flatten(items, cls, what: str) -> list:
    out = []
    for item in items:
        if isinstance(item, cls):
            out.append(item)
        elif isinstance(item, list | tuple | set | frozenset):
            for x in (in_creation_order(item) if isinstance(item, set | frozenset) else item):
                if not isinstance(x, cls):
                    raise EnsembleError(f"{what}: expected {cls.__name__} objects, got {x!r}")
                out.append(x)
        else:
            raise EnsembleError(f"{what}: expected a {cls.__name__} or a list of them, got {item!r}")
    return out


def _arity(fn, what: str) -> int:
    """How many positional arguments a callback takes: 0 (EnTK style) or 1 (``ctx``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1  # a builtin or C callable: assume the documented ctx form
    required = [p for p in sig.parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_any = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                    for p in sig.parameters.values())
    if len(required) > 1:
        raise EnsembleError(f"{what}: {getattr(fn, '__qualname__', fn)} takes {len(required)} required "
                            "arguments; a stage post_exec takes none (EnTK style) or one (the StageContext)")
    return 1 if takes_any and (required or len(sig.parameters) >= 1) else 0


_REQ_KEYS = {
    "cpu": {"cpu_processes": "p", "processes": "p", "cpu_threads": "t", "threads_per_process": "t",
            "cpu_process_type": "pt", "process_type": "pt", "cpu_thread_type": "tt", "thread_type": "tt"},
    "gpu": {"gpu_processes": "p", "processes": "p", "gpu_threads": "t", "threads_per_process": "t",
            "gpu_process_type": "pt", "process_type": "pt", "gpu_thread_type": "tt", "thread_type": "tt"},
}


def _reqs(task, field: str, reqs, kind: str) -> tuple[int, int]:
    """EnTK's ``cpu_reqs``/``gpu_reqs`` dict -> (processes, threads); unknown keys are errors."""
    who = f"task {task.label}: {field}"
    if not isinstance(reqs, Mapping):
        raise EnsembleError(f"{who}: expected a dict like {{'{kind}_processes': 1, '{kind}_threads': 2}}, "
                            f"got {reqs!r}")
    keys = _REQ_KEYS[kind]
    procs, threads = (1 if kind == "cpu" else 0), 1
    for key, value in reqs.items():
        role = keys.get(key)
        if role is None:
            close = difflib.get_close_matches(str(key), keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EnsembleError(f"{who}: unknown key {key!r}{hint}; allowed: {', '.join(keys)}")
        if role in ("p", "t"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise EnsembleError(f"{who}: {key} must be an integer >= 0, got {value!r}")
            if role == "p":
                procs = value
            else:
                threads = value
        elif value is not None and str(value).upper() == "MPI":
            if kind == "gpu" or role == "tt":
                raise EnsembleError(f"{who}: {key}='MPI': the ranks come from cpu_reqs' "
                                    "cpu_process_type='MPI'; give this one None, 'POSIX', "
                                    "'OpenMP' or 'CUDA'")
        elif value not in (None, "", "POSIX", "OpenMP", "CUDA"):
            raise EnsembleError(f"{who}: {key}={value!r}: expected None, 'POSIX', 'OpenMP' or 'CUDA'")
    return procs, threads


def _is_mpi(reqs) -> bool:
    return any(_REQ_KEYS["cpu"].get(k) == "pt" and v is not None and str(v).upper() == "MPI"
               for k, v in reqs.items())


def _split_arrow(text: str) -> tuple[str, str | None]:
    if ">" in text:
        src, dst = (x.strip() for x in text.split(">", 1))
        return src, dst or None
    return text.strip(), None


def _entk_list(task, field: str, value) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Iterable) or not all(isinstance(v, str) for v in value):
        raise EnsembleError(f"task {task.label}: {field} must be a list of strings like "
                            f"'source > target', got {value!r}")
    return list(value)


def entk_placeholder(text: str) -> tuple[str, str, str, str] | None:
    """EnTK's ``$Pipeline_<p>_Stage_<s>_Task_<t>/rest`` -> (p, s, t, rest); None for other text.

    Read the way EnTK's task processor reads it: the part before the first '/' split on '_'
    must give six parts, of which the 2nd, 4th and 6th are the pipeline, stage and task, each
    a name or an EnTK uid (``pipeline.0000``); the words between are not checked, so EnTK's
    own examples that write ``$Pipline_`` work there and here."""
    if not text.startswith("$") or text.startswith("$SHARED"):
        return None
    head, _, rest = text.partition("/")
    parts = head.split("_")
    if len(parts) != 6 or not parts[0].startswith("$"):
        return None
    return parts[1], parts[3], parts[5], rest


def _entk_input(task, field: str, text: str, mode: Staging) -> Input:
    src, dst = _split_arrow(text)
    found = entk_placeholder(src)
    if found is not None:
        p, s, t, rest = found
        unset = [w for w, v in (("pipeline", p), ("stage", s), ("task", t)) if v in ("None", "")]
        if unset:
            raise EnsembleError(
                f"task {task.label}: {field} {text!r} names no {' and no '.join(unset)} (a name that was "
                "never set); build the reference from names you set (p.name = 'sim') or from the uids "
                "(p.uid, s.uid, t.uid: given when an EnTK object is created)")
        target = dst or (rest.rsplit("/", 1)[-1] if rest else t)
        inp = _EntkInput(src, target, mode)
        object.__setattr__(inp, "_placeholder", found)
    else:
        if src.startswith("$") and not src.startswith("$SHARED") and parse_ref(src) is None:
            raise EnsembleError(f"task {task.label}: {field} {text!r}: not a reference "
                                "'$Pipeline_<p>_Stage_<s>_Task_<t>/file' or '$SHARED/file'")
        target = dst or (parse_ref(src) or ("", src))[1].rsplit("/", 1)[-1]
        inp = _EntkInput(src, target, mode)
        object.__setattr__(inp, "_placeholder", None)
    object.__setattr__(inp, "_entk", field)
    return inp


@dataclasses.dataclass(frozen=True)
class _EntkInput(Input):
    """An Input set through one of EnTK's ``*_input_data`` attributes (re-assignment replaces them).

    ``_placeholder`` is the (pipeline, stage, task, rest) of an EnTK reference: the walker
    resolves it when the run reaches the task, by EnTK uid first and then by name as EnTK's
    task processor does (walker.py ``EntkRefs``), into shoal's ``$p.s.t/rest``."""


_TASK_ATTRS = _attrs(Task)
_ENTK_STATE_KEYS = {"uid", "state", "state_history", "parent_stage", "parent_pipeline", "rts_uid", "exit_code",
                    "path"}  # what EnTK's to_dict() adds: bookkeeping of a run, not a description


def _task_init_with_from_dict(init):
    """EnTK's ``Task(from_dict={...})``: the keys are assigned one by one as attributes (the same
    checks and did-you-means as ``t.executable = ...``); a run's bookkeeping from EnTK's
    ``to_dict()`` (uid, state, ...) is dropped, as EnTK drops it for a new task."""
    def __init__(self, *args, from_dict=None, **kwargs):
        init(self, *args, **kwargs)
        if from_dict is None:
            return
        if not isinstance(from_dict, Mapping):
            raise EnsembleError(f"Task(from_dict=...) takes a dict, got {from_dict!r}")
        for key, value in from_dict.items():
            if key not in _ENTK_STATE_KEYS:
                setattr(self, key, value)
    __init__.__doc__ = init.__doc__
    return __init__


Task.__init__ = _task_init_with_from_dict(Task.__init__)
_STAGE_ATTRS = _attrs(Stage)
_PIPELINE_ATTRS = _attrs(Pipeline)
