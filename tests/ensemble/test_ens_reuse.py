"""Results reused across runs (issue 32 item 1): content-addressed task keys, --reuse, --cache,
--explain, and the pilot's cache.

Real executables writing real files, real SQLite journals, real worker processes; what ran is
counted twice: from each task's own side-effect line in a log file outside the sandboxes, and
from the journal's ``task_keys`` table.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
from ens_tasks import ROOT

import shoal
from shoal._taskkey import FileDigests, function_digest
from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run
from shoal.patterns.ensemble.reuse import CacheWarning, explain


def sh(line: str, log, **kw) -> Task:
    name = kw.pop("name", None)
    return Task(executable="/bin/sh", arguments=["-c", f"echo {name} >> {log}; {line}"], name=name, **kw)


def workflow(tmp, arg="X1"):
    """3 stages: gen -> three stage-2 tasks (one with an argument, one with an input file of its
    own) -> two stage-3 tasks, each reading some stage-2 outputs."""
    log = tmp / "ran.log"
    gen = sh("seq 3 > a.txt", log, name="gen", outputs=["a.txt"])
    a = "$p.s1.gen/a.txt"
    s2 = [sh(f"cat a.txt > b.txt; echo {arg} >> b.txt", log, name="t0", inputs=[a], outputs=["b.txt"]),
          sh("cat a.txt d.txt > b.txt", log, name="t1", inputs=[a, (str(tmp / "d1.txt"), "d.txt")],
             outputs=["b.txt"]),
          sh("cat a.txt > b.txt; echo t2 >> b.txt", log, name="t2", inputs=[a], outputs=["b.txt"])]
    s3 = [sh("cat x y > c.txt", log, name="u0", outputs=["c.txt"],
             inputs=[("$p.s2.t0/b.txt", "x"), ("$p.s2.t1/b.txt", "y")]),
          sh("cat x > c.txt; echo u1 >> c.txt", log, name="u1", outputs=["c.txt"],
             inputs=[("$p.s2.t2/b.txt", "x")])]
    return [Pipeline([Stage([gen], name="s1"), Stage(s2, name="s2"), Stage(s3, name="s3")], name="p")]


def ran(tmp) -> list[str]:
    """The tasks that ran since the last call (their side-effect lines), and start afresh."""
    log = tmp / "ran.log"
    names = sorted(log.read_text().split()) if log.exists() else []
    log.write_text("")
    return names


def journal_counts(journal) -> tuple[set, set]:
    """(uids reused, uids that ran) from the journal's task_keys table."""
    db = sqlite3.connect(journal)
    try:
        rows = db.execute("SELECT uid, reused FROM task_keys").fetchall()
    finally:
        db.close()
    return {u for u, r in rows if r}, {u for u, r in rows if not r}


def test_reuse_reruns_exactly_the_changed_tasks_and_their_dependents(tmp_path):
    (tmp_path / "d1.txt").write_text("one\n")
    journal = str(tmp_path / "run.db")
    assert run(workflow(tmp_path), journal=journal, reuse=True).ok
    assert ran(tmp_path) == ["gen", "t0", "t1", "t2", "u0", "u1"]

    (tmp_path / "d1.txt").write_text("two\n")  # t1's input file changes; t0's argument changes
    verdicts = dict(explain(workflow(tmp_path, arg="X2"), journal))
    assert ran(tmp_path) == []  # --explain runs nothing
    assert verdicts["p.s1.gen"].startswith("reused")
    assert verdicts["p.s2.t0"] == "runs: changed argument"
    assert verdicts["p.s2.t1"] == "runs: changed input file d.txt"
    assert verdicts["p.s2.t2"].startswith("reused")
    assert verdicts["p.s3.u0"] == "runs: an input comes from a task that runs (p.s2.t0)"
    assert verdicts["p.s3.u1"].startswith("reused")

    report = run(workflow(tmp_path, arg="X2"), journal=journal, reuse=True)
    assert report.ok and report.reused == 3
    assert ran(tmp_path) == ["t0", "t1", "u0"]
    reused, fresh = journal_counts(journal)
    assert reused == {"p.s1.gen", "p.s2.t2", "p.s3.u1"}
    assert fresh == {"p.s2.t0", "p.s2.t1", "p.s3.u0"}
    # the reused outputs were staged back: stage 3 read them, and a later run reuses them too
    sandbox = tmp_path / "run.sandbox" / "p"
    assert (sandbox / "s3" / "u0" / "c.txt").read_text() == "1\n2\n3\nX2\n1\n2\n3\ntwo\n"
    assert (sandbox / "s2" / "t2" / "b.txt").read_text() == "1\n2\n3\nt2\n"
    assert run(workflow(tmp_path, arg="X2"), journal=journal, reuse=True).reused == 6
    assert ran(tmp_path) == []


