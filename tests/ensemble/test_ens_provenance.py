"""What each attempt used, as the journal records it (usage.py): peak RSS, CPU time, bytes,
host and node runtime, for executables and function tasks; failed attempts too; a journal of
the previous schema is migrated in place and still read by ``shoal status --tasks``.

The references are outside the journal: the size a task allocates, and the CPU time the task's
process measures of itself (``getrusage`` at its end) -- never the wall clock."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sqlite3
import subprocess
import sys

import pytest
from ens_tasks import ROOT

import shoal
from shoal.cli import main
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.patterns.ensemble.attempts import attempts
from shoal.patterns.ensemble.journal import SCHEMA_VERSION, Journal, open_readonly

MIB = 1 << 20
ALLOC = 200 * MIB
# a process that allocates and touches ALLOC bytes (b"\1" * n writes every page)
ALLOC_PY = f"b = b'\\x01' * {ALLOC}"
# a process that spins for one CPU second and prints the CPU it measured of itself at the end
BUSY_PY = ("import resource, time\n"
           "t = time.process_time()\n"
           "while time.process_time() - t < 1.0: pass\n"
           "r = resource.getrusage(resource.RUSAGE_SELF)\n"
           "print(r.ru_utime + r.ru_stime)")


def _rows(db, table="tasks"):
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.row_factory = sqlite3.Row
        return {r["uid"] if table == "tasks" else (r["uid"], r["attempt"]): dict(r)
                for r in c.execute(f"SELECT * FROM {table}")}


def _fresh(argv: list[str]) -> list[str]:
    """``argv`` as a fork of a small shell.  A peak RSS below the driver's own cannot be told
    from it (usage.own_peak), and a process this test process starts directly inherits this
    process's peak (the exec keeps the spawner's high-water mark; it has grown with the tests
    before): the shell's fork starts the driver from the shell's few MB instead."""
    return ["/bin/sh", "-c", " ".join(map(shlex.quote, argv)) + "; exit $?"]


def _shoal_run(tmp_path, workflow: str, *args) -> subprocess.CompletedProcess:
    """``shoal run`` in a fresh driver process (``_fresh``)."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(workflow)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(_fresh([sys.executable, "-m", "shoal", "run", str(wf), "--journal",
                                  str(tmp_path / "run.db"), *args]),
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def test_executable_peak_rss_and_cpu_time(tmp_path):
    out = _shoal_run(tmp_path, f"""
pipelines:
  - name: p
    stages:
      - tasks:
          - {{name: mem, executable: {sys.executable}, arguments: ["-c", {json.dumps(ALLOC_PY)}]}}
          - {{name: busy, executable: {sys.executable}, arguments: ["-c", {json.dumps(BUSY_PY)}]}}
""", "--workers", "2")
    assert out.returncode == 0, out.stderr
    rows = _rows(str(tmp_path / "run.db"))
    mem, busy = rows["p.s0.mem"], rows["p.s0.busy"]
    assert abs(mem["max_rss"] - ALLOC) <= 0.1 * ALLOC, mem["max_rss"] / MIB
    own = float((tmp_path / "run.sandbox/p/s0/busy/stdout").read_text())  # the process's own figure
    cpu = busy["cpu_user"] + busy["cpu_sys"]
    assert own >= 1.0  # the loop ran its CPU second
    assert own <= cpu <= 1.1 * own, (own, cpu)  # the journal's includes the exit after its print
    for row in (mem, busy):
        assert row["host"] == socket.gethostname() and row["node"].startswith("cpus ")
        assert row["read_chars"] > 0  # the interpreter read its modules


