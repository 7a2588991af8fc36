"""Regression tests for ensemble findings F1/F4-F8: a run SIGKILLed by its own task, leftover
processes, journals with values shoal never writes.

Real processes throughout: `shoal run` as a subprocess SIGKILLed by its own task, real victims
for the leftover-kill check, real SQLite journals.  The attack tests themselves are in
tests/attack/test_ensemble_break.py (their xfail marks removed with each fix)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run
from shoal.patterns.ensemble.launcher import kill_leftover

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shoal_cli(*args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "shoal", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


# -- F4: a moved input is the only copy -------------------------------------------------------
def test_a_moved_input_survives_the_resume_after_its_driver_was_killed(tmp_path):
    """Attempt 1 moves input.txt into the sandbox, then SIGKILLs its own driver; the --resume
    stages again: before the fix it unlinked the moved file (the only copy) and then failed to
    move the (gone) source: FAILED (staging), the data lost everywhere."""
    src = tmp_path / "input.txt"
    src.write_text("precious\n")
    (tmp_path / "wf.py").write_text(
        "from shoal.ensemble import Input, Pipeline, Stage, Staging, Task\n"
        f"workflow = [Pipeline([Stage([Task(executable='/bin/sh', name='t', inputs=[Input({str(src)!r}, "
        "'in.txt', Staging.MOVE)], arguments=['-c', 'if [ -e ../../../../once ]; then cat in.txt; "
        "else touch ../../../../once; kill -9 $PPID; exit 1; fi'])], name='s')], name='p')]\n")
    first = shoal_cli("run", "wf.py", cwd=tmp_path)
    assert first.returncode == -9, first.stderr  # the task killed its driver mid-run
    assert not src.exists() and (tmp_path / "run.sandbox/p/s/t/in.txt").exists()
    second = shoal_cli("run", "wf.py", "--resume", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "run.sandbox/p/s/t/stdout").read_text() == "precious\n"


def test_a_missing_source_leaves_what_an_earlier_attempt_staged(tmp_path):
    """COPY and LINK: the target was unlinked before the source was checked; a vanished source
    now fails the staging without destroying the earlier attempt's copy."""
    from shoal.patterns.ensemble.launcher import LaunchError, stage_in
    from shoal.patterns.ensemble.model import Input, Staging

    box = tmp_path / "box"
    box.mkdir()
    (box / "in.txt").write_text("kept\n")
    for mode in (Staging.COPY, Staging.LINK, Staging.MOVE):
        (box / "in.txt").write_text("kept\n")
        inp = Input(str(tmp_path / "gone.txt"), "in.txt", mode)
        if mode is Staging.MOVE:
            stage_in([(inp, str(tmp_path / "gone.txt"))], str(box))  # moved in before: kept as it is
        else:
            with pytest.raises(LaunchError, match="gone.txt"):
                stage_in([(inp, str(tmp_path / "gone.txt"))], str(box))
        assert (box / "in.txt").read_text() == "kept\n", mode


# -- F1: a resume kills only a process that proves it is the task's ----------------------------
def test_kill_leftover_needs_the_tasks_own_environment(tmp_path):
    box = str(tmp_path / "p/s/t")
    env = dict(os.environ, SHOAL_TASK="p.s.t", SHOAL_SANDBOX=box)
    procs = [subprocess.Popen(["sleep", "60"], env=e, start_new_session=True)
             for e in (env, dict(env, SHOAL_TASK="p.s.u"), dict(os.environ))]
    try:
        starts = [psutil.Process(p.pid).create_time() for p in procs]
        assert not kill_leftover(procs[1].pid, starts[1], "p.s.t", box)  # another task's
        assert not kill_leftover(procs[2].pid, starts[2], "p.s.t", box)  # a stranger
        assert not kill_leftover(procs[0].pid, starts[0] + 5, "p.s.t", box)  # the pid reused
        assert not kill_leftover(procs[0].pid, starts[0], "p.s.t", box + "x")  # another sandbox
        for pid in (1, 0, -1, os.getpid(), "1", None):
            assert not kill_leftover(pid, 0.0, "p.s.t", box)
        assert all(p.poll() is None for p in procs)
        assert kill_leftover(procs[0].pid, starts[0], "p.s.t", box)  # the task's own: killed
        assert procs[0].wait(30) == -9
    finally:
        for p in procs:
            p.kill()
            p.wait()


# -- F8: an explicit name equal to a positional default -----------------------------------------
def _exe(name=None):
    return Task(executable="/bin/true", name=name)


@pytest.mark.parametrize("wf, words", [
    ([Pipeline([Stage([_exe()])]), Pipeline([Stage([_exe()])], name="p0")],
     "pipeline name 'p0' is used twice: pipeline 1 is named 'p0', which pipeline 0 (unnamed) has as its default"),
    ([Pipeline([Stage([_exe()]), Stage([_exe()], name="s0")], name="x")],
     "pipeline x: stage name 's0' is used twice: stage 1 is named 's0', which stage 0 (unnamed)"),
    ([Pipeline([Stage([_exe()], name="s1"), Stage([_exe()])], name="x")],
     "pipeline x: stage name 's1' is used twice: stage 0 is named 's1' and stage 1 (unnamed) gets 's1'"),
    ([Pipeline([Stage([_exe(), _exe("t0")], name="s")], name="x")],
     "stage x.s: task name 't0' is used twice: task 1 is named 't0', which task 0 (unnamed)"),
])
def test_an_explicit_name_equal_to_a_default_name_is_refused_naming_both(tmp_path, wf, words):
    with pytest.raises(EnsembleError) as err:
        run(wf, journal=str(tmp_path / "run.db"))
    assert words in str(err.value)