def test_an_upstream_that_reruns_with_the_same_bytes_leaves_its_dependents_reused(tmp_path):
    (tmp_path / "d1.txt").write_text("one\n")
    journal = str(tmp_path / "run.db")
    assert run(workflow(tmp_path), journal=journal, reuse=True).ok
    ran(tmp_path)
    wf = workflow(tmp_path)
    wf[0].stages[1].tasks[2].environment = {"UNUSED": "1"}  # t2 re-runs, writes the same b.txt
    assert dict(explain(wf, journal))["p.s2.t2"] == "runs: changed environment"
    assert run(wf, journal=journal, reuse=True).ok
    assert ran(tmp_path) == ["t2"]  # u1 reads t2's b.txt, whose bytes are the same: reused


def test_a_cache_entry_whose_output_was_deleted_is_rerun_not_reused(tmp_path):
    (tmp_path / "d1.txt").write_text("one\n")
    cache = tmp_path / "cache"
    assert run(workflow(tmp_path), journal=str(tmp_path / "a.db"), cache=str(cache)).ok
    ran(tmp_path)
    # another journal: only the cache folder is shared
    assert run(workflow(tmp_path), journal=str(tmp_path / "b.db"), cache=str(cache)).reused == 6
    assert ran(tmp_path) == []
    t2_out = (tmp_path / "b.sandbox" / "p" / "s2" / "t2" / "b.txt").read_bytes()
    import hashlib

    (cache / "objects" / hashlib.sha256(t2_out).hexdigest()).unlink()
    assert dict(explain(workflow(tmp_path), str(tmp_path / "none.db"), str(cache)))["p.s2.t2"] == \
        "runs: a recorded output was deleted or changed"
    with pytest.warns(CacheWarning, match="output b.txt of p.s2.t2 was deleted or changed"):
        report = run(workflow(tmp_path), journal=str(tmp_path / "c.db"), cache=str(cache))
    assert report.ok and report.reused == 5
    assert ran(tmp_path) == ["t2"]  # it wrote the same b.txt: u1 after it is reused
    assert (tmp_path / "c.sandbox" / "p" / "s3" / "u1" / "c.txt").read_text() == "1\n2\n3\nt2\nu1\n"


def test_an_old_sandbox_output_changed_since_is_rerun(tmp_path):
    (tmp_path / "d1.txt").write_text("one\n")
    journal = str(tmp_path / "run.db")
    assert run(workflow(tmp_path), journal=journal, reuse=True).ok
    ran(tmp_path)
    (tmp_path / "run.sandbox" / "p" / "s1" / "gen" / "a.txt").write_text("tampered\n")
    with pytest.warns(CacheWarning, match="output a.txt of p.s1.gen was deleted or changed"):
        assert run(workflow(tmp_path), journal=journal, reuse=True).ok
    assert ran(tmp_path) == ["gen"]  # it wrote a.txt as before: the rest is reused
    sandbox = tmp_path / "run.sandbox" / "p"
    assert (sandbox / "s1" / "gen" / "a.txt").read_text() == "1\n2\n3\n"


