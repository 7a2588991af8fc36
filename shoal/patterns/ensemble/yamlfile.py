"""YAML workflow files: ``shoal run workflow.yaml`` (schema in docs/ensemble.md).

Data flow: text ──yaml.compose──► node tree (every node keeps its line) ──
``_Loader`` walks it against the schema below ──► ``Pipeline``/``Stage``/
``Task`` objects (the same ones Python workflows build) ──► ``engine.run``.

Invariants: every error is an ``EnsembleError`` that starts with
``file:line:`` and names the offending key by its path
(``pipelines[0].stages[1].tasks[2].cores``); unknown keys, duplicate keys,
wrong types, names used twice, ``after:`` / ``$p.s.t`` references to tasks,
stages or pipelines the file does not define, and ``module:function`` paths
that do not import are all errors at load time, before anything runs.
Function tasks name their callable as ``"module:function"``; the module is
imported with the workflow file's directory first on ``sys.path`` (the pilot's
workers inherit the driver's ``sys.path``, so they import it too).

Rejected alternatives: ``yaml.safe_load`` then validating the dicts (it drops
line numbers and silently keeps the last of two duplicate keys); a JSON-schema
library (another dependency, and its messages name schema paths, not lines).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import os
import re
import sys
from collections.abc import Callable

from shoal._backoff import Backoff, check_retry_delay

from .model import (
    EMBEDDED_REF_RE,
    NAME_RE,
    EnsembleError,
    Input,
    Pipeline,
    Stage,
    Staging,
    Task,
    parse_ref,
    parse_size,
)
from .resource import ALIASES, KEYS, Resource

try:
    import yaml
    from yaml.constructor import SafeConstructor
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode
except ImportError:  # pragma: no cover - pyyaml is a dependency
    yaml = None

TOP_KEYS = {"pipelines": "list of pipelines",
            "resource": "mapping: a batch allocation (backend, nodes, cores, walltime, ...)"}
PIPELINE_KEYS = {"name": "name", "stages": "list of stages", "after": "list of uids"}
STAGE_KEYS = {"name": "name", "tasks": "list of tasks", "after": "list of uids",
              "post_exec": "'module:function'", "when": "'module:function'",
              "priority": "integer (higher starts first; its tasks' default)",
              "retries": "integer (its tasks' default)",
              "retry_delay": "seconds, or a mapping {base, factor, cap, jitter} (its tasks' default)"}
TASK_KEYS = {
    "executable": "string", "arguments": "list of strings", "environment": "mapping of strings",
    "pre_exec": "list of strings", "post_exec": "list of strings", "stdin": "string",
    "function": "'module:function'", "args": "list", "kwargs": "mapping",
    "cores": "integer", "ranks": "integer (an MPI task's ranks)",
    "cores_per_rank": "integer", "gpus": "integer", "memory": "size", "timeout": "number", "estimate": "number",
    "retries": "integer", "on_retry": "'module:function'", "name": "name", "tags": "mapping",
    "priority": "integer (higher starts first among ready tasks)",
    "retry_delay": "seconds, or a mapping {base, factor, cap, jitter} (exponential backoff)",
    "inputs": "list of inputs", "outputs": "list of strings", "after": "list of uids",
    "when": "'module:function'", "replicas": "integer >= 1 (copies; {i} is the copy number)",
    "sweep": "mapping of name: list of values (one task per combination; {name} is the value)",
}
INPUT_KEYS = {"source": "string", "target": "string", "mode": "copy, link or move"}


class _Loader:
    def __init__(self, path: str):
        self.path = path
        self.constructor = SafeConstructor()
        self.uids: set[str] = set()  # every pipeline, stage and task uid the file defines
        self.refs: list[tuple[str, object, str]] = []  # (uid, node, where) checked at the end
        self.templating = False  # parsing a replicas:/sweep: task: names may hold {placeholders}
        self.sizes: dict[int, int] = {}  # id(node) -> its expanded size (``expanded``'s memo)

    # -- errors and plain values ------------------------------------------------------
    def error(self, node, where: str, message: str) -> EnsembleError:
        line = node.start_mark.line + 1 if node is not None else 1
        return EnsembleError(f"{self.path}:{line}: {where}: {message}")

    def bounded(self, node, where: str) -> None:
        """Refuse a value whose aliases expand it past ``MAX_VALUE_NODES`` (see ``expanded``)."""
        n = expanded(node, MAX_VALUE_NODES, self.sizes)
        if n > MAX_VALUE_NODES:
            raise self.error(node, where, f"this value expands to more than {MAX_VALUE_NODES:,} "
                             "nodes through its aliases (*name); a workflow file's values are small "
                             "data: pass large inputs as a file name")

    def value(self, node, where: str = "value"):
        self.bounded(node, where)
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # a tag SafeLoader does not know (!!python/..., !custom)
            raise self.error(node, "value", f"cannot read {node.tag!r} here: "
                             f"{getattr(exc, 'problem', None) or exc}") from None

    def mapping(self, node, where: str, keys: dict[str, str]) -> dict[str, tuple[object, object]]:
        """{key: (key node, value node)}; unknown and duplicate keys are errors."""
        if not isinstance(node, MappingNode):
            raise self.error(node, where, f"expected a mapping with keys {', '.join(keys)}, "
                             f"got {self.kind(node)}")
        out: dict[str, tuple[object, object]] = {}
        for knode, vnode in node.value:
            key = self.value(knode) if isinstance(knode, ScalarNode) else None
            if not isinstance(key, str):
                raise self.error(knode, where, f"keys must be strings, got {self.kind(knode)}")
            if key not in keys:
                close = difflib.get_close_matches(key, keys, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.error(knode, where, f"unknown key {key!r}{hint}; allowed: {', '.join(keys)}")
            if key in out:
                raise self.error(knode, where, f"key {key!r} is given twice")
            out[key] = (knode, vnode)
        return out

    @staticmethod
    def kind(node) -> str:
        if isinstance(node, MappingNode):
            return "a mapping"
        if isinstance(node, SequenceNode):
            return "a list"
        if node.tag.endswith(":null"):
            return "nothing (null)"
        return f"{node.tag.rsplit(':', 1)[-1]} {node.value!r}"

    def seq(self, node, where: str, what: str) -> list:
        if not isinstance(node, SequenceNode):
            raise self.error(node, where, f"expected a list of {what}, got {self.kind(node)}")
        return node.value

    def scalar(self, node, where: str, types: tuple[type, ...], what: str):
        if not isinstance(node, ScalarNode):
            raise self.error(node, where, f"expected {what}, got {self.kind(node)}")
        v = self.value(node)
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise self.error(node, where, f"expected {what}, got {self.kind(node)}")
        return v

    def string(self, node, where: str) -> str:
        return self.scalar(node, where, (str,), "a string")

    def strings(self, node, where: str, numbers: bool = False) -> list[str]:
        types = (str, int, float) if numbers else (str,)
        what = "a string or number" if numbers else "a string"
        return [str(self.scalar(n, f"{where}[{i}]", types, what))
                for i, n in enumerate(self.seq(node, where, "strings"))]

    def name(self, node, where: str) -> str:
        v = self.string(node, where)
        bare = re.sub(r"\{[A-Za-z_][A-Za-z0-9_]*\}", "x", v) if self.templating else v
        if not NAME_RE.match(bare):
            raise self.error(node, where, f"name {v!r} must be letters, digits or _-:+@%=, (no '.', '/', '$')")
        return v

    def integer(self, node, where: str, low: int | None) -> int:
        v = self.scalar(node, where, (int,), "an integer")
        if low is not None and v < low:
            raise self.error(node, where, f"must be an integer >= {low}, got {v}")
        return v

    def number(self, node, where: str) -> float:
        v = self.scalar(node, where, (int, float), "a number of seconds")
        if not math.isfinite(v) or v <= 0:
            raise self.error(node, where, f"must be a finite number of seconds > 0, got {v}")
        return v

    def plain(self, node, where: str, container: type):
        if container is dict and not isinstance(node, MappingNode):
            raise self.error(node, where, f"expected a mapping, got {self.kind(node)}")
        if container is list and not isinstance(node, SequenceNode):
            raise self.error(node, where, f"expected a list, got {self.kind(node)}")
        try:
            v = self.value(node, where)
        except yaml.YAMLError as exc:
            raise self.error(node, where, str(exc).splitlines()[0]) from None
        if container is dict and not all(isinstance(k, str) for k in v):
            raise self.error(node, where, "keys must be strings")
        return v

    def callable_(self, node, where: str) -> Callable:
        spec = self.string(node, where)
        module, sep, attr = spec.partition(":")
        if not sep or not module or not attr:
            raise self.error(node, where, f"expected 'module:function', got {spec!r}")
        try:
            obj = importlib.import_module(module)
        except Exception as exc:
            raise self.error(node, where, f"cannot import module {module!r}: {exc!r}") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise self.error(node, where, f"module {module!r} has no {attr!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise self.error(node, where, f"{spec!r} is not callable")
        return obj

    def uid_list(self, node, where: str) -> list[str]:
        out = []
        for i, n in enumerate(self.seq(node, where, "uids ('pipeline', 'pipeline.stage' or 'p.s.task')")):
            uid = self.string(n, f"{where}[{i}]")
            self.refs.append((uid, n, f"{where}[{i}]"))
            out.append(uid)
        return out

    # -- the schema -------------------------------------------------------------------
    def top(self, root) -> list[Pipeline]:
        if root is None:
            raise EnsembleError(f"{self.path}:1: the file is empty; it needs 'pipelines:'")
        keys = self.mapping(root, "top level", TOP_KEYS)
        if "pipelines" not in keys:
            raise self.error(root, "top level", "missing key 'pipelines'")
        if "resource" in keys:  # checked here; yaml_resource reads it for shoal run
            self.resource_block(keys["resource"][1])
        nodes = self.seq(keys["pipelines"][1], "pipelines", "pipelines")
        if not nodes:
            raise self.error(keys["pipelines"][1], "pipelines", "the list is empty")
        pipelines = [self.pipeline(n, i) for i, n in enumerate(nodes)]
        for uid, node, where in self.refs:
            if uid not in self.uids:
                close = difflib.get_close_matches(uid, self.uids, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.error(node, where, f"{uid!r} names no pipeline, stage or task of this file{hint}")
        return pipelines

    def resource_block(self, node):
        """``resource:`` -> a ``Resource`` (resource.py), errors with this file's line."""
        keys = self.mapping(node, "resource", {**KEYS, **{a: f"alias of {n}" for a, n in ALIASES.items()}})
        try:
            return Resource.of({k: self.value(v) for k, (_, v) in keys.items()})
        except EnsembleError as exc:
            raise self.error(node, "resource", str(exc).removeprefix("resource: ")) from None

    def unique(self, uid: str, node, where: str) -> None:
        if uid in self.uids:
            raise self.error(node, where, f"{uid!r} is defined twice; names must be unique")
        self.uids.add(uid)

    def pipeline(self, node, i: int) -> Pipeline:
        where = f"pipelines[{i}]"
        keys = self.mapping(node, where, PIPELINE_KEYS)
        name = self.name(keys["name"][1], f"{where}.name") if "name" in keys else f"p{i}"
        self.unique(name, keys["name"][1] if "name" in keys else node, where)
        if "stages" not in keys:
            raise self.error(node, where, "missing key 'stages'")
        after = self.uid_list(keys["after"][1], f"{where}.after") if "after" in keys else []
        stages = [self.stage(n, f"{where}.stages[{j}]", name, j)
                  for j, n in enumerate(self.seq(keys["stages"][1], f"{where}.stages", "stages"))]
        return Pipeline(stages, name=name if "name" in keys else None, after=after)

    def stage(self, node, where: str, pname: str, j: int) -> Stage:
        keys = self.mapping(node, where, STAGE_KEYS)
        name = self.name(keys["name"][1], f"{where}.name") if "name" in keys else f"s{j}"
        uid = f"{pname}.{name}"
        self.unique(uid, keys["name"][1] if "name" in keys else node, where)
        if "tasks" not in keys:
            raise self.error(node, where, "missing key 'tasks'")
        after = self.uid_list(keys["after"][1], f"{where}.after") if "after" in keys else []
        post = self.callable_(keys["post_exec"][1], f"{where}.post_exec") if "post_exec" in keys else None
        when = self.callable_(keys["when"][1], f"{where}.when") if "when" in keys else None
        tasks: list[Task] = []
        for k, n in enumerate(self.seq(keys["tasks"][1], f"{where}.tasks", "tasks")):
            tasks += self.tasks_of(n, f"{where}.tasks[{k}]", uid, len(tasks))
        policy = {}
        if "priority" in keys:
            policy["priority"] = self.integer(keys["priority"][1], f"{where}.priority", None)
        if "retries" in keys:
            policy["retries"] = self.integer(keys["retries"][1], f"{where}.retries", 0)
        if "retry_delay" in keys:
            policy["retry_delay"] = self.retry_delay(keys["retry_delay"][1], f"{where}.retry_delay")
        return Stage(tasks, name=name if "name" in keys else None, post_exec=post, after=after, when=when,
                     **policy)

    def retry_delay(self, node, where: str):
        """``retry_delay: 5`` (seconds) or ``retry_delay: {base: 1, factor: 2, cap: 60, jitter: 0.1}``."""
        if isinstance(node, MappingNode):
            spec = self.plain(node, where, dict)
            allowed = {f.name for f in dataclasses.fields(Backoff)}
            unknown = sorted(set(spec) - allowed)
            if unknown:
                raise self.error(node, where, f"unknown key {unknown[0]!r}; a backoff takes "
                                 f"{', '.join(sorted(allowed))}")
            try:
                return Backoff(**spec)
            except (TypeError, ValueError) as exc:
                raise self.error(node, where, str(exc)) from None
        v = self.scalar(node, where, (int, float), "seconds or a mapping {base, factor, cap, jitter}")
        try:
            return check_retry_delay(v, "retry_delay")
        except ValueError as exc:
            raise self.error(node, where, str(exc).split(": ", 1)[1]) from None

    def tasks_of(self, node, where: str, suid: str, k: int) -> list[Task]:
        """One task, or the copies a ``replicas:`` / ``sweep:`` generator describes."""
        if not isinstance(node, MappingNode):
            return [self.task(node, where, suid, k)]
        keys = self.mapping(node, where, TASK_KEYS)
        if "replicas" not in keys and "sweep" not in keys:
            return [self.task(node, where, suid, k)]
        axes: list[tuple[str, list]] = []
        if "replicas" in keys:
            n = self.integer(keys["replicas"][1], f"{where}.replicas", 1)
            _check_copies(self, node, where, n)
            axes.append(("i", list(range(n))))
        if "sweep" in keys:
            snode = keys["sweep"][1]
            sweep = self.plain(snode, f"{where}.sweep", dict)
            for name, values in sweep.items():
                if not name.isidentifier() or (name == "i" and "replicas" in keys):
                    raise self.error(snode, f"{where}.sweep", f"{name!r} cannot name a sweep parameter "
                                     "(use a Python identifier; 'i' is the replica number)")
                if not isinstance(values, list) or not values:
                    raise self.error(snode, f"{where}.sweep.{name}", f"expected a non-empty list of values, "
                                     f"got {values!r}")
                axes.append((name, values))
        _check_copies(self, node, where, math.prod(len(values) for _, values in axes))
        plain = MappingNode(node.tag, [(kn, vn) for kn, vn in node.value
                                       if kn.value not in ("replicas", "sweep")], node.start_mark, node.end_mark)
        refs_before = len(self.refs)
        names_before = set(self.uids)
        self.templating = True
        try:
            template = self.task(plain, where, suid, k)  # parsed once, placeholders in it
        finally:
            self.templating = False
        raw_refs = self.refs[refs_before:]
        del self.refs[refs_before:]
        self.uids = names_before
        if template.name is not None and "{" not in template.name and len(axes) and \
                len(_product(axes)) > 1:
            raise self.error(keys["name"][1] if "name" in keys else node, f"{where}.name",
                             f"name {template.name!r} would be the same for every copy; put a placeholder "
                             f"in it, e.g. '{template.name}-{{{axes[0][0]}}}', or drop it")
        out = []
        for j, values in enumerate(_product(axes)):
            env = dict(values)
            try:
                task = _substitute(template, env)
            except (KeyError, IndexError, ValueError) as exc:
                raise self.error(node, where, f"placeholder {exc} is not defined; defined: "
                                 f"{', '.join(n for n, _ in axes)} (write {{{{ and }}}} for literal braces)") from None
            name = task.name or f"t{k + j}"
            if task.name is not None and not NAME_RE.match(task.name):
                raise self.error(node, f"{where}.name", f"name {task.name!r} must be letters, digits or _-:+@%=,")
            self.unique(f"{suid}.{name}", node, where)
            self.value_refs(task, keys, where)
            try:
                task.validate()
            except EnsembleError as exc:
                raise self.error(node, where, str(exc).split(": ", 1)[-1]) from None
            for uid, rnode, rwhere in raw_refs:
                try:
                    self.refs.append((uid.format_map(env), rnode, rwhere))
                except (KeyError, IndexError, ValueError):
                    self.refs.append((uid, rnode, rwhere))
            out.append(task)
        return out

    def task(self, node, where: str, suid: str, k: int) -> Task:
        keys = self.mapping(node, where, TASK_KEYS)
        for key in ("replicas", "sweep"):
            if key in keys:
                raise self.error(keys[key][0], f"{where}.{key}", "generators are not allowed here")
        kw: dict = {}

        def at(key):
            return keys[key][1], f"{where}.{key}"

        if ("executable" in keys) == ("function" in keys):
            raise self.error(node, where, "give exactly one of 'executable' or 'function'")
        for key in ("executable", "stdin"):
            if key in keys:
                kw[key] = self.string(*at(key))
        if "function" in keys:
            kw["function"] = self.callable_(*at("function"))
            for key in ("pre_exec", "post_exec", "stdin", "arguments", "environment"):
                if key in keys:
                    raise self.error(keys[key][0], f"{where}.{key}", "applies to executable tasks only")
        else:
            for key in ("args", "kwargs"):
                if key in keys:
                    raise self.error(keys[key][0], f"{where}.{key}", "applies to function tasks only")
        if "arguments" in keys:
            kw["arguments"] = self.strings(*at("arguments"), numbers=True)
        for key in ("pre_exec", "post_exec", "outputs"):
            if key in keys:
                kw[key] = self.strings(*at(key))
        if "environment" in keys:
            env = self.plain(*at("environment"), dict)
            for var, val in env.items():
                if isinstance(val, bool) or not isinstance(val, str | int | float):
                    raise self.error(keys["environment"][1], f"{where}.environment.{var}",
                                     f"expected a string or number, got {val!r}")
            kw["environment"] = {var: str(val) for var, val in env.items()}
        if "args" in keys:
            kw["args"] = tuple(self.plain(*at("args"), list))
        if "kwargs" in keys:
            kw["kwargs"] = self.plain(*at("kwargs"), dict)
        if "tags" in keys:
            kw["tags"] = self.plain(*at("tags"), dict)
        for key, low in (("cores", 1), ("ranks", 1), ("cores_per_rank", 1), ("gpus", 0), ("retries", 0)):
            if key in keys:
                kw[key] = self.integer(*at(key), low)
        for key in ("timeout", "estimate"):
            if key in keys:
                kw[key] = self.number(*at(key))
        if "priority" in keys:
            kw["priority"] = self.integer(*at("priority"), None)
        if "retry_delay" in keys:
            kw["retry_delay"] = self.retry_delay(*at("retry_delay"))
        if "memory" in keys:
            mem = self.scalar(*at("memory"), (int, str), "bytes or a size like '2G'")
            try:
                parse_size(mem, "memory")
            except EnsembleError as exc:
                raise self.error(keys["memory"][1], f"{where}.memory", str(exc).split(": ", 1)[1]) from None
            kw["memory"] = mem
        for key in ("on_retry", "when"):
            if key in keys:
                kw[key] = self.callable_(*at(key))
        if "inputs" in keys:
            kw["inputs"] = [self.input(n, f"{where}.inputs[{i}]")
                            for i, n in enumerate(self.seq(keys["inputs"][1], f"{where}.inputs", "inputs"))]
        if "after" in keys:
            kw["after"] = self.uid_list(*at("after"))
        if "name" in keys:
            kw["name"] = self.name(*at("name"))
        uid = f"{suid}.{kw.get('name', f't{k}')}"
        self.unique(uid, keys["name"][1] if "name" in keys else node, where)
        task = Task(**kw)
        if self.templating:
            return task  # each copy's references are read and it is validated once filled in
        self.value_refs(task, keys, where)
        try:
            task.validate()
        except EnsembleError as exc:
            raise self.error(node, where, str(exc).split(": ", 1)[-1]) from None
        return task

    def value_refs(self, task: Task, keys: dict, where: str) -> None:
        """Record the ``$p.s.t`` references inside ``arguments``/``args``, ``kwargs`` and ``stdin``.

        They are read from the finished task's values, so a generated copy's are read after
        its ``{i}``/sweep placeholders are filled (``"cat $ens.sim.r{i}/out"`` names
        ``ens.sim.r3`` in copy 3; read from the template, the reference would stop at the
        brace).  ``inputs`` and ``after`` hold whole references, recorded while parsing and
        filled per copy in ``tasks_of``."""
        argkey = "arguments" if task.executable is not None else "args"
        values = task.arguments if argkey == "arguments" else task.args
        if argkey in keys:
            for i, (n, a) in enumerate(zip(keys[argkey][1].value, values, strict=True)):
                if isinstance(a, str) and "$" in a:
                    for m in EMBEDDED_REF_RE.finditer(a):
                        self.refs.append((f"{m[1]}.{m[2]}.{m[3]}", n, f"{where}.{argkey}[{i}]"))
        if "kwargs" in keys and task.function is not None:  # a whole string value, as in args
            for knode, vnode in keys["kwargs"][1].value:
                value = task.kwargs.get(knode.value)
                if isinstance(value, str) and (ref := parse_ref(value)):
                    self.refs.append((ref[0], vnode, f"{where}.kwargs.{knode.value}"))
        if task.stdin and parse_ref(task.stdin):
            self.refs.append((parse_ref(task.stdin)[0], keys["stdin"][1], f"{where}.stdin"))


    def input(self, node, where: str) -> Input:
        if isinstance(node, ScalarNode):
            source = self.string(node, where)
            ref = parse_ref(source)
            if source.startswith("$") and ref is None:
                raise self.error(node, where, f"{source!r} is not a reference '$pipeline.stage.task/path'")
            if ref:
                self.refs.append((ref[0], node, where))
            return Input(source, (ref[1] if ref else source).rsplit("/", 1)[-1])
        keys = self.mapping(node, where, INPUT_KEYS)
        for key in ("source", "target"):
            if key not in keys:
                raise self.error(node, where, f"missing key {key!r}")
        source = self.string(keys["source"][1], f"{where}.source")
        target = self.string(keys["target"][1], f"{where}.target")
        mode = Staging.COPY
        if "mode" in keys:
            text = self.string(keys["mode"][1], f"{where}.mode")
            try:
                mode = Staging(text)
            except ValueError:
                raise self.error(keys["mode"][1], f"{where}.mode",
                                 f"expected copy, link or move, got {text!r}") from None
        ref = parse_ref(source)
        if source.startswith("$") and ref is None:
            raise self.error(keys["source"][1], f"{where}.source",
                             f"{source!r} is not a reference '$pipeline.stage.task/path'")
        if ref:
            self.refs.append((ref[0], keys["source"][1], f"{where}.source"))
        return Input(source, target, mode)