def test_a_small_task_of_a_big_driver_has_no_peak_rss_rather_than_the_drivers(tmp_path):
    """Before: every /bin/true of a driver that had once held 300 MB showed a 338 MB peak
    (a child's ru_maxrss starts at its parent's peak at the exec)."""
    script = tmp_path / "driver.py"
    script.write_text(f"""
import sys
from shoal.ensemble import Pipeline, Stage, Task, run
held = b"x" * (300 << 20)  # the driver's peak: 300 MB and more
del held
grow = "b = b'\\x01' * (450 << 20)"
run(Pipeline([Stage([Task(executable="/bin/true", name="small"),
                     Task(executable=sys.executable, arguments=["-c", grow], name="big")])], name="p"),
    journal={str(tmp_path / "run.db")!r}, cores=2)
""")
    out = subprocess.run(_fresh([sys.executable, str(script)]), capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = _rows(str(tmp_path / "run.db"))
    assert rows["p.s0.small"]["max_rss"] is None and rows["p.s0.small"]["cpu_user"] is not None
    assert abs(rows["p.s0.big"]["max_rss"] - 450 * MIB) <= 45 * MIB  # above the driver: its own


def test_bytes_written_by_an_executable(tmp_path):
    db = str(tmp_path / "run.db")
    script = f"with open('out', 'wb') as f: f.write(b'x' * {5 * MIB})"
    assert run(Pipeline([Stage([Task(executable=sys.executable, arguments=["-c", script], name="w")])],
                        name="p"), journal=db, cores=1).ok
    row = _rows(db)["p.s0.w"]
    assert 5 * MIB <= row["write_chars"] < 6 * MIB


def test_function_task_measured_in_its_worker(tmp_path):
    from ens_tasks import alloc_bytes, busy_cpu, nap

    db = str(tmp_path / "run.db")
    wf = Pipeline([Stage([Task(function=nap, args=(0,), name="idle")]),
                   Stage([Task(function=alloc_bytes, args=(ALLOC,), name="mem")]),
                   Stage([Task(function=busy_cpu, args=(1.0,), name="busy")])], name="p")
    with shoal.Pilot(workers=1) as pilot:  # one worker: the three calls share its process
        report = run(wf, pilot=pilot, journal=db)
    assert report.ok
    own_cpu = report.result("p.s2.busy")
    rows = _rows(db)
    idle, mem, busy = rows["p.s0.idle"], rows["p.s1.mem"], rows["p.s2.busy"]
    # the worker process's peak during the call, its own memory included: above the idle call's
    # peak (the worker alone) by what the call allocated
    assert abs((mem["max_rss"] - idle["max_rss"]) - ALLOC) <= 0.1 * ALLOC, (mem["max_rss"], idle["max_rss"])
    cpu = busy["cpu_user"] + busy["cpu_sys"]
    assert own_cpu >= 1.0 and own_cpu <= cpu <= 1.1 * own_cpu, (own_cpu, cpu)
    for row in (idle, mem, busy):
        assert row["host"] == socket.gethostname() and row["node"].startswith("worker ")


def test_failed_attempts_keep_what_they_used(tmp_path):
    from ens_tasks import boom

    db = str(tmp_path / "run.db")
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\nraise SystemExit(3)"
    wf = Pipeline([Stage([Task(executable=sys.executable, arguments=["-c", burn], name="exe", retries=1),
                          Task(function=boom, name="fn")])], name="p")
    report = run(wf, journal=db, cores=2)
    assert report.failed == 2 and report.retries == 1
    failed = _rows(db, "failed_attempts")
    for attempt in (1, 2):
        row = failed[("p.s0.exe", attempt)]
        assert row["exit_code"] == 3 and row["cpu_user"] + row["cpu_sys"] >= 0.2
        assert row["host"] == socket.gethostname()
    fn = failed[("p.s0.fn", 1)]  # the exception carried the worker's measurement back
    assert fn["node"].startswith("worker ") and fn["cpu_user"] is not None
    with contextlib.closing(open_readonly(db)) as conn:
        listed = [(a.uid, a.attempt, a.state.value) for a in attempts(conn)]
    assert sorted(listed) == [("p.s0.exe", 1, "failed"), ("p.s0.exe", 2, "failed"), ("p.s0.fn", 1, "failed")]


# -- the schema-2 journal: built by hand with that schema's CREATE statements ------------
OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE tasks (
    uid TEXT PRIMARY KEY, pipeline TEXT, stage TEXT, kind TEXT, state TEXT NOT NULL,
    attempt INTEGER DEFAULT 0, pid INTEGER, pid_start REAL, sandbox TEXT,
    started REAL, finished REAL, exit_code INTEGER, failure TEXT, reason TEXT,
    stderr_tail TEXT, result BLOB, outputs TEXT, session INTEGER, spec TEXT);
CREATE TABLE stages (uid TEXT PRIMARY KEY, pipeline TEXT, state TEXT NOT NULL);
CREATE TABLE failed_attempts (
    uid TEXT, attempt INTEGER, started REAL, finished REAL, failure TEXT, exit_code INTEGER,
    reason TEXT, PRIMARY KEY (uid, attempt));
"""
OLD_TASK_COLUMNS = ("uid, pipeline, stage, kind, state, attempt, pid, pid_start, sandbox, started, finished, "
                    "exit_code, failure, reason, stderr_tail, result, outputs, session, spec")


def _as_schema_2(new_db: str, old_db: str) -> None:
    """A copy of ``new_db`` in schema 2: the old tables, the rows' old columns, meta schema=2."""
    with contextlib.closing(sqlite3.connect(old_db)) as old, contextlib.closing(sqlite3.connect(new_db)) as new:
        old.executescript(OLD_SCHEMA)
        old.executemany("INSERT INTO meta VALUES (?, ?)",
                        [(k, "2" if k == "schema" else v) for k, v in new.execute("SELECT key, value FROM meta")])
        old.executemany(f"INSERT INTO tasks ({OLD_TASK_COLUMNS}) VALUES ({', '.join('?' * 19)})",
                        new.execute(f"SELECT {OLD_TASK_COLUMNS} FROM tasks").fetchall())
        old.executemany("INSERT INTO stages VALUES (?, ?, ?)", new.execute("SELECT * FROM stages").fetchall())
        old.executemany("INSERT INTO failed_attempts VALUES (?, ?, ?, ?, ?, ?, ?)", new.execute(
            "SELECT uid, attempt, started, finished, failure, exit_code, reason FROM failed_attempts").fetchall())
        old.commit()


def _flaky_wf(tmp_path):
    count = tmp_path / "count"
    script = (f'n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; '
              f'[ "$n" -gt 1 ] && exec {sys.executable} -c "{ALLOC_PY}"; exit 1')
    return Pipeline([Stage([Task(executable="/bin/true", name="ok"),
                            Task(executable="/bin/sh", arguments=["-c", script], name="flaky")])], name="p")


def test_a_schema_2_journal_is_read_then_migrated_by_its_resume(tmp_path, capsys):
    first, db = str(tmp_path / "first.db"), str(tmp_path / "old.db")
    assert run(_flaky_wf(tmp_path), journal=first, cores=1).failed == 1
    _as_schema_2(first, db)
    # read as it is (read-only: nothing written): the figures are unknown, the rows listed
    assert main(["status", db, "--tasks"]) == 0
    out = capsys.readouterr().out
    assert "p.s0.flaky" in out and "p.s0.ok" in out
    with contextlib.closing(open_readonly(db)) as conn:
        assert {a.uid: a.max_rss for a in attempts(conn)} == {"p.s0.ok": None, "p.s0.flaky": None}
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("2",)
    # the resume migrates it (ALTER TABLE ... ADD COLUMN) and records the new attempt's use
    report = run(_flaky_wf(tmp_path), journal=db, cores=1, resume=True, retry_failed=True)
    assert report.ok and report.session_done == 1  # only the failed task ran again
    assert (tmp_path / "count").read_text().strip() == "2"
    rows = _rows(db)
    assert rows["p.s0.ok"]["cpu_user"] is None  # measured by nobody: NULL, not a guess
    assert rows["p.s0.flaky"]["cpu_user"] is not None  # the new attempt, measured
    assert _rows(db, "failed_attempts")[("p.s0.flaky", 1)]["cpu_user"] is None  # the old attempt
    with contextlib.closing(open_readonly(db)) as conn:  # both listed: the old failure, the new run
        listed = sorted((a.uid, a.state.value, a.cpu is None) for a in attempts(conn))
    assert listed == [("p.s0.flaky", "done", False), ("p.s0.flaky", "failed", True), ("p.s0.ok", "done", True)]
    with contextlib.closing(sqlite3.connect(db)) as c:
        assert c.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == (SCHEMA_VERSION,)
    Journal(db, resume=True).close()  # opening it again: already migrated, nothing to add


def test_a_journal_of_an_unknown_schema_is_still_refused(tmp_path):
    db = str(tmp_path / "x.db")
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.executescript(OLD_SCHEMA)
        c.execute("INSERT INTO meta VALUES ('schema', '1')")
        c.commit()
    from shoal.patterns.ensemble.journal import JournalError

    with pytest.raises(JournalError, match="schema 1, this shoal writes"):
        Journal(db, resume=True)


def test_status_tasks_filters_and_json(tmp_path, capsys):
    db = str(tmp_path / "run.db")
    wf = Pipeline([Stage([Task(executable="/bin/true", name="a"), Task(executable="/bin/false", name="b")],
                         name="one"),
                   Stage([Task(executable="/bin/true", name="c")], name="two")], name="p")
    run(wf, journal=db, cores=1)  # b fails: stage two never starts
    assert main(["status", db, "--tasks", "--state", "failed"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["task", "try", "state"] and len(lines) == 2 and "p.one.b" in lines[1]
    assert main(["status", db, "--tasks", "--stage", "p.one", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["uid"], r["state"], r["exit_code"]) for r in rows} == {("p.one.a", "done", 0),
                                                                      ("p.one.b", "failed", 1)}
    assert all(r["host"] == socket.gethostname() for r in rows)
    assert main(["status", db, "--tasks", "--stage", "p.two"]) == 0
    assert "no attempts" in capsys.readouterr().out
    assert main(["status", db, "--tasks", "--state", "bogus"]) == 2
    assert "no task state 'bogus'" in capsys.readouterr().err
    assert main(["status", db, "--state", "done"]) == 2  # a filter without --tasks
    assert "add --tasks" in capsys.readouterr().err


@pytest.mark.parametrize("popen", [False, True])
def test_a_task_that_exits_at_once_has_its_cpu_time(tmp_path, monkeypatch, popen):
    """Reaped inside the C spawn helper's quick window (or by Popen's path): wait4 there too;
    its peak RSS is below this driver's, so it has none (usage.own_peak)."""
    from shoal.patterns.ensemble import spawn

    if popen:
        monkeypatch.setenv("SHOAL_ENSEMBLE_POPEN", "1")
    elif spawn._native is None:
        pytest.skip("the C spawn helper shoal/patterns/ensemble/_spawn.c was not built")
    db = str(tmp_path / "run.db")
    tasks = [Task(executable="/bin/true", name=f"t{i}") for i in range(3)] + [
        Task(executable="/bin/sh", arguments=["-c", "exit 3"], name="bad")]
    run(Pipeline([Stage(tasks)], name="p"), journal=db, cores=2)
    rows = _rows(db)
    for row in rows.values():
        assert row["max_rss"] is None and row["cpu_user"] is not None and row["host"] == socket.gethostname()
    assert rows["p.s0.bad"]["exit_code"] == 3


def test_attempts_of_a_task_through_its_retries(tmp_path):
    """One row per attempt: a retry waiting out its delay shows as its failed attempt only, the
    next attempt once it runs, each failed one with what it used."""
    from shoal.patterns.ensemble.model import Failure, FailureKind
    from shoal.patterns.ensemble.usage import Usage

    db = str(tmp_path / "run.db")
    j = Journal(db)

    def listed():
        j.commit()
        with contextlib.closing(open_readonly(db)) as conn:
            return [(a.attempt, a.state.value, a.cpu) for a in attempts(conn)]

    j.running("p.s.t", "p", "p.s", "executable", 1, None, 10.0)
    assert listed() == [(1, "running", None)]
    j.failed("p.s.t", Failure(FailureKind.EXIT_CODE, "exit code 1", 1, "", 1), 11.0, final=False,
             usage=Usage(cpu_user=0.5, cpu_sys=0.25))
    assert listed() == [(1, "failed", 0.75)]  # waiting to retry: no row for an attempt not begun
    j.running("p.s.t", "p", "p.s", "executable", 2, None, 12.0)
    assert listed() == [(1, "failed", 0.75), (2, "running", None)]  # not the last attempt's figures
    j.done("p.s.t", 13.0, exit_code=0, usage=Usage(cpu_user=1.0, cpu_sys=0.0))
    assert listed() == [(1, "failed", 0.75), (2, "done", 1.0)]
    j.close()