def test_a_torn_or_tampered_cache_entry_is_a_miss_with_a_warning(tmp_path):
    (tmp_path / "d1.txt").write_text("one\n")
    cache = tmp_path / "cache"
    assert run(workflow(tmp_path), journal=str(tmp_path / "a.db"), cache=str(cache)).ok
    ran(tmp_path)
    entries = sorted((cache / "keys").iterdir())
    assert len(entries) == 6
    for e in entries:
        blob = bytearray(e.read_bytes())
        blob[-3] ^= 1  # one flipped bit in the body: its checksum no longer matches
        e.write_bytes(bytes(blob))
    with pytest.warns(CacheWarning, match="checksum does not match"):
        assert run(workflow(tmp_path), journal=str(tmp_path / "b.db"), cache=str(cache)).reused == 0
    assert ran(tmp_path) == ["gen", "t0", "t1", "t2", "u0", "u1"]


def test_a_reused_tasks_stdout_is_staged_back_for_the_tasks_that_read_it(tmp_path):
    """Regression: only the declared outputs were staged back, so a later task's input
    ``$p.s1.a/stdout`` was missing in the new sandbox and that task failed at staging."""
    def wf(word):
        return [Pipeline([
            Stage([Task(executable="/bin/echo", arguments=["hi"], name="a"),
                   Task(executable="/bin/echo", arguments=[word], name="b")], name="s1"),
            Stage([Task(executable="/bin/cat", arguments=["x"], inputs=[("$p.s1.a/stdout", "x")], name="c")],
                  name="s2")], name="p")]
    journal = str(tmp_path / "run.db")
    assert run(wf("one"), journal=journal, reuse=True).ok
    report = run(wf("two"), journal=journal, reuse=True)
    assert report.ok and report.reused == 2
    assert (tmp_path / "run.sandbox/p/s2/c/stdout").read_text() == "hi\n"
    assert (tmp_path / "run.sandbox/p/s1/a/stdout").read_text() == "hi\n"


def test_a_changed_executable_file_is_changed_code(tmp_path):
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\necho tool >> ran.log\necho 1 > out\n")
    tool.chmod(0o755)
    log = tmp_path / "ran.log"

    def wf():
        return Pipeline([Stage([Task(executable=str(tool), outputs=["out"], name="t",
                                     post_exec=[f"echo t >> {log}"])])])
    journal = str(tmp_path / "run.db")
    assert run(wf(), journal=journal, reuse=True).ok
    tool.write_text("#!/bin/sh\necho 2 > out\n")
    assert dict(explain(wf(), journal))["p0.s0.t"] == "runs: changed code"
    assert run(wf(), journal=journal, reuse=True).reused == 0


# -- functions ---------------------------------------------------------------------------------
USER_MODULES = {
    "reuse_helpers.py": "SCALE = 3\n\ndef helper(x):\n    return x * SCALE\n",
    "reuse_tasks.py": textwrap.dedent("""\
        import os
        import reuse_helpers
        from reuse_helpers import helper

        def counted(name):
            with open(os.environ["REUSE_LOG"], "a") as f:
                f.write(name + "\\n")

        def uses_helper(x):
            counted("uses_helper")
            return helper(x) + 1

        def via_module(x):
            counted("via_module")
            return reuse_helpers.helper(x)

        def alone(x):
            counted("alone")
            return [x, x]
        """),
}


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    for name, text in USER_MODULES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("reuse_tasks", "reuse_helpers"):
        sys.modules.pop(name, None)


def _reload(tmp_path, helper_text):
    (tmp_path / "reuse_helpers.py").write_text(helper_text)
    importlib.invalidate_caches()
    for name in ("reuse_tasks", "reuse_helpers"):
        sys.modules.pop(name, None)
    return importlib.import_module("reuse_tasks")


