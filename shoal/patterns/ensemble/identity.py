"""A run's identity: which workflow a journal holds, so a resume never merges two workflows.

Pure (no I/O).  Two parts, both recorded in the journal:

* the **plan**: pipelines, their stages and each stage's task count (``None``
  for a lazy stage), in order — what ``shoal status`` shows for stages that
  have not started — and its **identity**, a hash of the plan plus every
  listed task's *spec*;
* each task's **spec**: what it runs (kind, executable and arguments, or the
  function's ``module:qualname`` and a fingerprint of its arguments, the
  environment, shell lines, staging), stored in the task's journal row.

Resource fields (cores, memory, timeout, retries) are not in the spec: giving
a task more memory and resuming is a legitimate fix, not another workflow.

A resume compares the identity first (a listed workflow: the whole structure
at once) and then each task's spec as the walker pulls it (lazy stages, stages
appended by ``post_exec``), and refuses a difference with a message that says
what differs (``diff``).

Rejected alternative: hashing the workflow file's text (a comment or a
reordered import would refuse a resume; a computed argument would not).
"""

from __future__ import annotations

import hashlib
import json

from .model import EnsembleError, NameRule, Pipeline, Task, name_key

MAX_NODES = 1_000_000  # values, lists and keys one argument may hold, shared ones at every use


def fingerprint(value) -> str:
    """A stable short hash of plain data (by its data encoding), else its type's name.

    Stable across processes: a set's elements are encoded in a canonical order (their
    iteration order follows str hashes, which change per process, so a function task given
    a set of names had another spec in every process and its run could never be resumed).

    Bounded: a value of more than ``MAX_NODES`` nodes, counting a shared list at each of its
    uses as the encoding does, is an ``EnsembleError`` (10 lists of 10 aliases of each other
    nine deep are 10**9 leaves in 669 bytes of YAML: the hash spun for ever)."""
    from .values import _pack

    canonical = _canonical(value, [MAX_NODES])  # (its EnsembleError is a ValueError: not caught)
    try:
        blob = _pack(canonical)
    except (TypeError, ValueError, OverflowError):
        return f"<{type(value).__qualname__}>"
    return hashlib.sha1(blob).hexdigest()[:16]


