"""The ensemble engine on dask pilots, with real processes.

Conformance: one small workflow (pipelines of executables and functions, a dependency, a
failing executable with its exit code and stderr tail, a signal, a timeout, a missing
program, a missing output, a retry) gives the same report and journal on the local backend,
on dask with a LocalCluster, and on dask with a `dask scheduler` + two `dask worker`
processes started from the command line.  On dask the executables run on the nodes (a
test checks the process tree), and the journal stays in the driver.

Faults: a dask worker SIGKILLed in the middle of an ensemble of executables (dask re-runs
its tasks; every task is journaled DONE exactly once; the killed attempt's process dies
with its node); dask's allowed-failures exhausted (a clear WORKER_LOST failure) and an
engine retry after a lost worker; a driver SIGKILLed mid-run on dask, then resumed; a
walltime drain on dask, then resumed.

The conformance clusters live for the module (started before the per-test leak check
looks); tests that kill dask workers own their cluster, so the processes dask restarts are
gone when the leak check looks.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import dataclasses
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import dask
import psutil
import pytest
import rt_tasks as t
from dask_cluster import (
    BACKEND_PARAMS,
    ROOT,
    TESTBED,
    CliCluster,
    local_cluster,
    shoal_workers,
    wait_until,
)

import shoal
from shoal.ensemble import EnsembleError, FailureKind, Pipeline, Stage, Task, TaskState, run
from shoal.patterns.ensemble import journal as journal_mod
from shoal.patterns.ensemble.remote import Ended, ExecSpec, run_executable

BACKENDS = ["local", "dask-localcluster", "dask-cli"]

# dask pools connections to the module-scoped clusters; more open under concurrency
pytestmark = pytest.mark.fd_slack(8)


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    """multiprocessing's resource tracker (started by the first LocalCluster) lives as long
    as this process: start it before the per-test leak check looks, it is no leak."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


@pytest.fixture(scope="module")
def clusters():
    made = {}
    yield made
    for cluster in made.values():
        cluster.close()
    assert not shoal_workers(), "shoal workers outlived their clusters"


def _pilot(kind, clusters, workers=1):
    if kind == "local":
        return shoal.Pilot(2)
    if kind == "dask-localcluster":
        if kind not in clusters:
            clusters[kind] = local_cluster(2)
        return shoal.Pilot(backend="dask", cluster=clusters[kind], workers=workers)
    if kind == TESTBED:
        from multihost.testbed_helpers import needs_testbed

        return shoal.Pilot(backend="dask", address=needs_testbed(dask=True, hosts=3).dask,
                           workers=workers)
    if kind not in clusters:
        clusters[kind] = CliCluster(2)
    return shoal.Pilot(backend="dask", address=clusters[kind].address, workers=workers)


# the dask column again with a worker on each of 3 hosts of scripts/testbed (-m multihost):
# the sandbox and journal live in tmp_path, on the shared filesystem (--basetemp), and each
# host's /tmp is its own; the command-line cluster's column is in -m heavy
@pytest.fixture(scope="module",
                params=[*BACKEND_PARAMS, pytest.param(TESTBED, marks=pytest.mark.multihost)])
def kind(request, clusters):
    if request.param != "local":  # start the cluster before the per-test leak check snapshots
        _pilot(request.param, clusters).close()
    return request.param


@pytest.fixture
def pilot(kind, clusters):
    with _pilot(kind, clusters) as p:
        yield p
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


@pytest.fixture
def done_calls(monkeypatch):
    """Every ``Journal.done`` call, by uid: a task recorded DONE twice shows up here."""
    calls = collections.Counter()
    real = journal_mod.Journal.done

    def done(self, uid, *args, **kwargs):
        calls[uid] += 1
        return real(self, uid, *args, **kwargs)

    monkeypatch.setattr(journal_mod.Journal, "done", done)
    return calls


def sh(name, line, **kw):
    return Task(executable="/bin/sh", arguments=["-c", line], name=name, **kw)


