"""Safe re-runs and honest status (issue 14): each test failed before the fix.

Real `shoal run` / `shoal status` processes, real SQLite journals, real signals.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ens_tasks import ROOT, touch_count

from shoal.ensemble import EnsembleError, Pipeline, RunStatus, Stage, Task, TaskState, run
from shoal.patterns.ensemble.commands import resume_command


def shoal_cli(*args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


def _popen(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "shoal", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_running(journal, n=1, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(journal):
            try:
                if RunStatus.load(str(journal)).counts[TaskState.RUNNING] >= n:
                    return
            except EnsembleError:
                pass
        time.sleep(0.02)
    raise AssertionError("no task started")


def test_second_run_of_a_script_is_refused_clearly_and_new_starts_afresh(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    counter = tmp_path / "c"

    def wf():
        return Pipeline([Stage([Task(function=touch_count, args=(str(counter),)) for _ in range(3)])])

    assert run(wf).ok  # default journal run.db in the working directory
    with pytest.raises(EnsembleError, match=r"already holds a run; .*new=True \(shoal run --new\)"):
        run(wf)
    assert run(wf, new=True).ok
    assert len(counter.read_text().split()) == 6
    kept = list(tmp_path.glob("run.*.db"))
    assert len(kept) == 1
    assert RunStatus.load(str(kept[0])).counts[TaskState.DONE] == 3
    with pytest.raises(EnsembleError, match="choose one"):
        run(wf, new=True, resume=True)


FLAKY = '''
from shoal.ensemble import Pipeline, Stage, Task
FLAG = {flag!r}
workflow = [Pipeline([
    Stage([Task(executable="/bin/sh", name="picky", arguments=["-c", f"test -e {{FLAG}} || exit 4"]),
           Task(executable="/bin/true", name="fine")]),
    Stage([Task(executable="/bin/sh", arguments=["-c", "echo after > after.txt"], name="next")]),
], name="p")]
'''


def test_resume_retry_failed_reruns_failed_tasks_and_their_successors(tmp_path):
    flag = tmp_path / "flag"
    wf = tmp_path / "wf.py"
    wf.write_text(FLAKY.format(flag=str(flag)))
    first = shoal_cli("run", wf, cwd=tmp_path)
    assert first.returncode == 1 and "exit code 4" in first.stdout
    status = RunStatus.load(str(tmp_path / "run.db"))
    assert [s.state for s in status.pipelines[0].stages] == [TaskState.FAILED, TaskState.SKIPPED]
    flag.write_text("")
    plain = shoal_cli("run", wf, "--resume", cwd=tmp_path)  # FAILED is final without the flag
    assert plain.returncode == 1
    again = shoal_cli("run", wf, "--resume", "--retry-failed", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "run.sandbox/p/s1/next/after.txt").read_text() == "after\n"
    assert RunStatus.load(str(tmp_path / "run.db")).finished
    bad = shoal_cli("run", wf, "--retry-failed", cwd=tmp_path)
    assert bad.returncode == 2 and "needs resume=True" in bad.stderr


def test_resume_with_another_workflow_is_refused_saying_what_differs(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text('from shoal.ensemble import *\nworkflow = Pipeline([Stage([Task(executable="/bin/echo", '
                  'arguments=["a"])])])\n')
    assert shoal_cli("run", wf, cwd=tmp_path).returncode == 0
    wf.write_text('from shoal.ensemble import *\nworkflow = Pipeline([Stage([Task(executable="/bin/echo", '
                  'arguments=["b"])])])\n')
    out = shoal_cli("run", wf, "--resume", cwd=tmp_path)
    assert out.returncode == 2
    assert "holds another workflow" in out.stderr and "task p0.s0.t0: arguments ['a'] -> ['b']" in out.stderr
    assert "Traceback" not in out.stderr
    fresh = shoal_cli("run", wf, "--new", cwd=tmp_path)
    assert fresh.returncode == 0 and (tmp_path / "run.sandbox/p0/s0/t0/stdout").read_text() == "b\n"


def test_progress_true_false_and_callable(tmp_path, capsys):
    wf = [Pipeline([Stage([Task(executable="/bin/true") for _ in range(3)])])]
    assert run(wf, journal=str(tmp_path / "a.db"), progress=True).ok  # was: 'bool' object is not callable
    assert "3/3" in capsys.readouterr().err
    assert run(wf, journal=str(tmp_path / "b.db"), progress=False).ok
    seen = []
    assert run(wf, journal=str(tmp_path / "c.db"), progress=seen.append).ok
    assert seen[-1]["final"] and seen[-1]["done"] == 3
    with pytest.raises(EnsembleError, match="progress="):
        run(wf, journal=str(tmp_path / "d.db"), progress="yes")


SLEEPY = '''
from shoal.ensemble import Pipeline, Stage, Task
workflow = Pipeline([Stage([Task(executable="/bin/sh", arguments=["-c", "echo 1 >> ../../../../runs; sleep 0.5"])
                            for _ in range(8)]), Stage([Task(executable="/bin/true")])])
'''


def test_ctrl_c_drains_and_prints_the_exact_resume_command(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text(SLEEPY)
    journal = tmp_path / "j" / "run.db"
    journal.parent.mkdir()
    driver = _popen("run", wf, "--journal", journal, "--workers", 2, "--walltime", "1h", cwd=tmp_path)
    _wait_running(journal)
    driver.send_signal(signal.SIGINT)
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 130, out + err
    assert "Traceback" not in err
    assert "interrupted by SIGINT" in out
    assert f"finish with: shoal run {wf} --journal {journal} --resume --workers 2 --walltime 1h" in out
    status = RunStatus.load(str(journal))
    assert status.driver.state.value == "ended" and not status.finished
    assert status.counts[TaskState.RUNNING] == 0 and status.counts[TaskState.PENDING] > 0
    done = shoal_cli("run", wf, "--journal", journal, "--resume", "--workers", 2, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert RunStatus.load(str(journal)).finished


def test_resume_command_keeps_every_option():
    args = argparse.Namespace(workflow="wf.py", journal="x.db", dask="tcp://h:8786", workers=3, walltime="2h",
                              sandbox="/s", gpus=1, pickle_values=True, retries=2, retry_delay=0.5)
    assert resume_command(args) == ("shoal run wf.py --journal x.db --resume --dask tcp://h:8786 --workers 3 "
                                    "--walltime 2h --sandbox /s --gpus 1 --retries 2 --retry-delay 0.5 "
                                    "--pickle-values")


def test_task_timeout_does_not_stop_walltime_from_starting_tasks(tmp_path):
    wf = Pipeline([Stage([Task(executable="/bin/true", timeout=60) for _ in range(4)])])
    report = run(wf, journal=str(tmp_path / "run.db"), walltime="4s")
    assert report.ok and report.done == 4  # was: nothing ran, no reason given
    est = Pipeline([Stage([Task(executable="/bin/true", estimate=60)])])
    drained = run(est, journal=str(tmp_path / "e.db"), walltime="4s")
    assert drained.drained and "expected to take 60.0s" in drained.drain_reason


def test_status_shows_unstarted_stages_totals_and_failures(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text('from shoal.ensemble import *\nworkflow = [Pipeline([Stage([Task(executable="/bin/sh", '
                  'arguments=["-c", "echo broken pipe >&2; exit 2"])]), Stage([Task(executable="/bin/true")])]),'
                  ' Pipeline([Stage([Task(executable="/bin/true") for _ in range(3)]), '
                  'Stage([Task(executable="/bin/true") for _ in range(2)])])]\n')
    shoal_cli("run", wf, cwd=tmp_path)
    out = shoal_cli("status", "run.db", cwd=tmp_path)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert "finished: 5 done, 1 failed" in lines[0]
    assert any(ln.startswith("p0.s1") and "not started (pipeline failed at p0.s0)" in ln
               and ln.split()[-1] == "1" for ln in lines)  # its pipeline stopped; its task counted
    assert any(ln.split()[:3] == ["p1.s1", "done", "2"] for ln in lines)
    assert "| broken pipe" in out.stdout
    data = json.loads(shoal_cli("status", "run.db", "--json", cwd=tmp_path).stdout)
    assert data["total"] == 7 and data["counts"]["done"] == 5 and data["counts"]["skipped"] == 1
    assert data["driver"]["state"] == "ended"
    watch = shoal_cli("status", "run.db", "--watch", "0.1", cwd=tmp_path)  # an ended run: one frame
    assert watch.returncode == 0 and "finished" in watch.stdout


def test_status_of_a_live_run_has_eta_and_a_plan(tmp_path):
    wf = tmp_path / "wf.py"
    wf.write_text('from shoal.ensemble import *\nworkflow = Pipeline([Stage([Task(executable="/bin/sleep", '
                  'arguments=["0.3"]) for _ in range(12)]), Stage([Task(executable="/bin/true")])])\n')
    driver = _popen("run", wf, "--workers", 2, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                st = RunStatus.load(str(tmp_path / "run.db"))
                if st.counts[TaskState.DONE] >= 2 and st.driver.state.value == "alive":
                    break
            except EnsembleError:
                pass
            time.sleep(0.05)
        assert st.driver.state.value == "alive" and st.total == 13 and st.eta is not None and st.rate > 0
        assert [s.state for s in st.pipelines[0].stages] == [TaskState.RUNNING, TaskState.PENDING]
        assert st.pipelines[0].stages[1].pending == 1
    finally:
        driver.communicate(timeout=60)


@pytest.mark.parametrize("what", ["yaml", "dir", "missing"])
def test_status_of_a_non_journal_is_a_clear_error(tmp_path, what, capsys):
    from shoal.cli import main as cli_main

    path = tmp_path / "wf.yaml"
    if what == "yaml":
        path.write_text("pipelines: []\n")
    elif what == "dir":
        path = tmp_path
    assert cli_main(["status", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shoal: error: ")
    assert {"yaml": "not a shoal journal", "dir": "is a directory", "missing": "no journal at"}[what] in err


def _hooked_workflow():
    later = Task(executable="/bin/sh", arguments=["-c", "exit 1"], name="b")

    def change_later(ctx):  # an adaptive hook: edits a task that is already listed
        later.arguments = ["-c", "echo changed"]

    return Pipeline([Stage([Task(executable="/bin/true", name="a")], name="one", post_exec=change_later),
                     Stage([later], name="two")], name="p")


def test_a_hook_that_changes_a_listed_task_runs_the_change_and_resumes(tmp_path):
    """A listed task's journaled spec is the one it had when the run started (computed once,
    for the run's identity): what runs is what the hook made it, and a resume, replaying the
    same hook, is not refused as another workflow."""
    import sqlite3

    journal = str(tmp_path / "run.db")
    report = run(_hooked_workflow(), journal=journal)
    assert report.ok and report.done == 2, report.failures
    assert (tmp_path / "run.sandbox/p/two/b/stdout").read_text() == "changed\n"

    def rows():
        db = sqlite3.connect(journal)
        try:
            return db.execute("SELECT uid, spec, started FROM tasks ORDER BY uid").fetchall()
        finally:
            db.close()
    before = rows()
    assert "exit 1" in before[1][1]  # p.two.b: the workflow as given
    again = run(_hooked_workflow(), journal=journal, resume=True)
    assert again.ok and again.done == 2 and rows() == before  # accepted, nothing ran again