def _canonical(value, budget: list):
    """``value`` with every set/frozenset replaced by ``(tag, its elements sorted by their
    encoding)``; other containers rebuilt only when they hold one.  ``budget[0]``: nodes
    left (each visit spends one; below zero: ``EnsembleError``)."""
    from .values import _pack

    budget[0] -= 1
    if budget[0] < 0:
        raise EnsembleError(f"a task's argument holds more than {MAX_NODES:,} values (counting a "
                            "shared list at each use, as YAML aliases expand): too large for the "
                            "run's identity; pass a file name or an array instead")
    t = type(value)
    if t is set or t is frozenset:
        items = [_canonical(x, budget) for x in value]
        return (f"\0{t.__name__}", sorted(items, key=_pack))
    if t is list or t is tuple:
        items = [_canonical(x, budget) for x in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else t(items)
    if t is dict:
        budget[0] -= len(value)  # the keys
        items = {k: _canonical(v, budget) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    return value


def task_spec(task: Task) -> dict:
    """What ``task`` runs, as a small JSON-able dict (see the module docstring)."""
    if task.function is not None:
        fn = task.function
        spec = {"function": f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}",
                "args": [fingerprint(_plain(a)) for a in task.args],
                "kwargs": {k: fingerprint(_plain(v)) for k, v in sorted(dict(task.kwargs).items())}}
    else:
        spec = {"executable": task.executable, "arguments": [str(a) for a in task.arguments]}
        if task.pre_exec:
            spec["pre_exec"] = list(task.pre_exec)
        if task.post_exec:
            spec["post_exec"] = list(task.post_exec)
        if task.stdin:
            spec["stdin"] = task.stdin
    if task.environment:
        spec["environment"] = {k: str(v) for k, v in sorted(dict(task.environment).items())}
    if task.inputs:
        spec["inputs"] = [[i.source, i.target, i.mode.value] for i in task.staged_inputs()]
    if task.outputs:
        spec["outputs"] = list(task.outputs)
    return spec


def _plain(value):
    """Task objects among arguments are references: name them by uid."""
    if isinstance(value, Task):
        return f"<task {value.path_uid}>"
    return value


_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode  # json.dumps with these
# options builds a new encoder per call; this is called once or twice per task


def spec_text(task: Task) -> str:
    return _ENCODE(task_spec(task))


_AMBIGUOUS = "\0ambiguous"


class Names:
    """The final names in one scope — the workflow's pipelines, a pipeline's stages, a stage's
    tasks — explicit or the positional default ``<prefix><position>``, as journal keys
    (model.name_key: an EnTK name such as ``'my.task'`` becomes ``'my~2Etask'``).

    Two of shoal's items with one name would share a uid and one of them would silently never
    run, so a clash is an error naming both.  EnTK allows duplicate names (its uids tell them
    apart): an EnTK item whose key is taken gets ``<key>#<position>`` — stable from run to run
    as the default names are, so a resume finds it again.  Only explicit names (and EnTK uids,
    for references: ``lookup``) are stored; a million unnamed shoal tasks cost nothing here."""

    __slots__ = ("prefix", "what", "explicit", "named", "refs", "uids")

    def __init__(self, prefix: str, what: str):
        self.prefix, self.what = prefix, what  # "t", "task"
        self.explicit: dict[str, int] = {}  # explicit key -> position
        self.named: set[int] = set()  # positions that have an explicit name
        self.refs: dict[str, str] = {}  # explicit name -> key (_AMBIGUOUS when two items have it)
        self.uids: dict[str, str] = {}  # EnTK uid -> key

    def claim(self, item, position: int, scope: str) -> str:
        """The final key of ``item`` (a Task/Stage/Pipeline) at ``position``; EnsembleError if
        another of shoal's items has it."""
        name = getattr(item, "name", None) or None
        entk = getattr(item, "_name_rule", NameRule.SHOAL) is NameRule.ENTK
        if name is not None and not isinstance(name, str):
            return str(name)  # validate() refuses it next, naming the field
        key = self._claim(None if name is None else name_key(name), position, scope, entk)
        if name is not None:
            self.refs[name] = key if self.refs.get(name, key) == key else _AMBIGUOUS
        if entk:
            self.uids[item.uid] = key
        return key

    def lookup(self, ident: str) -> str:
        """The key an EnTK reference's part names: by EnTK uid first, then by name (EnTK's task
        processor resolves by uid, then by name), else the text as a key (``t0``, a shoal name)."""
        key = self.uids.get(ident) or self.refs.get(ident)
        if key == _AMBIGUOUS:
            raise EnsembleError(f"{self.what} name {ident!r} is used by several {self.what}s; "
                                f"reference one by its uid ({self.what[0]}.uid)")
        return key or name_key(ident)

    def _claim(self, name: str | None, position: int, scope: str, entk: bool) -> str:
        w = self.what
        if name is None:
            name = f"{self.prefix}{position}"
            other = self.explicit.get(name)
            if other is not None:
                if entk:
                    return f"{name}#{position}"
                raise EnsembleError(
                    f"{scope}{w} name {name!r} is used twice: {w} {other} is named {name!r} and {w} "
                    f"{position} (unnamed) gets {name!r} as its default name ({self.prefix}<position>); "
                    f"rename {w} {other} or name {w} {position}")
            return name
        other = self.explicit.get(name)
        if other == position:
            return name  # the same item again (a stage that waited for its after=)
        if other is not None:
            if entk:
                return self._claim(f"{name}#{position}", position, scope, entk)
            raise EnsembleError(f"{scope}{w} name {name!r} is used twice ({w} {other} and {w} {position}); "
                                f"{w} names must be unique")
        digits = name[len(self.prefix):] if name.startswith(self.prefix) else ""
        if digits.isdigit() and digits.isascii() and str(int(digits)) == digits:
            k = int(digits)
            if k < position and k not in self.named:
                if entk:
                    return self._claim(f"{name}#{position}", position, scope, entk)
                raise EnsembleError(
                    f"{scope}{w} name {name!r} is used twice: {w} {position} is named {name!r}, which "
                    f"{w} {k} (unnamed) has as its default name ({self.prefix}<position>); "
                    f"rename {w} {position} or name {w} {k}")
        self.explicit[name] = position
        self.named.add(position)
        return name


def listed_keys(pipelines):
    """``(pipeline key, [(stage key, [(task uid, task), ...] or None when lazy), ...])`` for each
    pipeline of a listed workflow, the keys given exactly as the walker gives them (``Names``)."""
    pipes = Names("p", "pipeline")
    for i, p in enumerate(pipelines):
        puid = pipes.claim(p, i, "")
        stage_names = Names("s", "stage")
        stages = []
        for j, s in enumerate(p.stages):
            suid = f"{puid}.{stage_names.claim(s, j, f'pipeline {puid}: ')}"
            tasks = getattr(s, "tasks", None)
            if isinstance(tasks, list | tuple):
                task_names = Names("t", "task")
                stages.append((suid, [(f"{suid}.{task_names.claim(t, k, f'stage {suid}: ')}", t)
                                      if isinstance(t, Task) else (None, t) for k, t in enumerate(tasks)]))
            else:
                stages.append((suid, None))
        yield puid, stages


def plan_of(pipelines, specs: dict | None = None) -> tuple[list | None, str | None]:
    """(plan, identity) of a listed workflow; (None, None) when the pipelines are lazy.

    Names default by position exactly as the walker assigns them (``p<i>``,
    ``s<j>``, ``t<k>``), so the plan's uids are the journal's.  ``specs``, if given, is
    filled with ``id(task) -> (task, spec_text(task))`` for every listed task, so the walker
    need not compute each spec a second time (walker.py: a listed task's spec is the one it
    had when the run started)."""
    if not isinstance(pipelines, list | tuple):
        return None, None
    if not all(isinstance(p, Pipeline) for p in pipelines):
        return None, None
    h = hashlib.sha256()
    plan = []
    try:
        for puid, listed_stages in listed_keys(pipelines):
            stages = []
            for suid, tasks in listed_stages:
                stages.append({"uid": suid, "tasks": len(tasks) if tasks is not None else None})
                h.update(f"S{suid}:{len(tasks) if tasks is not None else '?'}\n".encode())
                for uid, t in tasks or ():
                    if uid is not None:
                        text = spec_text(t)
                        if specs is not None:
                            specs[id(t)] = (t, text)
                        h.update(f"T{uid}={text}\n".encode())
            plan.append({"uid": puid, "stages": stages})
            h.update(f"P{puid}\n".encode())
    except EnsembleError:
        return None, None  # a name clash: the walker raises it, naming both, when it gets there
    return plan, h.hexdigest()[:16]


def diff_plans(old: list | None, new: list | None, limit: int = 5) -> list[str]:
    """Human-readable structural differences between two plans (pipelines, stages, task counts)."""
    out: list[str] = []
    if old is None or new is None:
        return out
    old_p = {p["uid"]: p for p in old}
    new_p = {p["uid"]: p for p in new}
    for uid in new_p.keys() - old_p.keys():
        out.append(f"pipeline {uid} is new")
    for uid in old_p.keys() - new_p.keys():
        out.append(f"pipeline {uid} is gone")
    for uid in [u for u in new_p if u in old_p]:
        os_ = {s["uid"]: s["tasks"] for s in old_p[uid]["stages"]}
        ns_ = {s["uid"]: s["tasks"] for s in new_p[uid]["stages"]}
        for s in ns_.keys() - os_.keys():
            out.append(f"stage {s} is new")
        for s in os_.keys() - ns_.keys():
            out.append(f"stage {s} is gone")
        for s in [x for x in ns_ if x in os_ and ns_[x] != os_[x]]:
            out.append(f"stage {s} has {ns_[s]} tasks, was {os_[s]}")
    return sorted(out)[:limit]


def diff_specs(uid: str, old: str, new: str) -> str:
    """``task p.s.t: arguments ['1'] -> ['2']`` for two spec texts."""
    a, b = json.loads(old), json.loads(new)
    fields = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    parts = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in fields[:3]]
    return f"task {uid}: " + "; ".join(parts)


def count_tasks(pipelines) -> int | None:
    """Tasks in a workflow whose pipelines and stages are all lists; None if any part is lazy."""
    if not isinstance(pipelines, list | tuple):
        return None
    n = 0
    for p in pipelines:
        if not isinstance(p, Pipeline):
            return None
        for s in p.stages:
            tasks = getattr(s, "tasks", None)
            if not isinstance(tasks, list | tuple):
                return None
            n += len(tasks)
    return n