def conformance_workflow():
    data = Pipeline([
        Stage([sh("gen", "seq 5 > out.dat; echo made", outputs=["out.dat"]),
               Task(function=t.add, args=(2,), kwargs={"b": 3}, name="add")], name="make"),
        Stage([sh("wc", "wc -l < in.dat > n.txt; cat n.txt", inputs=[("$data.make.gen/out.dat", "in.dat")],
                  outputs=["n.txt"]),
               sh("cat", "cat", stdin="$data.make.gen/out.dat"),
               sh("env", 'test "$GREETING" = hi && test "$SHOAL_TASK" = data.use.env '
                         '&& test "$OMP_NUM_THREADS" = 1 && test "$PWD" = "$SHOAL_SANDBOX"',
                  environment={"GREETING": "hi"}),
               sh("shell", "exit 0", pre_exec=["test -d .", "echo pre"], post_exec=["echo post"]),
               sh("retry", "test -e flag || { touch flag; echo first >&2; exit 1; }", retries=1),
               Task(function=t.inc, args=(41,), name="inc")], name="use"),
    ], name="data")
    bad = Pipeline([
        Stage([sh("exit3", "echo first >&2; echo oops >&2; exit 3"),
               sh("slow", "echo started >&2; sleep 10", timeout=0.5),
               sh("signal", "kill -TERM $$"),
               sh("noout", "true", outputs=["missing.dat"]),
               Task(executable="no-such-program-shoal", name="noexe"),
               Task(function=t.boom, args=("bad input",), name="boom")], name="s"),
        Stage([sh("never", "true")], name="after"),  # the pipeline stops after a failed stage
    ], name="bad")
    post = Pipeline([Stage([
        Task(function=t.total, args=([1, 2, 3],), name="sum", when=lambda r: r["data.use.wc"] == 0),
        Task(function=t.inc, args=(0,), name="skipped", when=lambda r: r["data.make.add"] != 5),
    ], name="s")], name="post", after=["data"])
    return [data, bad, post]


def snapshot(report, tmp):
    """The report and the journal with this run's paths and tracebacks normalised."""
    db = sqlite3.connect(report.journal)
    rows = {}
    for uid, state, attempt, code, failure, reason, tail in db.execute(
            "SELECT uid, state, attempt, exit_code, failure, reason, stderr_tail FROM tasks"):
        reason = (reason or "").replace(str(tmp), "<tmp>")
        if failure == FailureKind.EXCEPTION.value:
            tail = "in boom" in (tail or "")  # the worker's traceback: text differs by backend
        rows[uid] = (state, attempt, code, failure, reason, tail)
    stages = dict(db.execute("SELECT uid, state FROM stages"))
    db.close()
    counts = {s: n for s, n in report.counts.items() if n}
    return counts, report.retries, rows, stages


EXPECTED_ROWS = {
    "data.make.gen": ("done", 1, 0, None, "", None),
    "data.make.add": ("done", 1, None, None, "", None),
    "data.use.wc": ("done", 1, 0, None, "", None),
    "data.use.cat": ("done", 1, 0, None, "", None),
    "data.use.env": ("done", 1, 0, None, "", None),
    "data.use.shell": ("done", 1, 0, None, "", None),
    "data.use.retry": ("done", 2, 0, None, "", "first\n"),
    "data.use.inc": ("done", 1, None, None, "", None),
    "bad.s.exit3": ("failed", 1, 3, "exit_code", "exit code 3", "first\noops\n"),
    "bad.s.slow": ("failed", 1, -9, "timeout", "killed after timeout=0.5s", "started\n"),
    "bad.s.signal": ("failed", 1, -15, "exit_code", "killed by signal 15", ""),
    "bad.s.noout": ("failed", 1, 0, "staging",
                    "declared outputs missing after exit 0: ['<tmp>/run.sandbox/bad/s/noout/missing.dat']",
                    ""),
    "bad.s.noexe": ("failed", 1, None, "spawn", "executable 'no-such-program-shoal' not found on PATH", ""),
    "bad.s.boom": ("failed", 1, None, "exception", "ValueError: bad input", True),
    "post.s.sum": ("done", 1, None, None, "", None),
    "post.s.skipped": ("skipped", 0, None, None, "when= returned false", None),
}


