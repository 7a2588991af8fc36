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

from .model import EnsembleError, Pipeline, Task

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
        return f"<task {value.uid}>"
    return value


_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode  # json.dumps with these
# options builds a new encoder per call; this is called once or twice per task


def spec_text(task: Task) -> str:
    return _ENCODE(task_spec(task))


def plan_of(pipelines, specs: dict | None = None) -> tuple[list | None, str | None]:
    """(plan, identity) of a listed workflow; (None, None) when the pipelines are lazy.

    Names default by position exactly as the walker assigns them (``p<i>``,
    ``s<j>``, ``t<k>``), so the plan's uids are the journal's.  ``specs``, if given, is
    filled with ``id(task) -> (task, spec_text(task))`` for every listed task, so the walker
    need not compute each spec a second time (walker.py: a listed task's spec is the one it
    had when the run started)."""
    if not isinstance(pipelines, list | tuple):
        return None, None
    h = hashlib.sha256()
    plan = []
    for i, p in enumerate(pipelines):
        if not isinstance(p, Pipeline):
            return None, None
        puid = p.name or f"p{i}"
        stages = []
        for j, s in enumerate(p.stages):
            suid = f"{puid}.{getattr(s, 'name', None) or f's{j}'}"
            tasks = getattr(s, "tasks", None)
            listed = isinstance(tasks, list | tuple)
            stages.append({"uid": suid, "tasks": len(tasks) if listed else None})
            h.update(f"S{suid}:{len(tasks) if listed else '?'}\n".encode())
            if listed:
                for k, t in enumerate(tasks):
                    if isinstance(t, Task):
                        text = spec_text(t)
                        if specs is not None:
                            specs[id(t)] = (t, text)
                        h.update(f"T{suid}.{t.name or f't{k}'}={text}\n".encode())
        plan.append({"uid": puid, "stages": stages})
        h.update(f"P{puid}\n".encode())
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