COPY_BYTES = 2048  # driver memory per generated task (measured ~1.2 KB: the Task, its uid, its spec)


def _check_copies(loader, node, where: str, n: int) -> None:
    """Refuse a generator whose copies cannot fit in this machine's memory *before* building
    them (``replicas: 100000000`` or a sweep of ten 10-value lists would otherwise grow the
    driver until the OOM killer or swap stops it, with no word said)."""
    try:
        import psutil

        available = psutil.virtual_memory().available
    except Exception:  # pragma: no cover - psutil is a dependency
        return
    if n * COPY_BYTES > available // 2:
        raise loader.error(node, where, f"this generator stands for {n:,} tasks, about "
                           f"{n * COPY_BYTES / 2**30:,.1f} GiB of driver memory before anything runs "
                           f"({available / 2**30:.1f} GiB available); YAML generators are expanded up "
                           "front: for more, generate the tasks lazily in a Python workflow (a Stage's "
                           "tasks may be a generator)")


def _product(axes) -> list[tuple]:
    import itertools

    return [tuple(zip([n for n, _ in axes], combo, strict=True))
            for combo in itertools.product(*[v for _, v in axes])]


def _sub(value, env: dict):
    if isinstance(value, str):
        return value.format_map(env) if "{" in value or "}" in value else value
    if isinstance(value, Input):
        return Input(_sub(value.source, env), _sub(value.target, env), value.mode)
    if isinstance(value, list):
        return [_sub(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(_sub(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _sub(v, env) for k, v in value.items()}
    return value


_GENERATED = ("executable", "arguments", "args", "kwargs", "environment", "pre_exec", "post_exec", "stdin",
              "inputs", "outputs", "after", "name", "tags")


def _substitute(template: Task, env: dict) -> Task:
    """A copy of ``template`` with ``{name}`` placeholders in its strings filled from ``env``.
    A whole-string placeholder in ``args``/``kwargs`` (``"{temp}"``) keeps the value's type."""
    changes = {}
    for field in _GENERATED:
        value = getattr(template, field)
        if field in ("args", "kwargs"):
            def typed(v):
                if isinstance(v, str) and v.startswith("{") and v.endswith("}") and v[1:-1] in env:
                    return env[v[1:-1]]
                return _sub(v, env)
            value = tuple(typed(v) for v in value) if field == "args" else {k: typed(v) for k, v in value.items()}
        else:
            value = _sub(value, env)
        changes[field] = value
    return dataclasses.replace(template, **changes)


_MERGE = "tag:yaml.org,2002:merge"


def _merge_keys(node, seen: set, path: str) -> None:
    """Expand YAML merge keys in place (``<<: *defaults`` or ``<<: [*a, *b]``): the merged
    mappings' keys come after the mapping's own, and only those it does not set itself (the
    first of several merged mappings wins), so the schema walk sees plain mappings and a key
    set twice explicitly is still an error.  Anchors are shared nodes: each is expanded once."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, SequenceNode):
        for child in node.value:
            _merge_keys(child, seen, path)
    if not isinstance(node, MappingNode):
        return
    own, merged = [], []
    for knode, vnode in node.value:
        _merge_keys(vnode, seen, path)
        if knode.tag != _MERGE:
            own.append((knode, vnode))
            continue
        sources = vnode.value if isinstance(vnode, SequenceNode) else [vnode]
        for src in sources:
            if not isinstance(src, MappingNode):
                raise EnsembleError(f"{path}:{src.start_mark.line + 1}: '<<' merges a mapping "
                                    "(an anchor like *defaults) or a list of them")
            _merge_keys(src, seen, path)
            merged.extend(src.value)
    if len(own) == len(node.value):
        return
    taken = {k.value for k, _ in own if isinstance(k, ScalarNode)}
    for knode, vnode in merged:
        if not (isinstance(knode, ScalarNode) and knode.value in taken):
            taken.add(knode.value)
            own.append((knode, vnode))
    node.value = own


MAX_VALUE_NODES = 1_000_000  # nodes one value (args, kwargs, environment, a sweep, tags) may expand to
MAX_DOCUMENT_NODES = 20_000_000  # nodes the whole file may expand to


def expanded(node, bound: int, sizes: dict) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (a node reached twice
    counts twice), computed once per distinct node (``sizes``), so a file of nested aliases
    is measured in its own size, not in the 10**9 nodes it expands to; values above ``bound``
    are reported as ``bound + 1``.  Rejected: limiting the number of aliases (a legitimate
    file reuses ``*defaults`` in every task) or the depth (a bomb is shallow)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    stack, order = [node], []
    while stack:  # post-order without recursion: a deep file must not hit the recursion limit
        n = stack.pop()
        if id(n) in sizes:
            continue
        order.append(n)
        sizes[id(n)] = -1  # visiting (a cycle cannot happen: YAML aliases point backwards)
        if isinstance(n, SequenceNode):
            stack.extend(c for c in n.value if id(c) not in sizes)
        elif isinstance(n, MappingNode):
            stack.extend(c for kv in n.value for c in kv if id(c) not in sizes)
    for n in reversed(order):
        if isinstance(n, SequenceNode):
            kids = n.value
        elif isinstance(n, MappingNode):
            kids = [c for kv in n.value for c in kv]
        else:
            kids = ()
        sizes[id(n)] = min(bound + 1, 1 + sum(max(sizes[id(c)], 0) for c in kids))
    return sizes[id(node)]


def load_yaml(path: str) -> list[Pipeline]:
    """The pipelines a YAML workflow file describes; ``EnsembleError`` with ``file:line:`` if invalid."""
    if yaml is None:  # pragma: no cover
        raise EnsembleError("YAML workflow files need PyYAML: pip install pyyaml")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise EnsembleError(f"workflow file {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise EnsembleError(f"{path}:{line}: not a UTF-8 text file (byte {data[exc.start]:#04x} at offset "
                            f"{exc.start}); a YAML workflow is UTF-8 text") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise EnsembleError(f"{path}:{line}: not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise EnsembleError(f"{path}: not valid YAML: {exc}") from None
    _merge_keys(root, set(), path)
    loader = _Loader(path)
    if root is not None and expanded(root, MAX_DOCUMENT_NODES, loader.sizes) > MAX_DOCUMENT_NODES:
        raise EnsembleError(f"{path}: the file expands to more than {MAX_DOCUMENT_NODES:,} nodes "
                            "through its aliases (*name); a workflow that large is generated "
                            "with replicas: or sweep:, not spelled out by aliases")
    here = os.path.dirname(os.path.abspath(path))
    if here not in sys.path:
        sys.path.insert(0, here)  # 'module:function' next to the file imports (workers inherit sys.path)
    return loader.top(root)


def yaml_resource(path: str) -> Resource | None:
    """The ``resource:`` block of a YAML workflow file (None without one); errors carry
    the file's line, as for the rest of the file (``_Loader.resource_block``, which also checks it on load)."""
    try:
        with open(path, encoding="utf-8") as f:
            root = yaml.compose(f.read(), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None  # load_yaml reports it, with the line
    if not isinstance(root, MappingNode):
        return None
    for knode, vnode in root.value:
        if getattr(knode, "value", None) == "resource":
            return _Loader(path).resource_block(vnode)
    return None