def test_conformance(pilot, kind, tmp_path):
    report = run(conformance_workflow(), pilot=pilot, journal=str(tmp_path / "run.db"))
    counts, retries, rows, stages = snapshot(report, tmp_path)
    assert rows == EXPECTED_ROWS
    # skipped: post.s.skipped (when= false) and bad.after's task, which never started
    assert counts == {TaskState.DONE: 9, TaskState.FAILED: 6, TaskState.SKIPPED: 2}
    assert report.stages["bad.after"] == {TaskState.SKIPPED: 1}
    assert retries == 1 and not report.ok
    assert stages == {"data.make": "done", "data.use": "done", "data": "done", "bad.s": "failed",
                      "bad": "failed", "post.s": "done", "post": "done"}
    assert report.result("data.make.add") == 5 and report.result("post.s.sum") == 6
    assert report.result("data.use.wc") == 0
    assert sorted(report.outputs) == ["data.make.gen", "data.use.wc"]
    box = tmp_path / "run.sandbox"
    assert (box / "data/use/wc/stdout").read_text().strip() == "5"
    assert (box / "data/use/cat/stdout").read_text().split() == ["1", "2", "3", "4", "5"]
    assert (box / "data/use/shell/stdout").read_text().split() == ["pre", "post"]
    by_uid = {f["uid"]: f for f in report.failures}
    assert by_uid["bad.s.exit3"]["kind"] is FailureKind.EXIT_CODE
    assert "oops" in by_uid["bad.s.exit3"]["stderr_tail"]
    text = str(report)
    assert "FAILED bad.s.exit3: exit code 3\n" in text  # once, not "exit_code: ... (exit code 3, ...)"
    assert "FAILED bad.s.slow: killed after timeout=0.5s (exit code -9)" in text
    assert "FAILED bad.s.noexe: executable 'no-such-program-shoal' not found on PATH\n" in text
    assert "exit code None" not in text