def test_names_that_only_look_like_defaults_are_fine(tmp_path):
    """t01, t-1, a later position's default (t5 among 2 tasks), and a name equal to the default of
    a position that is itself named: no clash."""
    wf = [Pipeline([Stage([_exe("t01"), _exe("t5"), _exe(), _exe("t-1")]),
                    Stage([_exe("t1"), _exe("t0")])], name="x")]
    report = run(wf, journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 6, report


# -- F5: a stage added to a pipeline that has finished -----------------------------------------
def test_a_stage_added_to_a_finished_pipeline_is_refused_and_the_pipeline_is_plain_again(tmp_path):
    """EnTK drops such a stage silently (its WFprocessor skips completed pipelines); shoal did too.
    Now the add_stages call itself raises, naming the stage and the pipeline; after the run the
    pipeline object takes stages again (the user may build another workflow from it)."""
    gate = tmp_path / "a-done"
    a = Pipeline([Stage([_exe()], post_exec=lambda: gate.touch())], name="a")

    def grow():
        a.add_stages(Stage([_exe()]))

    b = Pipeline([Stage([Task(executable="/bin/sh", arguments=["-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"])],
                        post_exec=grow)], name="b")
    with pytest.raises(EnsembleError) as err:
        run([a, b], journal=str(tmp_path / "run.db"))
    text = str(err.value)
    assert "stage a.s1 cannot be added to pipeline a: the pipeline has finished" in text, text
    assert type(a.stages) is list and len(a.stages) == 1
    a.add_stages(Stage([_exe()]))  # outside a run: fine again
    assert len(a.stages) == 2


def test_a_pipeline_growing_itself_from_its_last_stage_still_runs(tmp_path):
    """The EnTK adaptive idiom (a stage's post_exec adds the next stage to its own pipeline)."""
    p = Pipeline(name="loop")

    def more():
        if len(p.stages) < 3:
            p.add_stages(Stage([_exe()], post_exec=more))

    p.add_stages(Stage([_exe()], post_exec=more))
    report = run(p, journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 3, report


# -- F7: --resume of a journal holding values shoal never writes -------------------------------
@pytest.mark.parametrize("sql, rc", [
    ("UPDATE meta SET value='x' WHERE key='sessions'", 2),
    ("UPDATE meta SET value='-4' WHERE key='sessions'", 2),
    ("UPDATE tasks SET state='bogus'", 2),
    ("UPDATE tasks SET state='running', attempt='zz'", 2),
    ("UPDATE tasks SET state='running', attempt=-1", 2),
    ("UPDATE tasks SET state='failed', failure='bogus'", 2),
    ("UPDATE tasks SET spec=x'00ff'", 2),
    ("UPDATE meta SET value='[1]' WHERE key='plan'", 2),
    ("UPDATE meta SET value='{\"uid\": 1' WHERE key='plan'", 2),
    ("UPDATE meta SET value='[' || replace(hex(zeroblob(5000)), '00', '[') WHERE key='plan'", 2),
    ("UPDATE stages SET state='nope'", 0),  # read only for a stage after= (none here)
    ("UPDATE tasks SET state='running', pid='x', pid_start='y'", 0),  # not a pid: nothing killed, re-run
    ("UPDATE tasks SET state='running', pid=1, pid_start=0", 0),
    ("UPDATE tasks SET outputs=5", 0),
])
def test_resume_of_a_journal_with_values_shoal_never_writes(tmp_path, sql, rc):
    """Each was a ValueError/TypeError/RecursionError traceback (exit 1) from deep in the engine or
    the report; now one 'journal ... is damaged' line and exit 2, or a run that ignores a value
    it never acts on."""
    (tmp_path / "wf.py").write_text("from shoal.ensemble import Pipeline, Stage, Task\n"
                                    "workflow = [Pipeline([Stage([Task(executable='/bin/true')])])]\n")
    assert shoal_cli("run", "wf.py", cwd=tmp_path).returncode == 0
    import sqlite3

    db = sqlite3.connect(tmp_path / "run.db")
    db.execute(sql)
    db.commit()
    db.close()
    r = shoal_cli("run", "wf.py", "--resume", cwd=tmp_path)
    assert r.returncode == rc and "Traceback" not in r.stderr, r.stderr
    if rc == 2:
        assert "journal run.db is damaged or was not written by shoal (" in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("shoal: error: journal run.db is damaged"), r.stderr


# -- F6: a signal the caller ignores stays ignored ------------------------------------------------
def test_ignored_signals_stay_ignored_during_and_after_a_run(tmp_path):
    """The drain handler replaced an inherited SIG_IGN (the first SIGINT of a `trap '' INT` caller
    stopped the run, exit 130).  In process: SIGTERM ignored, SIGINT Python's default."""
    import signal

    seen = {}
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        def look():
            seen["term"] = signal.getsignal(signal.SIGTERM)
            seen["int"] = signal.getsignal(signal.SIGINT)

        report = run(Pipeline([Stage([_exe()], post_exec=look)]), journal=str(tmp_path / "run.db"))
        assert report.ok
        assert seen["term"] is signal.SIG_IGN  # left alone during the run
        assert seen["int"] not in (signal.SIG_IGN, signal.default_int_handler)  # the drain handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGTERM, old)
