"""Attacks on result reuse (issue 32 item 1): edits the key must see, links and damaged files the
cache must refuse, functions shoal.cached must not pretend to cache.

Each test here failed before its fix: a wrong reuse (an edit the key did not see) or a confusing
failure.  Real user modules on disk, imported fresh; real files and links; real ensemble runs.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import threading
import warnings

import pytest

import shoal
from shoal._taskkey import FileDigests, function_digest
from shoal.cache import CacheWarning


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``load(text)``: the module ``attack_mod`` with that source, imported afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def load(text):
        (tmp_path / "attack_mod.py").write_text(textwrap.dedent(text))
        importlib.invalidate_caches()
        sys.modules.pop("attack_mod", None)
        return importlib.import_module("attack_mod")

    yield load
    sys.modules.pop("attack_mod", None)


EDITS = {
    # two closures of one factory share a code object, not their cell values
    "factory closures": ("""
        def make(n):
            def add(x):
                return x + n
            return add
        add1 = make(1)
        add2 = make(N)
        def task(x):
            return add1(x) + add2(x)
        """, "2", "3"),
    "a functools.partial global": ("""
        import functools
        def scale(x, f):
            return x * f
        helper = functools.partial(scale, f=N)
        def task(x):
            return helper(x)
        """, "2", "3"),
    "a bound method global": ("""
        class C:
            def m(self, x):
                return x + N
        helper = C().m
        def task(x):
            return helper(x)
        """, "1", "2"),
    "the class of an object global": ("""
        class C:
            def m(self, x):
                return x + N
        obj = C()
        def task(x):
            return obj.m(x)
        """, "1", "2"),
    "a function held by a decorator object": ("""
        class memo:
            def __init__(self, fn):
                self.fn = fn
            def __call__(self, *a):
                return self.fn(*a)
        @memo
        def helper(x):
            return x + N
        def task(x):
            return helper(x)
        """, "1", "2"),
    "a lambda inside a data global": ("""
        helpers = [lambda x: x + N]
        def task(x):
            return helpers[0](x)
        """, "1", "2"),
    "a functools.partial default": ("""
        import functools
        def scale(x, f):
            return x * f
        def task(x, h=functools.partial(scale, f=N)):
            return h(x)
        """, "1", "2"),
    "an enum member's value": ("""
        import enum
        class Color(enum.Enum):
            RED = N
        def task(x):
            return Color.RED.value + x
        """, "1", "2"),
    # keyed at all: its __init__'s default is dataclasses' sentinel, a stateless object
    "a dataclass default_factory": ("""
        import dataclasses
        @dataclasses.dataclass
        class P:
            k: list = dataclasses.field(default_factory=lambda: [N])
        def task(x):
            return P().k
        """, "1", "2"),
    "a property's setter": ("""
        class C:
            @property
            def p(self):
                return 1
            @p.setter
            def p(self, v):
                self.v = v * N
        def task(x):
            c = C()
            c.p = x
            return c.v
        """, "1", "2"),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_an_edit_of_code_a_function_reaches_changes_its_key(user_module, what):
    text, before, after = EDITS[what]
    a = function_digest(user_module(text.replace("N", before)).task)
    assert function_digest(user_module(text.replace("N", before)).task) == a  # stable
    assert function_digest(user_module(text.replace("N", after)).task) != a


def test_a_folder_input_counts_what_its_links_point_to(tmp_path):
    outside = tmp_path / "shared"
    (outside / "sub").mkdir(parents=True)
    (outside / "big.csv").write_text("1,2\n")
    (outside / "sub" / "part.csv").write_text("3\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "own.txt").write_text("own\n")
    (data / "big.csv").symlink_to(outside / "big.csv")
    (data / "parts").symlink_to(outside / "sub")
    (data / "loop").symlink_to(data)  # a link back up the tree: by its text, no endless walk
    first = FileDigests().digest(str(data))
    assert FileDigests().digest(str(data)) == first
    (outside / "big.csv").write_text("1,3\n")
    second = FileDigests().digest(str(data))
    assert second != first
    (outside / "sub" / "part.csv").write_text("4\n")
    assert FileDigests().digest(str(data)) != second


def test_cached_refuses_generator_and_async_functions_by_name(tmp_path):
    def numbers(n):
        yield from range(n)

    async def later(n):
        return n

    for fn, kind in ((numbers, "generator"), (later, "async")):
        with pytest.raises(TypeError, match=f"{fn.__name__}.* is an? {kind} function"):
            shoal.cached(tmp_path)(fn)


def test_cached_on_a_method_names_the_object_that_cannot_be_keyed(tmp_path):
    class Model:
        @shoal.cached(tmp_path)
        def predict(self, x):
            return x

    with pytest.raises(ValueError, match="argument 0 of .*predict: a value of type .*Model is not plain data"):
        Model().predict(1)


def test_a_result_pickle_cannot_hold_is_not_stored_as_a_marker(tmp_path):
    calls = []

    @shoal.cached(tmp_path, pickle=True)
    def lock(n):
        calls.append(n)
        return threading.Lock()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lock(1)
        lock(1)
    assert len(calls) == 2
    assert not list(tmp_path.glob("*.result"))
    assert all("cannot be pickled and was not stored" in str(w.message) for w in caught
               if issubclass(w.category, CacheWarning)) and caught


def _folder_workflow(tmp):
    from shoal.ensemble import Pipeline, Stage, Task

    log = tmp / "ran.log"
    make = Task(executable="/bin/sh", name="make", outputs=["outdir", "empty.txt"],
                arguments=["-c", f"echo make >> {log}; mkdir -p outdir/none outdir/sub; echo x > outdir/sub/f; : > empty.txt"])
    use = Task(executable="/bin/sh", name="use", inputs=[("$p.s1.make/outdir", "in"), ("$p.s1.make/empty.txt", "e")],
               arguments=["-c", f"echo use >> {log}; test -d in/none && cat in/sub/f e > o"], outputs=["o"])
    return [Pipeline([Stage([make], name="s1"), Stage([use], name="s2")], name="p")]


def test_an_output_folder_with_empty_folders_is_staged_back_and_explained(tmp_path):
    from shoal.ensemble import explain, run

    journal = str(tmp_path / "run.db")
    assert run(_folder_workflow(tmp_path), journal=journal, reuse=True).ok
    assert dict(explain(_folder_workflow(tmp_path), journal)) == {
        "p.s1.make": "reused (journal run.db)", "p.s2.use": "reused (journal run.db)"}
    report = run(_folder_workflow(tmp_path), journal=journal, reuse=True)
    assert report.ok and report.reused == 2, report.failures
    assert (tmp_path / "run.sandbox/p/s1/make/outdir/none").is_dir()
    assert (tmp_path / "ran.log").read_text().split() == ["make", "use"]  # each ran once


def test_a_tampered_or_linked_cache_object_is_repaired_by_the_next_run_that_makes_it(tmp_path):
    from shoal.ensemble import run

    cache = tmp_path / "c"
    assert run(_folder_workflow(tmp_path), journal=str(tmp_path / "a.db"), cache=str(cache)).ok
    objects = sorted((cache / "objects").iterdir())
    objects[0].write_bytes(b"garbage\n")
    (tmp_path / "elsewhere").write_text("planted\n")
    objects[1].unlink()
    objects[1].symlink_to(tmp_path / "elsewhere")
    (tmp_path / "ran.log").write_text("")
    with pytest.warns(CacheWarning, match="deleted or changed"):
        assert run(_folder_workflow(tmp_path), journal=str(tmp_path / "b.db"), cache=str(cache)).ok  # runs
    assert (tmp_path / "ran.log").read_text().split()  # something ran
    assert not objects[1].is_symlink() and (tmp_path / "elsewhere").read_text() == "planted\n"
    (tmp_path / "ran.log").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        report = run(_folder_workflow(tmp_path), journal=str(tmp_path / "c.db"), cache=str(cache))
    assert report.ok and report.reused == 2
    assert (tmp_path / "ran.log").read_text() == ""


def test_explain_with_a_cache_folder_that_is_not_there_creates_nothing(tmp_path):
    from shoal.ensemble import explain

    verdicts = dict(explain(_folder_workflow(tmp_path), str(tmp_path / "run.db"), cache=str(tmp_path / "c")))
    assert verdicts["p.s1.make"] == "runs: new"
    assert not (tmp_path / "c").exists() and not (tmp_path / "run.db").exists()


def test_a_project_under_the_interpreters_prefix_is_still_the_users_code(tmp_path, monkeypatch):
    """A system Python's prefix is /usr; a project in /usr/src/app is not an installed package."""
    from shoal import _taskkey

    for name in ("prefix", "base_prefix", "exec_prefix"):
        monkeypatch.setattr(sys, name, str(tmp_path))
    project = str(tmp_path / "src" / "app" / "tasks.py")
    assert not any(project.startswith(root) for root in _taskkey._installed_roots())