def test_executables_run_on_the_nodes(pilot, kind, tmp_path):
    """An executable's parent is a shoal worker on a node (dask) or the driver (local)."""
    tasks = [sh(f"w{i}", "echo $PPID > parent; sleep 0.1") for i in range(4)]
    report = run(Pipeline([Stage(tasks, name="s")], name="p"), pilot=pilot,
                 journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 4
    parents = {int((tmp_path / f"run.sandbox/p/s/w{i}/parent").read_text()) for i in range(4)}
    if kind == "local":
        assert parents == {os.getpid()}
    else:
        assert parents <= set(shoal_workers()), "not started by the nodes' shoal workers"


def test_attempts_record_where_they_ran_and_what_they_used(pilot, kind, tmp_path):
    """Host, node runtime, CPU time and peak RSS per attempt (usage.py), measured where the
    attempt ran: on dask the node's host and shoal worker; on the test bed each host's own
    name, and the HTML report draws one timeline row group per host."""
    from shoal.patterns.ensemble import run_report

    alloc = 600 << 20  # above the spawning worker's own peak (usage.own_peak), also for the
    # test bed's long-lived dask workers after other tests
    grow = f"import time; b = b'\\x01' * {alloc}; time.sleep(0.3)"
    tasks = [Task(executable=sys.executable, arguments=["-c", grow], name=f"x{i}") for i in range(6)]
    tasks += [Task(function=t.inc, args=(i,), name=f"f{i}") for i in range(2)]
    tasks.append(sh("bad", "exit 4"))
    db = str(tmp_path / "run.db")
    report = run(Pipeline([Stage(tasks, name="s")], name="p"), pilot=pilot, journal=db)
    assert report.done == 8 and report.failed == 1
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.row_factory = sqlite3.Row
        rows = {r["uid"]: dict(r) for r in c.execute("SELECT * FROM tasks")}
    for uid, row in rows.items():
        assert row["host"] and row["node"] and row["cpu_user"] is not None, uid
        remote_exe = kind != "local" and not uid.startswith("p.s.f")
        assert row["node"].startswith("worker " if remote_exe or uid.startswith("p.s.f") else "cpus "), row
    for i in range(6):
        rss = rows[f"p.s.x{i}"]["max_rss"]
        if kind == "local" and rss is None:
            continue  # spawned by this test process, whose peak (grown with the tests before)
            # each child inherits at its exec: below it, no figure (usage.own_peak)
        assert abs(rss - alloc) <= 0.1 * alloc, (kind, rss)
    hosts = {row["host"] for row in rows.values()}
    if kind == TESTBED:
        assert socket.gethostname() not in hosts and len(hosts) >= 2, hosts  # the nodes' own names
    else:
        assert hosts == {socket.gethostname()}
    page = run_report.render(db)
    assert page.count('<g class="host">') == len(hosts)


def test_dask_refuses_gpus_and_cpu_ids(kind, clusters, tmp_path):
    if kind == "local":
        pytest.skip("dask only")
    with _pilot(kind, clusters) as p:
        wf = Pipeline([Stage([sh("a", "true")])])
        with pytest.raises(EnsembleError, match="gpus=1.*not supported on a dask pilot"):
            run(wf, pilot=p, journal=str(tmp_path / "a.db"), gpus=1)
        with pytest.raises(EnsembleError, match="CPU ids name the driver's CPUs"):
            run(wf, pilot=p, journal=str(tmp_path / "b.db"), cores=[0, 1])
        # a task's gpus= is a dask worker resource: none of these workers has a GPU, so the
        # task fails at once with the reason (tests/dask/test_dask_resources.py: with GPUs)
        report = run(Pipeline([Stage([Task(executable="/bin/true", gpus=1)])]), pilot=p,
                     journal=str(tmp_path / "c.db"))
        assert not report.ok and "no dask worker of this cluster offers" in str(report.failures)
        slots = p.workers
        with pytest.raises(EnsembleError,
                           match=f"asks for {slots + 1} cores but the dask pilot has {slots} slots"):
            run(Pipeline([Stage([Task(executable="/bin/true", cores=slots + 1)])]), pilot=p,
                journal=str(tmp_path / "d.db"))
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


def test_walltime_drain_then_resume_on_dask(kind, clusters, tmp_path):
    """The walltime on dask, both ways it drains, with outcomes that do not depend on the
    machine's speed (a 1.5 s walltime over 0.2 s sleeps once raced at load > 17):

    1. by estimates: the first four tasks expect 0.01 s, the rest an hour that a 10-minute
       walltime cannot hold, so the run starts some of the four and stops starting there;
    2. by the clock: a task that blocks until the test creates a file is killed on its node
       at a 2 s walltime and left PENDING (or never started, if the machine is slow enough
       that the walltime passes first: PENDING as well).

    A resume runs what is left, and never a task that was DONE before it."""
    if kind != "dask-localcluster":
        pytest.skip("one dask cluster is enough")
    log = tmp_path / "log"
    gate = tmp_path / "gate"

    def workflow():
        return Pipeline([Stage([sh(f"t{i}", f"echo $SHOAL_TASK >> {log}",
                                   estimate=0.01 if i < 4 else 3600) for i in range(16)],
                               name="s")], name="p")

    def blocked():
        return Pipeline([Stage([sh("b", f"while [ ! -e {gate} ]; do sleep 0.05; done; "
                                        f"echo $SHOAL_TASK >> {log}")], name="s")], name="q")

    journal = str(tmp_path / "run.db")
    journal2 = str(tmp_path / "run2.db")
    with _pilot(kind, clusters) as p:
        first = run(workflow(), pilot=p, journal=journal, walltime=600)
        assert first.drained and 0 < first.done <= 4, first
        done_first = _done(journal)
        assert done_first <= {f"p.s.t{i}" for i in range(4)}
        second = run(workflow(), pilot=p, journal=journal, resume=True)
        assert second.ok and second.done == 16

        stopped = run(blocked(), pilot=p, journal=journal2, walltime=2)
        assert stopped.drained and stopped.done == 0 and not _done(journal2)
        gate.touch()
        resumed = run(blocked(), pilot=p, journal=journal2, resume=True)
        assert resumed.ok and resumed.done == 1
    ran = collections.Counter(log.read_text().split())
    assert set(ran) == {f"p.s.t{i}" for i in range(16)} | {"q.s.b"}
    assert all(ran[uid] == 1 for uid in done_first), ran  # DONE before the resume: not run again
    assert ran["q.s.b"] == 1  # killed at the walltime before it wrote, run once by the resume
    wait_until(lambda: not shoal_workers(), 10, "the pilot's shoal workers to exit")


# -- faults: each test owns its cluster -------------------------------------------------------


def _running_exe(match: str):
    """(dask worker pid, executable pid) of an executable whose command line contains
    ``match``, running under a shoal worker of this process's clusters; None if none yet."""
    for wpid in shoal_workers():
        try:
            for child in psutil.Process(wpid).children():
                if match in " ".join(child.cmdline()):
                    return psutil.Process(wpid).ppid(), child.pid
        except psutil.Error:
            continue
    return None


def test_sigkill_dask_worker_mid_ensemble(tmp_path, done_calls):
    """40 executables on 4 slots; one dask worker SIGKILLed while it runs a 30 s sleep and
    others: dask re-runs its tasks elsewhere, the ensemble completes, each task is DONE once,
    and the killed attempt's sleep dies with its node (PDEATHSIG), not 30 s later."""
    log = tmp_path / "log"
    tasks = [sh(f"t{i}", f"sleep 0.2; echo $SHOAL_TASK >> {log}") for i in range(40)]
    tasks.insert(5, sh("long", "test -e flag && exit 0; touch flag; exec sleep 30"))
    killed = {}

    def killer():
        def found():
            killed["hit"] = _running_exe("sleep 30")
            return killed["hit"]
        wait_until(found, 60, "the long task to start")
        os.kill(killed["hit"][0], signal.SIGKILL)

    cluster = local_cluster(2)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=2) as pilot:
            thread = threading.Thread(target=killer)
            thread.start()
            try:
                report = run(Pipeline([Stage(tasks, name="s")], name="p"), pilot=pilot,
                             journal=str(tmp_path / "run.db"))
            finally:
                thread.join()
            dask_pid, sleep_pid = killed["hit"]
            wait_until(lambda: not psutil.pid_exists(sleep_pid)
                       or psutil.Process(sleep_pid).status() == psutil.STATUS_ZOMBIE,
                       5, "the killed node's executable to die (PDEATHSIG)")
    finally:
        cluster.close()
    assert report.ok and report.done == 41, report
    assert set(done_calls) == {f"p.s.t{i}" for i in range(40)} | {"p.s.long"}
    assert set(done_calls.values()) == {1}, "a task was journaled DONE more than once"
    db = sqlite3.connect(report.journal)
    attempts = dict(db.execute("SELECT uid, attempt FROM tasks WHERE state='done'"))
    db.close()
    assert set(attempts.values()) == {1}  # dask's re-runs are not the engine's retries
    assert set(log.read_text().split()) == {f"p.s.t{i}" for i in range(40)}  # none lost