def test_a_function_key_follows_its_helpers_code_in_the_users_modules(user_modules):
    tasks = importlib.import_module("reuse_tasks")
    before = {n: function_digest(getattr(tasks, n)) for n in ("uses_helper", "via_module", "alone")}
    tasks = _reload(user_modules, "SCALE = 3\n\n\n# a comment and a blank line move it\ndef helper(x):\n"
                                  "    return x * SCALE\n")
    assert {n: function_digest(getattr(tasks, n)) for n in before} == before  # lines moved: same
    tasks = _reload(user_modules, "SCALE = 3\n\ndef helper(x):\n    return x * SCALE + 0\n")
    after = {n: function_digest(getattr(tasks, n)) for n in before}
    assert after["uses_helper"] != before["uses_helper"]
    assert after["via_module"] != before["via_module"]  # reuse_helpers.helper(x): also followed
    assert after["alone"] == before["alone"]
    tasks = _reload(user_modules, "SCALE = 4\n\ndef helper(x):\n    return x * SCALE + 0\n")
    # SCALE, plain data among helper's globals, counts by value
    assert function_digest(tasks.uses_helper) != after["uses_helper"]
    assert function_digest(tasks.via_module) != after["via_module"]
    assert function_digest(tasks.alone) == before["alone"]


def test_a_closure_over_an_object_is_never_reused(tmp_path):
    class Opaque:
        pass

    box = Opaque()

    def f():
        return id(box) and 1

    wf = [Pipeline([Stage([Task(function=f, name="f")])])]
    verdict = dict(explain(wf, str(tmp_path / "run.db")))["p0.s0.f"]
    assert verdict.startswith("runs: cannot be keyed (closure variable box of")