@pytest.mark.parametrize("body", [b"[]", b'"text"', b'{"uid": "u", "parts": {}, "kind": "function", "folders": 3}'])
def test_a_well_formed_cache_entry_with_a_foreign_body_is_a_miss(tmp_path, body):
    from shoal._durable import pack
    from shoal.patterns.ensemble.reuse import ENTRY_KIND, CacheStore

    store = CacheStore(str(tmp_path))
    key = "ab" * 32
    (tmp_path / "keys" / f"{key}.entry").write_bytes(b"".join(bytes(p) for p in pack(ENTRY_KIND, {"key": key}, body)))
    with pytest.warns(CacheWarning, match="is not used"):
        assert store.find(key) is None


def test_a_cache_object_that_cannot_be_written_is_a_warning_not_a_silent_miss(tmp_path):
    """A full or read-only cache folder: the run goes on, and says the task was not stored.
    (A folder planted where the object goes gives the same real I/O error as ENOSPC.)"""
    import hashlib

    from shoal.ensemble import run

    cache = tmp_path / "c"
    (cache / "objects" / hashlib.sha256(b"x\n").hexdigest()).mkdir(parents=True)
    with pytest.warns(CacheWarning, match=r"not stored: cache object .*objects/") as caught:
        assert run(_folder_workflow(tmp_path), journal=str(tmp_path / "a.db"), cache=str(cache)).ok
    assert any("p.s1.make not stored" in str(w.message) for w in caught)