KILL_MY_DASK_WORKER = ("import os, signal, time; "
                       "stat = open(f'/proc/{os.getppid()}/stat').read(); "
                       "os.kill(int(stat.rsplit(')', 1)[1].split()[1]), signal.SIGKILL); time.sleep(30)")


def test_allowed_failures_exhausted_then_engine_retry(tmp_path):
    """dask gives up after allowed-failures (0 here) worker deaths: the task FAILS with
    WORKER_LOST, said so in the Report and the journal; with retries=1 the engine's second
    attempt (which finds its flag and exits 0) completes it."""
    import distributed  # noqa: F401 - its defaults in dask.config before the set() below: else
    # leaving set() deletes the "distributed" section it created, defaults loaded meanwhile too
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = local_cluster(2)
    try:
        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
            killer = Task(executable=sys.executable, arguments=["-c", KILL_MY_DASK_WORKER], name="k")
            lost = run(Pipeline([Stage([killer], name="s")], name="p"), pilot=pilot,
                       journal=str(tmp_path / "lost.db"))
            flag = tmp_path / "flag"
            once = Task(executable="/bin/sh", name="k", retries=1, arguments=[
                "-c", f'test -e {flag} && exit 0; touch {flag}; exec "$0" -c "$1"',
                sys.executable, KILL_MY_DASK_WORKER])
            retried = run(Pipeline([Stage([once], name="s")], name="p"), pilot=pilot,
                          journal=str(tmp_path / "retried.db"))
    finally:
        cluster.close()
    assert not lost.ok and lost.failed == 1
    (failure,) = lost.failures
    assert failure["kind"] is FailureKind.WORKER_LOST and failure["attempts"] == 1
    assert "allowed-failures" in failure["reason"]
    (line,) = [x for x in str(lost).splitlines() if x.startswith("FAILED p.s.k: ")]
    assert "died" in line and "allowed-failures" in line  # one line with dask's reason
    db = sqlite3.connect(lost.journal)
    assert db.execute("SELECT state, failure FROM tasks WHERE uid='p.s.k'").fetchone() == \
        ("failed", "worker_lost")
    db.close()
    assert retried.ok and retried.done == 1 and retried.retries == 1


