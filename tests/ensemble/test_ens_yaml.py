"""YAML workflow files (shoal run workflow.yaml): the examples run, and each kind of bad file is an
error naming the file, the line and the key; the progress line of shoal run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
from ens_tasks import ROOT

from shoal.ensemble import EnsembleError, Pipeline, TaskKind, run
from shoal.patterns.ensemble.commands import Progress, progress_line
from shoal.patterns.ensemble.yamlfile import load_yaml

EXAMPLES = ROOT / "examples"


def shoal_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=cwd)


def test_yaml_ensemble_of_pipelines_through_cli(tmp_path):
    out = shoal_cli("run", EXAMPLES / "ensemble_pipelines.yaml", "--journal", tmp_path / "run.db",
                    "--workers", 2, "--walltime", "1h", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "5 done, 0 failed" in out.stdout and "summary.collect" in out.stdout
    assert (tmp_path / "run.sandbox/summary/collect/cat/stdout").read_text().split() == ["collecting", "30"]
    # the progress line: non-terminal stderr gets one line at the end of a short run, with the total
    lines = [ln for ln in out.stderr.splitlines() if "tasks/s" in ln]
    assert len(lines) == 1 and "5/5" in lines[0] and "ETA 0:00" in lines[0], out.stderr
    status = shoal_cli("status", tmp_path / "run.db", cwd=tmp_path)
    assert status.returncode == 0 and "member2.analyse" in status.stdout
    again = shoal_cli("run", EXAMPLES / "ensemble_pipelines.yaml", "--journal", tmp_path / "run.db", "--resume",
                      cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_yaml_pipeline_of_ensembles(tmp_path):
    pipelines = load_yaml(str(EXAMPLES / "ensemble_stages.yaml"))
    assert [s.name for s in pipelines[0].stages] == ["make", "square", "summary"]
    report = run(pipelines, journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 9
    assert report.result("p.square.t2") == 4
    assert (tmp_path / "run.sandbox/p/summary/cat/stdout").read_text().split() == ["0", "1", "2", "3"]


def test_yaml_all_task_fields(tmp_path):
    (tmp_path / "wf.yaml").write_text(textwrap.dedent("""\
        pipelines:
          - name: a
            stages:
              - name: s
                tasks:
                  - name: x
                    executable: /bin/sh
                    arguments: ["-c", "cat; echo $V", 3]
                    environment: {V: 1.5}
                    pre_exec: ["true"]
                    post_exec: ["true"]
                    stdin: in.txt
                    cores: 1
                    gpus: 0
                    memory: 1G
                    timeout: 30
                    estimate: 1.5
                    retries: 2
                    on_retry: "ens_tasks:square"
                    tags: {k: v}
                    inputs: [in.txt]
                    outputs: [o]
          - after: [a.s.x]
            stages:
              - after: [a]
                tasks:
                  - {function: "ens_tasks:add", args: [1], kwargs: {b: 2}, after: [a.s]}
        """))
    p = load_yaml(str(tmp_path / "wf.yaml"))
    t = p[0].stages[0].tasks[0]
    assert (t.arguments, t.environment, t.memory, t.retries, t.estimate) == (
        ["-c", "cat; echo $V", "3"], {"V": "1.5"}, "1G", 2, 1.5)
    assert t.on_retry.__name__ == "square" and t.inputs[0].target == "in.txt"
    f = p[1].stages[0].tasks[0]
    assert f.kind is TaskKind.FUNCTION and f.args == (1,) and f.kwargs == {"b": 2} and f.after == ["a.s"]
    assert p[1].name is None and p[1].after == ["a.s.x"] and isinstance(p[1], Pipeline)


TASK = "pipelines:\n  - stages:\n      - tasks:\n          - executable: /bin/true\n"
BAD = [
    # (file text, expected line, words the message must contain)
    (TASK + "            corse: 2\n", 5, ["unknown key 'corse'", "did you mean 'cores'"]),
    (TASK + "            cores: two\n", 5, ["tasks[0].cores", "expected an integer", "'two'"]),
    (TASK + "            cores: 0\n", 5, ["tasks[0].cores", ">= 1"]),
    (TASK + "            cores: true\n", 5, ["cores", "expected an integer"]),
    (TASK + "            timeout: soon\n", 5, ["timeout", "number of seconds"]),
    (TASK + "            memory: lots\n", 5, ["memory", "'2G'"]),
    (TASK + "            arguments: -c x\n", 5, ["arguments", "expected a list of strings"]),
    (TASK + "            arguments: [[1]]\n", 5, ["arguments[0]", "expected a string or number"]),
    (TASK + "            environment: [A]\n", 5, ["environment", "expected a mapping"]),
    (TASK + "            environment: {A: [1]}\n", 5, ["environment.A", "string or number"]),
    (TASK + "            after: [p0.s0.t9]\n", 5, ["after[0]", "'p0.s0.t9' names no pipeline", "p0.s0.t0"]),
    (TASK + "            inputs: [{source: '$p0.s0.t0/x', target: y, mode: hardlink}]\n", 5,
     ["inputs[0].mode", "copy, link or move"]),
    (TASK + "            inputs: [{source: '$nope.s.t/x', target: y}]\n", 5, ["inputs[0].source", "'nope.s.t'"]),
    (TASK + "            inputs: [{target: y}]\n", 5, ["inputs[0]", "missing key 'source'"]),
    (TASK + "            name: a.b\n", 5, ["name", "'a.b'"]),
    (TASK + "            args: [1]\n", 5, ["args", "function tasks only"]),
    (TASK + "            cores: 1\n            cores: 2\n", 6, ["'cores' is given twice"]),
    (TASK + "          - executable: /bin/true\n            name: t0\n", 6, ["'p0.s0.t0' is defined twice"]),
    (TASK + "          - function: nosuchmodule:f\n", 5, ["function", "cannot import module 'nosuchmodule'"]),
    (TASK + "          - function: os.path\n", 5, ["function", "expected 'module:function'"]),
    (TASK + "          - function: 'os:nope'\n", 5, ["function", "has no 'nope'"]),
    (TASK + "          - function: 'os:sep'\n", 5, ["function", "not callable"]),
    (TASK + "          - {function: 'os:getpid', pre_exec: [x]}\n", 5, ["pre_exec", "executable tasks only"]),
    (TASK + "          - {name: x}\n", 5, ["exactly one of 'executable' or 'function'"]),
    (TASK + "          - 7\n", 5, ["tasks[1]", "expected a mapping", "int"]),
    ("pipelines:\n  - stages:\n      - name: s\n", 3, ["stages[0]", "missing key 'tasks'"]),
    ("pipelines:\n  - stages:\n      - tasks: {a: 1}\n", 3, ["stages[0].tasks", "expected a list of tasks"]),
    ("pipelines:\n  - stages: []\n    extra: 1\n", 3, ["pipelines[0]", "unknown key 'extra'"]),
    ("pipelines:\n  - name: x\n", 2, ["pipelines[0]", "missing key 'stages'"]),
    ("pipelines: []\n", 1, ["pipelines", "empty"]),
    ("version: 1\n", 1, ["top level", "unknown key 'version'"]),
    ("- 1\n", 1, ["top level", "expected a mapping"]),
    ("", 1, ["empty"]),
    ("pipelines: [\n", 2, ["not valid YAML"]),
    ("pipelines:\n  - stages:\n    - tasks:\n\t- x\n", 4, ["not valid YAML"]),
]


@pytest.mark.parametrize("text,line,words", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_yaml_errors_name_line_and_key(tmp_path, text, line, words):
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    with pytest.raises(EnsembleError) as info:
        load_yaml(str(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    for w in words:
        assert w in msg, msg


def test_yaml_error_through_cli(tmp_path):
    (tmp_path / "wf.yml").write_text(TASK + "            corse: 2\n")
    out = shoal_cli("run", "wf.yml", cwd=tmp_path)
    assert out.returncode == 2 and "wf.yml:5:" in out.stderr and "'corse'" in out.stderr, out.stderr
    (tmp_path / "wf.txt").write_text("")
    out = shoal_cli("run", "wf.txt", cwd=tmp_path)
    assert out.returncode == 2 and ".yaml" in out.stderr


def test_yaml_failure_reported(tmp_path):
    (tmp_path / "wf.yaml").write_text(textwrap.dedent("""\
        pipelines:
          - stages:
              - tasks:
                  - {executable: /bin/sh, arguments: ["-c", "echo oops >&2; exit 3"], retries: 1}
          - stages:
              - tasks:
                  - {executable: /bin/true}
        """))
    out = shoal_cli("run", "wf.yaml", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "FAILED p0.s0.t0" in out.stdout and "exit code 3" in out.stdout and "oops" in out.stdout
    assert "1 done, 1 failed" in out.stdout


# -- the progress display -------------------------------------------------------------------
def _p(**kw):
    p = {"done": 3, "running": 2, "failed": 1, "skipped": 0, "waiting": 0, "total": 10, "rate": 2.0,
         "eta": 3.0, "elapsed": 2.0, "final": False}
    p.update(kw)
    return p


def test_progress_line():
    line = progress_line(_p())
    assert line.startswith("ensemble: [########............] 4/10 tasks")
    assert "running 2" in line and "failed 1" in line
    assert "2.0 tasks/s" in line and "ETA 0:03" in line
    lazy = progress_line(_p(total=None, eta=None))
    assert lazy.startswith("ensemble: 4/? tasks") and "ETA ?" in lazy
    assert "ETA 1:01:01" in progress_line(_p(eta=3661))


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_not_a_terminal_throttles():
    now = [0.0]
    stream = _Stream(False)
    prog = Progress(stream, interval=10, clock=lambda: now[0])
    for t in range(0, 35):  # the engine calls every 0.5 s; here once a second for 35 s
        now[0] = float(t)
        prog(_p(elapsed=t))
    prog(_p(final=True, done=9, running=0, eta=0.0))
    prog.end()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4, lines  # at 10, 20, 30 s and the final one
    assert "\r" not in stream.getvalue() and "10/10" in lines[-1]


def test_progress_terminal_redraws():
    stream = _Stream(True)
    prog = Progress(stream)
    prog(_p())
    prog(_p(done=5))
    prog.end()
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and "6/10" in text


def test_progress_eta_unknown_for_lazy_workflow(tmp_path):
    from ens_tasks import square

    from shoal.ensemble import Stage, Task

    seen = []

    def lazy():
        for i in range(5):
            yield Task(function=square, args=(i,))

    run(Pipeline([Stage(lazy())]), journal=str(tmp_path / "lazy.db"), progress=seen.append)
    assert seen[-1]["final"] and seen[-1]["total"] is None and seen[-1]["eta"] is None
    assert seen[-1]["done"] == 5 and "ETA ?" in progress_line(seen[-1])
    seen.clear()
    run([Pipeline([Stage([Task(function=square, args=(i,)) for i in range(5)])])],
        journal=str(tmp_path / "list.db"), progress=seen.append)
    assert seen[-1]["total"] == 5 and seen[-1]["eta"] == 0.0


def test_yaml_callables_from_a_module_next_to_the_file(tmp_path):
    """function/when/post_exec/on_retry by import path, from a module beside the YAML file (workers too)."""
    (tmp_path / "yhelpers.py").write_text(textwrap.dedent("""\
        def triple(x):
            return 3 * x

        def never(results):
            return False

        def big(results):
            return results["p.a.t0"] > 100

        def grow(ctx):
            from shoal.ensemble import Stage, Task
            if ctx.stage_index < 2:
                ctx.append(Stage([Task(function=triple, args=(ctx.stage_index,))], name=f"more{ctx.stage_index}"))
        """))
    (tmp_path / "wf.yaml").write_text(textwrap.dedent("""\
        pipelines:
          - name: p
            stages:
              - name: a
                post_exec: "yhelpers:grow"
                tasks:
                  - {function: "yhelpers:triple", args: [2]}
                  - {function: "yhelpers:triple", args: [1], when: "yhelpers:never"}
              - name: b
                when: "yhelpers:big"
                tasks:
                  - {executable: /bin/true}
        """))
    out = shoal_cli("run", "wf.yaml", "--journal", "run.db", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "2 done, 0 failed" in out.stdout and "p.more0" in out.stdout, out.stdout
    # when= false: the stage was skipped, shown as such (and counted) as shoal status shows it
    assert any(ln.startswith("p.b ") and "not started (skipped)" in ln for ln in out.stdout.splitlines())
    assert "4/4" in out.stderr, out.stderr  # t0, t1 (skipped), p.b's task (skipped), more0
    status = shoal_cli("status", "run.db", cwd=tmp_path)
    assert "p.a" in status.stdout


def test_yaml_sigkill_then_resume(tmp_path):
    """shoal run wf.yaml killed with SIGKILL mid-run; --resume finishes without re-running DONE tasks."""
    import signal
    import sqlite3
    import time

    side = tmp_path / "side"
    side.mkdir()
    task = ('          - {{name: x{i}, executable: /bin/sh, '
            'arguments: ["-c", "echo 1 >> {side}/$SHOAL_TASK; sleep 0.15"]}}\n')
    text = "pipelines:\n  - name: p\n    stages:\n"
    for s in range(2):
        text += f"      - name: s{s}\n        tasks:\n" + "".join(task.format(i=i, side=side) for i in range(8))
    (tmp_path / "wf.yaml").write_text(text)

    def done():
        try:
            db = sqlite3.connect(f"file:{tmp_path / 'run.db'}?mode=ro", uri=True, timeout=5)
            try:
                return {u for (u,) in db.execute("SELECT uid FROM tasks WHERE state='done'")}
            finally:
                db.close()
        except sqlite3.Error:
            return set()

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen([sys.executable, "-m", "shoal", "run", "wf.yaml", "--journal", "run.db"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(done()) < 4 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.02)
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.wait(30)
    done_at_kill = done()
    assert driver.returncode == -signal.SIGKILL and 4 <= len(done_at_kill) < 16
    out = shoal_cli("run", "wf.yaml", "--journal", "run.db", "--resume", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert len(done()) == 16
    assert "16/16" in out.stderr and "done 16" in out.stderr, out.stderr  # resumed tasks count as done
    for uid in done_at_kill:
        assert (side / uid).read_text() == "1\n", uid  # nothing DONE ran twice