def test_a_constant_or_helper_named_through_a_user_module_counts(tmp_path, monkeypatch):
    """``cfg.SCALE`` and ``pkg.sub.helper(x)``: attributes of the user's modules, by value."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "attack_pkg").mkdir()
    (tmp_path / "attack_pkg" / "__init__.py").write_text("")
    (tmp_path / "attack_use.py").write_text(
        "import attack_cfg\nimport attack_pkg.sub\n\ndef by_constant(x):\n    return attack_cfg.SCALE * x\n\n"
        "def by_submodule(x):\n    return attack_pkg.sub.helper(x)\n")

    def load(scale, step):
        (tmp_path / "attack_cfg.py").write_text(f"SCALE = {scale}\n")
        (tmp_path / "attack_pkg" / "sub.py").write_text(f"def helper(x):\n    return x + {step}\n")
        importlib.invalidate_caches()
        for name in ("attack_use", "attack_cfg", "attack_pkg", "attack_pkg.sub"):
            sys.modules.pop(name, None)
        mod = importlib.import_module("attack_use")
        return function_digest(mod.by_constant), function_digest(mod.by_submodule)

    try:
        first = load(2, 1)
        assert load(2, 1) == first
        second = load(3, 1)
        assert second[0] != first[0] and second[1] == first[1]
        assert load(3, 2)[1] != first[1]
    finally:
        for name in ("attack_use", "attack_cfg", "attack_pkg", "attack_pkg.sub"):
            sys.modules.pop(name, None)


def test_two_shoal_runs_sharing_one_cache_at_once_leave_it_whole(tmp_path):
    """Real concurrent `shoal run --reuse --cache` processes writing the same keys and objects:
    a third run reuses every task, with no warning, and gets the bytes the tasks wrote."""
    import subprocess

    from ens_tasks import ROOT

    log = tmp_path / "ran.log"
    tasks = "\n".join(
        f'          - {{name: t{i}, executable: /bin/sh, arguments: ["-c", "echo t{i} >> {log}; '
        f'seq {i} 20000 > o; sleep 0.2"], outputs: [o]}}' for i in range(4))
    (tmp_path / "wf.yaml").write_text(f"pipelines:\n  - name: p\n    stages:\n      - name: s\n        tasks:\n{tasks}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def start(journal):
        return subprocess.Popen([sys.executable, "-W", "error::UserWarning", "-m", "shoal", "run", "wf.yaml",
                                 "--reuse", "--cache", "c", "--journal", journal], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    runs = [start("a.db"), start("b.db")]
    for proc in runs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    third = start("c.db")
    out, _ = third.communicate(timeout=120)
    assert third.returncode == 0 and "(4 reused)" in out and "Warning" not in out, out
    assert sorted(set(log.read_text().split())) == ["t0", "t1", "t2", "t3"]
    for i in range(4):
        got = (tmp_path / "c.sandbox" / "p" / "s" / f"t{i}" / "o").read_text()
        assert got == "".join(f"{n}\n" for n in range(i, 20001))


def test_a_tool_put_earlier_on_path_between_two_runs_in_one_process_runs(tmp_path, monkeypatch):
    from shoal.ensemble import Pipeline, Stage, Task, run

    """The same PATH string, a new tool in its first folder: the new tool is what runs."""
    def tool(folder, says):
        (folder / "attack-tool").write_text(f"#!/bin/sh\necho {says} > o\n")
        (folder / "attack-tool").chmod(0o755)

    def wf():
        return [Pipeline([Stage([Task(executable="attack-tool", name="t", outputs=["o"])], name="s")], name="p")]

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tool(tmp_path / "a", "A")
    monkeypatch.setenv("PATH", f"{tmp_path / 'b'}{os.pathsep}{tmp_path / 'a'}{os.pathsep}{os.environ['PATH']}")
    journal = str(tmp_path / "run.db")
    assert run(wf(), journal=journal, reuse=True).ok
    tool(tmp_path / "b", "B")
    report = run(wf(), journal=journal, reuse=True)
    assert report.ok and report.reused == 0
    assert (tmp_path / "run.sandbox" / "p" / "s" / "t" / "o").read_text() == "B\n"


def test_a_cache_key_frames_positional_and_keyword_arguments(tmp_path):
    from shoal.cache import FunctionCache

    def f(*args, **kwargs):
        return args, kwargs

    cache = FunctionCache(tmp_path)
    assert cache.key(f, ("x",), {"k": 1}) != cache.key(f, (), {"str:1:xk": 1})
    assert cache.key(f, (1,), {}) != cache.key(f, (), {"a": 1})


@pytest.mark.parametrize("declared", ["outdir", "outdir/f"])
def test_staging_back_never_writes_through_a_link_left_in_the_sandbox(tmp_path, declared):
    """A sandbox left from before (a journal deleted, its sandbox kept) holding ``outdir ->
    elsewhere``: the outputs staged back from the cache land in the sandbox, not elsewhere."""
    from shoal.ensemble import Pipeline, Stage, Task, run

    def wf():
        return [Pipeline([Stage([Task(executable="/bin/sh", name="a", outputs=[declared],
                                      arguments=["-c", "mkdir -p outdir; echo data > outdir/f"])],
                                name="s")], name="p")]

    cache = str(tmp_path / "c")
    assert run(wf(), journal=str(tmp_path / "a.db"), cache=cache).ok
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    stale = tmp_path / "b.sandbox" / "p" / "s" / "a"
    stale.mkdir(parents=True)
    (stale / "outdir").symlink_to(elsewhere)
    report = run(wf(), journal=str(tmp_path / "b.db"), cache=cache)
    assert report.ok and report.reused == 1
    assert list(elsewhere.iterdir()) == []
    assert not (stale / "outdir").is_symlink() and (stale / "outdir" / "f").read_text() == "data\n"


def test_a_global_whose_attributes_raise_is_keyed_by_its_type_not_a_traceback(user_module):
    """A proxy bound to a context (``__getattr__`` / ``__getattribute__`` raise): hashing the
    function that names it neither runs its lookups into a crash nor gives up on the function."""
    from shoal.ensemble import Task
    from shoal.patterns.ensemble.reuse import task_key

    text = """
        class Lazy:
            def __getattr__(self, name):
                raise RuntimeError("working outside of context")
        class Locked:
            def __getattribute__(self, name):
                raise RuntimeError("locked")
        lazy, locked = Lazy(), Locked()
        def task(x):
            return lazy.value + locked.value + x + N
        """
    first = function_digest(user_module(text.replace("N", "1")).task)
    assert function_digest(user_module(text.replace("N", "2")).task) != first
    keyed = task_key(Task(function=user_module(text.replace("N", "1")).task, args=(1,)), resolve=str,
                     digests=FileDigests(), upstream_key=lambda uid: None, cwd=".")
    assert keyed.key is not None and keyed.parts["code"] == first


def test_a_pipe_among_inputs_or_outputs_neither_hangs_nor_is_reused(tmp_path):
    """A FIFO left in a folder: reading it to hash it would block for ever."""
    from shoal.ensemble import Pipeline, Stage, Task, run
    from shoal.patterns.ensemble.model import Input, Staging

    data = tmp_path / "data"
    data.mkdir()
    (data / "x").write_text("x\n")
    os.mkfifo(data / "pipe")
    log = tmp_path / "ran.log"

    def wf():
        make = Task(executable="/bin/sh", name="make", outputs=["out"],
                    arguments=["-c", f"echo make >> {log}; mkdir out; mkfifo out/p; echo y > out/y"])
        read = Task(executable="/bin/sh", name="read", inputs=[Input(str(data), "d", Staging.LINK)],
                    arguments=["-c", f"echo read >> {log}; cat d/x"])
        return [Pipeline([Stage([make, read], name="s")], name="p")]

    journal = str(tmp_path / "run.db")
    assert run(wf(), journal=journal, reuse=True).ok
    report = run(wf(), journal=journal, reuse=True)
    assert report.ok and report.reused == 1  # make: its pipe skipped; read: its input has a pipe
    assert sorted(log.read_text().split()) == ["make", "read", "read"]
    with pytest.raises(ValueError, match="pipe, socket or device"):
        FileDigests().digest(str(data))