def test_function_tasks_rerun_when_their_helper_changed_through_shoal_run(user_modules):
    """Real `shoal run --reuse` processes: the worker imports the edited module from its file."""
    tmp = user_modules
    (tmp / "wf.yaml").write_text(textwrap.dedent("""\
        pipelines:
          - name: p
            stages:
              - name: s
                tasks:
                  - {name: a, function: "reuse_tasks:uses_helper", args: [2]}
                  - {name: b, function: "reuse_tasks:alone", args: [2]}
        """))
    env = dict(os.environ, PYTHONPATH=f"{tmp}{os.pathsep}{ROOT}", REUSE_LOG=str(tmp / "ran.log"))

    def shoal_run(*flags):
        out = subprocess.run([sys.executable, "-m", "shoal", "run", "wf.yaml", *flags], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    shoal_run("--reuse")
    assert ran(tmp) == ["alone", "uses_helper"]
    (tmp / "reuse_helpers.py").write_text("SCALE = 3\n\ndef helper(x):\n    return x * SCALE * 2\n")
    explained = shoal_run("--explain")
    assert "p.s.a: runs: changed code" in explained and "p.s.b: reused (journal run.db)" in explained
    assert ran(tmp) == []
    assert "(1 reused)" in shoal_run("--reuse")
    assert ran(tmp) == ["uses_helper"]
    db = sqlite3.connect(tmp / "run.db")
    try:
        from shoal.patterns.ensemble.values import Values, decode

        result = db.execute("SELECT result FROM tasks WHERE uid='p.s.b'").fetchone()[0]
        assert decode(result, Values.DATA, "p.s.b") == [2, 2]  # the reused value, as data
        assert db.execute("SELECT why FROM task_keys WHERE uid='p.s.a'").fetchone()[0] == "changed code"
    finally:
        db.close()


def test_shoal_run_reuse_and_explain_name_each_reason(tmp_path):
    """The CLI flags end to end: `shoal run --explain` prints a line per task and runs nothing."""
    (tmp_path / "d1.txt").write_text("one\n")
    log = tmp_path / "ran.log"
    text = textwrap.dedent(f"""\
        pipelines:
          - name: p
            stages:
              - name: s1
                tasks:
                  - {{name: t0, executable: /bin/sh, arguments: ["-c", "echo t0 >> {log}; echo ARG > o"], outputs: [o]}}
                  - {{name: t1, executable: /bin/sh, arguments: ["-c", "echo t1 >> {log}; cat d > o"], inputs: [{{source: d1.txt, target: d}}], outputs: [o]}}
              - name: s2
                tasks:
                  - {{name: t0, executable: /bin/sh, arguments: ["-c", "echo u >> {log}; cat x y > o"], inputs: [{{source: "$p.s1.t0/o", target: x}}, {{source: "$p.s1.t1/o", target: y}}]}}
        """)
    (tmp_path / "wf.yaml").write_text(text.replace("ARG", "1"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def cli(*flags):
        out = subprocess.run([sys.executable, "-m", "shoal", "run", "wf.yaml", *flags], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    cli("--reuse", "--cache", "c")
    ran(tmp_path)
    (tmp_path / "wf.yaml").write_text(text.replace("ARG", "2"))
    (tmp_path / "d1.txt").write_text("two\n")
    assert cli("--explain").splitlines() == [
        "p.s1.t0: runs: changed argument", "p.s1.t1: runs: changed input file d",
        "p.s2.t0: runs: an input comes from a task that runs (p.s1.t0)"]
    (tmp_path / "wf.yaml").write_text(text.replace("ARG", "1"))
    (tmp_path / "d1.txt").write_text("one\n")
    assert cli("--explain", "--journal", "other.db", "--cache", "c").splitlines() == [
        f"p.s1.t0: reused (cache {tmp_path / 'c'})", f"p.s1.t1: reused (cache {tmp_path / 'c'})",
        f"p.s2.t0: reused (cache {tmp_path / 'c'})"]
    assert ran(tmp_path) == []
    assert "(3 reused)" in cli("--reuse", "--journal", "other.db", "--cache", "c")
    assert ran(tmp_path) == []


def test_a_cache_that_is_not_a_folder_is_one_clear_error_and_frees_the_journal(tmp_path):
    (tmp_path / "afile").write_text("")
    wf = [Pipeline([Stage([Task(executable="/bin/true")])])]
    journal = str(tmp_path / "run.db")
    with pytest.raises(EnsembleError, match=r"cache folder .*afile: cannot create keys/: Not a directory"):
        run(wf, journal=journal, cache=str(tmp_path / "afile"))
    assert run(wf, journal=journal, resume=True).ok  # the lock was released


def test_the_resume_command_of_a_reuse_run_keeps_reusing():
    import argparse

    from shoal.patterns.ensemble.commands import resume_command

    args = argparse.Namespace(workflow="wf.yaml", journal="x.db", dask=None, workers=None, walltime=None,
                              sandbox=None, gpus=0, pickle_values=False, retries=0, retry_delay=None,
                              reuse=True, cache="c")
    assert resume_command(args) == "shoal run wf.yaml --journal x.db --resume --reuse --cache c"


# -- the stat pre-check ------------------------------------------------------------------------
def test_the_stat_precheck_rehashes_only_files_whose_stat_changed(tmp_path):
    f = tmp_path / "data"
    f.write_bytes(b"x" * 1000)
    old = time.time() - 60
    os.utime(f, (old, old))
    d = FileDigests()
    first = d.digest(str(f))
    assert d.hashed == 1
    assert d.digest(str(f)) == first and d.hashed == 1  # (size, mtime_ns, inode) unchanged
    d2 = FileDigests(json.loads(json.dumps(d.entries)))  # as saved in the journal and loaded
    assert d2.digest(str(f)) == first and d2.hashed == 0
    f.write_bytes(b"y" * 1000)  # same size, new mtime
    assert d2.digest(str(f)) != first and d2.hashed == 1
    g = tmp_path / "fresh"
    g.write_bytes(b"z")  # modified just now: not trusted by the pre-check (racily clean)
    d2.digest(str(g))
    d2.digest(str(g))
    assert d2.hashed == 3


# -- the pilot's cache ---------------------------------------------------------------------------
def _count(path):
    with open(path, "a") as f:
        f.write("x\n")


def test_cached_function_runs_once_and_a_tampered_file_is_a_miss(tmp_path):
    log = tmp_path / "n"

    @shoal.cached(tmp_path / "c")
    def square(x):  # (a closure over a list that it appended to would change its own key)
        _count(log)
        return {"x": x, "sq": (x * x,)}

    assert square(3) == square(3) == {"x": 3, "sq": (9,)}
    assert log.read_text().split() == ["x"]
    (entry,) = (tmp_path / "c").iterdir()
    entry.write_bytes(entry.read_bytes()[:-2])  # torn
    with pytest.warns(CacheWarning, match="is not used"):
        assert square(3) == {"x": 3, "sq": (9,)}
    assert log.read_text().split() == ["x", "x"]
    with pytest.raises(ValueError, match=r"argument 0 of .*square: a value of type builtins.object"):
        square(object())


class Point:  # not plain data: stored only with pickle=True
    def __init__(self, x):
        self.x = x


def make_point(log, x):
    _count(log)
    return Point(x)


def test_a_pickled_cache_file_is_read_only_with_the_opt_in(tmp_path):
    log = str(tmp_path / "n")
    with pytest.warns(CacheWarning, match="not plain data and was not stored"):
        shoal.cached(tmp_path / "c")(make_point)(log, 1)
    assert list((tmp_path / "c").iterdir()) == []
    pickled = shoal.cached(tmp_path / "c", pickle=True)(make_point)
    assert pickled(log, 1).x == 1 and pickled(log, 1).x == 1
    assert len((tmp_path / "n").read_text().split()) == 2
    with pytest.warns(CacheWarning) as seen:
        shoal.cached(tmp_path / "c")(make_point)(log, 1)  # without the opt-in: a miss, never unpickled
    assert "stored with pickle" in str(seen[0].message)
    assert "not plain data and was not stored" in str(seen[1].message)
    assert len((tmp_path / "n").read_text().split()) == 3


def test_pilot_options_cache_skips_the_worker_on_a_hit(tmp_path):
    log = tmp_path / "n"
    with shoal.Pilot(2) as pilot:
        opts = pilot.options(cache=tmp_path / "c")
        assert opts.submit(_count_and_add, str(log), 2, b=3).result() == 5  # stored by the worker
        hit = opts.submit(_count_and_add, str(log), 2, b=3)
        assert hit.done() and hit.result() == 5
        assert opts.submit(_count_and_add, str(log), 2, b=4).result() == 6
        with pytest.raises(ValueError, match="apply to submit"):
            opts.map(abs, [1])
    assert log.read_text().split() == ["x", "x"]


def _count_and_add(log, a, b):
    _count(log)
    return a + b


def test_entk_appmanager_reuses_the_previous_session(tmp_path, monkeypatch):
    """EnTK's AppManager: each run() is a new session (the old journal kept under a dated name);
    with reuse=True it reuses the previous session's finished tasks."""
    from shoal.entk import AppManager
    from shoal.entk import Pipeline as EPipeline
    from shoal.entk import Stage as EStage
    from shoal.entk import Task as ETask

    monkeypatch.chdir(tmp_path)
    log = tmp_path / "ran.log"

    def workflow(arg):
        p = EPipeline()
        for i in range(2):
            s = EStage()
            t = ETask()
            t.name = f"t{i}"
            t.executable = "/bin/sh"
            t.arguments = ["-c", f"echo t{i} >> {log}; echo {arg if i else 'same'} > o"]
            s.add_tasks(t)
            p.add_stages(s)
        return [p]

    for arg, expect in (("a", ["t0", "t1"]), ("b", ["t1"]), ("b", [])):
        appman = AppManager(resource_desc={"resource": "local.localhost", "cpus": 1}, reuse=True)
        appman.workflow = workflow(arg)
        appman.run()
        assert ran(tmp_path) == expect, arg
    assert appman.report.reused == 2