WORKFLOW = '''
from shoal.ensemble import Pipeline, Stage, Task

LOG = {log!r}

workflow = Pipeline([Stage([Task(executable="/bin/sh", name=f"t{{i}}",
                                 arguments=["-c", f"sleep 0.2; echo $SHOAL_TASK >> {{LOG}}"])
                            for i in range(20)], name="s")], name="p")
'''


def _done(db_path):
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
        try:
            return {u for (u,) in db.execute("SELECT uid FROM tasks WHERE state='done'")}
        finally:
            db.close()
    except sqlite3.Error:
        return set()


def test_driver_sigkill_then_resume_on_dask(tmp_path):
    """`shoal run --dask ADDRESS` killed mid-run; resumed here on the same cluster: every
    task ends DONE, and none DONE before the kill runs again."""
    log = tmp_path / "log"
    wf = tmp_path / "wf.py"
    wf.write_text(WORKFLOW.format(log=str(log)))
    journal = tmp_path / "run.db"
    cluster = local_cluster(2)
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        driver = subprocess.Popen(
            [sys.executable, "-m", "shoal", "run", str(wf), "--journal", str(journal),
             "--dask", cluster.scheduler_address, "--workers", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        try:
            wait_until(lambda: len(_done(journal)) >= 4 or driver.poll() is not None, 60,
                       "the driver to finish some tasks")
            os.kill(driver.pid, signal.SIGKILL)
        finally:
            driver.wait(30)
        assert driver.returncode == -signal.SIGKILL
        done_at_kill = _done(journal)
        assert 4 <= len(done_at_kill) < 20, "the kill should land mid-run"
        from shoal.patterns.ensemble.commands import load_workflow

        with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
            report = run(load_workflow(str(wf)), pilot=pilot, journal=str(journal), resume=True)
    finally:
        cluster.close()
    assert report.ok and report.done == 20
    ran = collections.Counter(log.read_text().split())
    assert all(ran[uid] == 1 for uid in done_at_kill), ran
    assert set(ran) == {f"p.s.t{i}" for i in range(20)}


# -- the node side and the engine's dask path without a cluster -------------------------------


def test_run_executable_outcomes(tmp_path):
    def spec(name, line, **kw):
        return ExecSpec(uid=f"p.s.{name}", executable="/bin/sh", arguments=("-c", line),
                        sandbox=str(tmp_path / name), cwd=str(tmp_path), **kw)

    ok = run_executable(spec("ok", "echo hi; echo $SHOAL_TASK > f", outputs=("f",)))
    assert (ok.ended, ok.exit_code, ok.failure) == (Ended.EXITED, 0, None)
    assert ok.outputs == (str(tmp_path / "ok" / "f"),) and (tmp_path / "ok/f").read_text() == "p.s.ok\n"
    bad = run_executable(spec("bad", "echo no >&2; exit 4"))
    assert (bad.ended, bad.exit_code, bad.stderr_tail) == (Ended.EXITED, 4, "no\n")
    slow = run_executable(spec("slow", "sleep 10", timeout=0.2))
    assert (slow.ended, slow.exit_code) == (Ended.TIMED_OUT, -9)
    late = run_executable(spec("late", "sleep 10", walltime_at=time.time() + 0.2))
    assert (late.ended, late.exit_code) == (Ended.WALLTIME, -9)
    nostdin = run_executable(spec("nostdin", "cat", stdin=str(tmp_path / "nope")))
    assert (nostdin.ended, nostdin.failure) == (Ended.NOT_STARTED, FailureKind.STAGING)
    noout = run_executable(spec("noout", "true", outputs=("x",)))
    assert (noout.ended, noout.exit_code, noout.failure) == (Ended.EXITED, 0, FailureKind.STAGING)


class ThreadPilot:
    """A stand-in dask pilot: pilot tasks on threads of this process.  ``skew`` moves the
    walltime the nodes see earlier (a node clock ahead of the driver's); ``refuse`` makes
    submit raise (a cluster gone)."""

    backend = shoal.BackendKind.DASK
    workers = 2

    def __init__(self, skew: float = 0.0, refuse: bool = False):
        self.pool = cf.ThreadPoolExecutor(2)
        self.skew, self.refuse = skew, refuse

    def submit(self, fn, *args, **kwargs):
        if self.refuse:
            raise shoal.BackendUnavailable("the dask client is closed")
        if fn is run_executable and self.skew and args[0].walltime_at is not None:
            args = (dataclasses.replace(args[0], walltime_at=args[0].walltime_at - self.skew),)
        return self.pool.submit(fn, *args, **kwargs)

    def close(self):
        self.pool.shutdown()


def test_node_kills_at_the_walltime_first(tmp_path):
    """A node whose clock runs ahead kills its program at the walltime before the driver
    gets there: the task is PENDING again (not failed), the run drained, a resume finishes."""
    journal = str(tmp_path / "run.db")
    pilot = ThreadPilot(skew=0.6)
    quick = tmp_path / "quick"  # the same workflow (a resume refuses another one) runs fast once it exists

    def workflow():
        return Pipeline([Stage([sh(f"t{i}", f"test -e {quick} || sleep 10") for i in range(2)], name="s")],
                        name="p")
    try:
        first = run(workflow(), pilot=pilot, journal=journal, walltime=1.0)
        assert first.drained and first.counts.get(TaskState.PENDING) == 2 and first.failed == 0
        quick.write_text("")
        again = run(workflow(), pilot=pilot, journal=journal, resume=True)
        assert again.ok and again.done == 2
    finally:
        pilot.close()


def test_submit_refused_is_a_spawn_failure(tmp_path):
    pilot = ThreadPilot(refuse=True)
    report = run(Pipeline([Stage([sh("a", "true")], name="s")], name="p"), pilot=pilot,
                 journal=str(tmp_path / "run.db"))
    (failure,) = report.failures
    assert failure["kind"] is FailureKind.SPAWN
    assert failure["reason"].startswith("cannot submit to the dask pilot: BackendUnavailable")


def test_reuse_reruns_only_the_changed_task_on_each_backend(pilot, kind, tmp_path):
    """``run(reuse=True)``: keys are taken and outputs staged back by the driver, the same code on
    every backend; the executables that do run (on the nodes, on dask) write their side-effect
    line to a shared file."""
    log = tmp_path / "ran.log"

    def wf(arg):
        return Pipeline([
            Stage([sh("gen", f"echo gen >> {log}; seq 4 > a.txt", outputs=["a.txt"]),
                   sh("other", f"echo other >> {log}; echo {arg} > b.txt", outputs=["b.txt"])], name="s1"),
            Stage([sh("wc", f"echo wc >> {log}; wc -l < a.txt > n.txt", inputs=["$p.s1.gen/a.txt"],
                      outputs=["n.txt"]),
                   Task(function=t.total, args=([1, 2, 3],), name="sum")], name="s2"),
        ], name="p")

    db = str(tmp_path / "run.db")
    assert run(wf("x"), pilot=pilot, journal=db, reuse=True).ok
    assert sorted(log.read_text().split()) == ["gen", "other", "wc"]
    log.write_text("")
    report = run(wf("y"), pilot=pilot, journal=db, reuse=True)
    assert report.ok and report.reused == 3
    assert log.read_text().split() == ["other"]
    assert report.result("p.s2.sum") == 6
    assert (tmp_path / "run.sandbox/p/s2/wc/n.txt").read_text().strip() == "4"
