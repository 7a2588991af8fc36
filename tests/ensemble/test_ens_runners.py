"""The runner threads and the C spawn helper (runners.py, spawn.py, _spawn.c): real processes throughout.

Each test names what it guards: the pid start time a resume compares, kills that never reach a
reaped (reusable) pid, exec failures reported as SPAWN (taskset used to turn them into exit code
126), the signal dispositions and the environment a child starts with on both spawn paths, and
no thread left behind.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time

import psutil
import pytest

from shoal.ensemble import EnsembleError, FailureKind, Pipeline, Stage, Task, TaskState, run
from shoal.patterns.ensemble import spawn
from shoal.patterns.ensemble.runners import Event, Runners


def _wait_for(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _use(spawner: str, monkeypatch) -> None:
    """Run the test on the C spawn helper (spawn.py, _spawn.c: vfork + execve) or, for "popen",
    on the subprocess.Popen fallback."""
    if spawner == "popen":
        monkeypatch.setenv("SHOAL_ENSEMBLE_POPEN", "1")
    elif spawn._native is None:
        pytest.skip("the C spawn helper shoal/patterns/ensemble/_spawn.c was not built: "
                    "pip install -e . with a C compiler (Linux)")


def _reap(pid: int) -> tuple[int, None]:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), None  # (exit code, no usage)


def test_journaled_pid_start_is_the_process_start(tmp_path):
    """A resume kills a dead driver's orphan only if pid *and* start match psutil's create_time,
    whose clock can be ~1 s off the wall clock: the start journaled must be the process's own."""
    flag = tmp_path / "go"
    task = Task(executable="/bin/sh", arguments=["-c", f"while [ ! -e {flag} ]; do sleep 0.02; done"],
                name="w")
    journal = tmp_path / "run.db"
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", run(Pipeline([Stage([task])], name="p"),
                                                                  journal=str(journal))))
    t.start()
    try:
        def pid_row():
            with contextlib.suppress(sqlite3.Error), \
                    contextlib.closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)) as db:
                row = db.execute("SELECT pid, pid_start FROM tasks WHERE uid='p.s0.w'").fetchone()
                return row if row and row[0] else None
        pid, start = _wait_for(pid_row, "the task's pid in the journal")
        assert abs(psutil.Process(pid).create_time() - start) < 0.05
    finally:
        flag.touch()
        t.join(60)
    assert out["r"].ok


def test_kill_reaches_a_live_child_and_never_a_reaped_pid():
    killed, reaped = [], []

    def kill(pid):  # the runner's kills: the engine's (Runners.kill) and the group's at each exit
        try:  # still ours (running, or a zombie not yet reaped: the number cannot be reused)?
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            reaped.append(pid)  # reaped: the number may be someone else's now
            return
        killed.append(pid)
        os.kill(pid, 9)

    r = Runners([0], wait=_reap, wake=lambda: None, kill=kill)
    try:
        r.submit("short", [0], lambda: os.posix_spawn("/bin/true", ["/bin/true"], os.environ))
        _wait_for(lambda: any(e[0] is Event.EXITED for e in r.events), "the short child's exit")
        short = next(e[2] for e in r.events if e[0] is Event.SPAWNED)
        r.kill(short)  # reaped: the number may be someone else's now
        assert reaped == [] and killed == [short]  # its group was killed at its exit, before the reap
        r.events.clear()
        r.submit("long", [0], lambda: os.posix_spawn("/bin/sleep", ["/bin/sleep", "60"], os.environ))
        long = _wait_for(lambda: next((e[2] for e in r.events if e[0] is Event.SPAWNED), None),
                         "the long child's SPAWNED")
        r.kill(long)
        code = _wait_for(lambda: next((e[2] for e in r.events if e[0] is Event.EXITED), None),
                         "the long child's EXITED")
        assert reaped == [] and killed == [short, long, long] and code == -9
    finally:
        r.close()


def test_stop_new_answers_queued_jobs_without_launching():
    r = Runners([0], wait=_reap, wake=lambda: None, kill=lambda pid: None)
    launched = []
    try:
        r.stop_new()
        r.submit("queued", [0], lambda: launched.append(1) or 1)
        kind, item, outcome, _ = _wait_for(lambda: r.events and r.events[0], "the answer")
        assert (kind, item, outcome, launched) == (Event.SPAWNED, "queued", "not started", [])
    finally:
        r.close()


def test_exec_format_error_is_a_spawn_failure(tmp_path):
    """With taskset in front, an x-bit file with no valid format was taskset's exit code 126."""
    bad = tmp_path / "notaprogram"
    bad.write_bytes(b"\x00\x01garbage, no shebang\n")
    bad.chmod(0o755)
    report = run(Pipeline([Stage([Task(executable=str(bad), name="bad")])], name="p"),
                 journal=str(tmp_path / "run.db"))
    f = report.failures[0]
    assert f["kind"] is FailureKind.SPAWN and "Exec format error" in f["reason"], f


CHECK = ("echo cwd=$(pwd) task=$SHOAL_TASK omp=$OMP_NUM_THREADS mine=$MINE; read line; echo in=$line; "
         "yes | head -n1 >/dev/null; ls /proc/self/fd | wc -l")


@pytest.mark.parametrize("spawner", ["c_helper", "popen"])
def test_child_environment_on_both_spawn_paths(tmp_path, monkeypatch, spawner):
    """Same child on both paths: cwd = sandbox, task env, stdin file, SIGPIPE back to default
    (Python ignores it and an ignored signal survives exec: ``yes`` would then print
    'Broken pipe'), only fds 0-2 open (+ the one ls reads through)."""
    _use(spawner, monkeypatch)
    (tmp_path / "input.txt").write_text("hello\n")
    task = Task(executable="/bin/sh", arguments=["-c", CHECK], cores=2 if len(os.sched_getaffinity(0)) > 1 else 1,
                environment={"MINE": "x y"}, stdin=str(tmp_path / "input.txt"), name="t")
    report = run(Pipeline([Stage([task])], name="p"), journal=str(tmp_path / "run.db"))
    assert report.counts == {TaskState.DONE: 1}, report.failures
    sb = tmp_path / "run.sandbox" / "p" / "s0" / "t"
    lines = (sb / "stdout").read_text().splitlines()
    assert lines[0] == f"cwd={sb} task=p.s0.t omp={task.cores} mine=x y"
    assert lines[1] == "in=hello"
    assert lines[2].strip() == "4"  # 0, 1, 2 and ls' own directory fd
    assert (sb / "stderr").read_text() == ""  # no 'Broken pipe': SIGPIPE is default again


def test_no_runner_thread_outlives_the_run(tmp_path):
    tasks = [Task(executable="/bin/true") for _ in range(20)]
    report = run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 20
    assert [t.name for t in threading.enumerate() if t.name.startswith("shoal-runner")] == []


def _boom(task, failure):
    raise RuntimeError("on_retry hook broke")


def test_a_raising_hook_aborts_without_hanging_or_leaving_children(tmp_path):
    """An exception while the loop handles a batch of runner events (here: a user's on_retry)
    aborts the run; the abort kills and waits for every child the runners still hold."""
    tasks = [Task(executable="/bin/false", retries=1, on_retry=_boom) for _ in range(6)]
    tasks += [Task(executable="/bin/sleep", arguments=["30"], name="long")]
    with pytest.raises(RuntimeError, match="on_retry hook broke"):
        run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"))
    assert [c for c in psutil.Process().children(recursive=True) if c.name() == "sleep"] == []
    assert [t.name for t in threading.enumerate() if t.name.startswith("shoal-runner")] == []


@pytest.mark.parametrize("spawner", ["c_helper", "popen"])
def test_nul_byte_in_an_argument_or_variable_is_a_spawn_failure_naming_it(tmp_path, monkeypatch, spawner):
    """execve cuts a string at NUL: through ctypes' c_char_p the posix_spawn path (then ctypes) ran
    ``echo a`` for the argument 'a\\0b' (exit 0, silently another command), and the Popen
    path's ValueError escaped run() altogether.  A directory as the executable was called
    missing."""
    _use(spawner, monkeypatch)
    tasks = [Task(executable="/bin/echo", arguments=["a\x00b"], name="arg"),
             Task(executable="/bin/true", environment={"V": "x\x00y"}, name="env"),
             Task(executable=str(tmp_path), name="dir"),
             Task(executable="/bin/true", name="fine")]
    report = run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"))
    reasons = {f["uid"]: (f["kind"], f["reason"]) for f in report.failures}
    assert report.counts.get(TaskState.DONE) == 1, report.failures
    assert reasons["p.s0.arg"][0] is FailureKind.SPAWN and "argument 1" in reasons["p.s0.arg"][1]
    assert "NUL" in reasons["p.s0.arg"][1]
    assert reasons["p.s0.env"][0] is FailureKind.SPAWN and "'V'" in reasons["p.s0.env"][1]
    assert "is a directory" in reasons["p.s0.dir"][1]


@pytest.mark.parametrize("name", ["A=B", "", "X\x00Y", 5])
def test_environment_variable_names_execve_cannot_carry_are_refused(tmp_path, name):
    """{'A=B': 'c'} reached the child as A='B=c' on the posix_spawn path ('' as a nameless
    '=c'), and Popen's ValueError escaped run(): refused up front, naming the task."""
    task = Task(executable="/usr/bin/env", environment={name: "c"}, name="t")
    with pytest.raises(EnsembleError, match=r"p\.s0\.t: environment variable names"):
        run(Pipeline([Stage([task])], name="p"), journal=str(tmp_path / "run.db"))


def _gone(pid: int) -> bool:
    """``pid`` has exited (a zombie waiting for init counts: it runs no more)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# the shell writes the background job's pid, then ends (0, 3) or waits for its timeout
ORPHAN = "sleep 300 & echo $! > bg.pid; {end}"


@pytest.mark.parametrize("spawner", ["c_helper", "popen"])
def test_background_children_do_not_outlive_their_task(tmp_path, monkeypatch, spawner):
    """A task that leaves ``sleep 300 &`` behind and exits (0, non-zero, or killed at its timeout):
    the sleep dies with it (it used to outlive the run, reparented to init), before the task is
    journaled, on both spawn paths."""
    _use(spawner, monkeypatch)
    ends = {"ok": "exit 0", "bad": "exit 3", "slow": "touch ready; exec sleep 300"}
    tasks = [Task(executable="/bin/sh", arguments=["-c", ORPHAN.format(end=end)], name=name,
                  timeout=3.0 if name == "slow" else None) for name, end in ends.items()]
    report = run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"))
    kinds = {f["uid"]: f["kind"] for f in report.failures}
    assert report.done == 1 and kinds == {"p.s0.bad": FailureKind.EXIT_CODE, "p.s0.slow": FailureKind.TIMEOUT}
    sb = tmp_path / "run.sandbox" / "p" / "s0"
    for name in ends:
        if name == "slow" and not (sb / name / "ready").exists():
            continue  # the timeout came before the shell got that far (a very loaded machine)
        pid = int((sb / name / "bg.pid").read_text())
        _wait_for(lambda pid=pid: _gone(pid), f"the background sleep of {name} to die", timeout=10)


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_background_children_do_not_outlive_a_node_task(tmp_path, timeout):
    """The same for ``run_executable``, which runs executables on the nodes of a dask pilot
    (called here in-process: it is a plain function), with and without a timeout to watch."""
    from shoal.patterns.ensemble.remote import Ended, ExecSpec, run_executable

    sb = tmp_path / "sb"
    spec = ExecSpec(uid="p.s.t", executable="/bin/sh", arguments=("-c", ORPHAN.format(end="exit 0")),
                    sandbox=str(sb), cwd=str(tmp_path), cores=1, environment=(), pre_exec=(), post_exec=(),
                    inputs=(), stdin=None, outputs=(), timeout=timeout, walltime_at=None)
    out = run_executable(spec)
    assert (out.ended, out.exit_code) == (Ended.EXITED, 0), out
    pid = int((sb / "bg.pid").read_text())
    _wait_for(lambda: _gone(pid), "the background sleep to die", timeout=10)


def test_a_node_task_reaching_its_node_after_the_walltime_is_not_started(tmp_path):
    """A dask task that reaches its node after the run's walltime (queued behind others, or
    its cancel lost a race) was started and killed a moment later: long enough to write
    (the driver had already journalled it PENDING, so a resume ran it a second time).  Now
    the node does not start it.  Failed before: the file was written."""
    from shoal.patterns.ensemble.remote import Ended, ExecSpec, run_executable

    mark = tmp_path / "ran"
    spec = ExecSpec(uid="p.s.t", executable="/bin/sh", arguments=("-c", f"echo x > {mark}"),
                    sandbox=str(tmp_path / "sb"), cwd=str(tmp_path), walltime_at=time.time() - 1)
    out = run_executable(spec)
    assert out.ended is Ended.WALLTIME and out.pid is None, out
    assert not mark.exists()


@pytest.mark.parametrize("spawner", ["c_helper", "popen"])
def test_quick_exits_keep_their_exit_code_and_signal(tmp_path, monkeypatch, spawner):
    """A child that ends within QUICK_S is reaped inside the C spawn call: its exit code and
    its killing signal still reach the report, and per-task environments stay apart."""
    _use(spawner, monkeypatch)
    tasks = [Task(executable="/bin/false", name="f"),
             Task(executable="/bin/sh", arguments=["-c", "kill -9 $$"], name="k")]
    tasks += [Task(executable="/bin/sh", arguments=["-c", 'echo "$SHOAL_TASK $V"'], environment={"V": str(i)},
                   name=f"e{i}") for i in range(6)]
    report = run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"))
    codes = {f["uid"]: (f["kind"], f["exit_code"]) for f in report.failures}
    assert codes == {"p.s0.f": (FailureKind.EXIT_CODE, 1), "p.s0.k": (FailureKind.EXIT_CODE, -9)}
    for i in range(6):
        out = (tmp_path / "run.sandbox" / "p" / "s0" / f"e{i}" / "stdout").read_text()
        assert out == f"p.s0.e{i} {i}\n"


def _sig_bits(status: str, field: str) -> int:
    """A /proc/<pid>/status signal mask (SigBlk, SigIgn, SigCgt) as an int."""
    line = next(x for x in status.splitlines() if x.startswith(field + ":"))
    return int(line.split()[1], 16)


def _bit(sig: int) -> int:
    return 1 << (sig - 1)


@pytest.mark.parametrize("spawner", ["c_helper", "popen"])
def test_child_signal_dispositions_on_both_spawn_paths(tmp_path, monkeypatch, spawner):
    """The vfork child resets no handler itself (execve does that for handled signals): the
    program starts with no handler caught, SIGPIPE/SIGXFSZ back to default, a signal the driver
    ignores still ignored (as posix_spawn and Popen leave it), and, on the C path, an empty mask
    even when the driver's thread blocks a signal."""
    import signal

    _use(spawner, monkeypatch)
    task = Task(executable="/bin/cat", arguments=["/proc/self/status"], name="t")  # cat is the child
    old = {signal.SIGUSR1: signal.signal(signal.SIGUSR1, lambda *a: None),
           signal.SIGUSR2: signal.signal(signal.SIGUSR2, signal.SIG_IGN)}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})  # the runner threads inherit it
    try:
        report = run(Pipeline([Stage([task])], name="p"), journal=str(tmp_path / "run.db"))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert report.ok, report.failures
    status = (tmp_path / "run.sandbox" / "p" / "s0" / "t" / "stdout").read_text()
    assert _sig_bits(status, "SigCgt") == 0, status  # no handler survives exec
    ignored = _sig_bits(status, "SigIgn")
    assert ignored & _bit(signal.SIGUSR2), status
    assert not ignored & (_bit(signal.SIGPIPE) | _bit(signal.SIGXFSZ) | _bit(signal.SIGUSR1)), status
    if spawner == "c_helper":  # Popen's child keeps the spawning thread's mask
        assert _sig_bits(status, "SigBlk") == 0, status


def _zombies() -> list:
    return [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]


def test_spawn_failures_name_the_culprit_and_leave_no_zombie(tmp_path):
    """Every step of the vfork child can fail (chdir, an output file, the exec): the errno
    reaches the caller as OSError naming the sandbox or the executable, and the child that
    _exited is reaped by the helper itself (no zombie left for nobody to wait for)."""
    if spawn._native is None:
        pytest.skip("the C spawn helper shoal/patterns/ensemble/_spawn.c was not built")
    import errno

    null = os.open(os.devnull, os.O_RDONLY)
    try:
        sp = spawn.Spawner(null)
        env = spawn.envp({"PATH": "/usr/bin:/bin"})
        sb = tmp_path / "sb"
        sb.mkdir()
        text = tmp_path / "text"
        text.write_text("not a program\n")
        text.chmod(0o755)
        cases = [  # (exe, cwd, stdout, expected errno, the path the error names)
            ("/bin/true", str(tmp_path / "gone"), str(sb / "o"), errno.ENOENT, str(tmp_path / "gone")),
            ("/bin/true", str(sb), str(tmp_path / "no" / "o"), errno.ENOENT, "/bin/true"),
            (str(tmp_path / "missing"), str(sb), str(sb / "o"), errno.ENOENT, str(tmp_path / "missing")),
            (str(text), str(sb), str(sb / "o"), errno.ENOEXEC, str(text)),
        ]
        for exe, cwd, out, code, culprit in cases:
            with pytest.raises(OSError) as info:
                sp.spawn(exe, [exe], env, cwd, None, out, str(sb / "e"), 5)
            assert (info.value.errno, info.value.filename) == (code, culprit), (exe, cwd, out, info.value)
        assert _zombies() == []
        pid, status, used = sp.spawn("/bin/sh", ["/bin/sh", "-c", "exit 7"], env, str(sb), None, str(sb / "o"),
                                     str(sb / "e"), 0)  # no quick wait: the caller reaps
        assert used is None
        assert status is None and _reap(pid)[0] == 7
    finally:
        os.close(null)


def test_spawns_from_many_threads_under_a_signal_storm(tmp_path):
    """vfork lends the calling thread's stack and memory to the child while other threads run
    and signals arrive: 4 threads x 60 spawns (quick and slow exits, each with its own code),
    while an interval timer fires a Python handler every millisecond (the helper's poll and
    waitpid see EINTR).  Every exit code comes back right, no call fails, no zombie is left."""
    if spawn._native is None:
        pytest.skip("the C spawn helper shoal/patterns/ensemble/_spawn.c was not built")
    import signal

    hits = []
    old = signal.signal(signal.SIGALRM, lambda *a: hits.append(1))
    null = os.open(os.devnull, os.O_RDONLY)
    sp = spawn.Spawner(null)
    env = spawn.envp({"PATH": "/usr/bin:/bin"})
    wrong: list = []

    def worker(k: int) -> None:
        sb = tmp_path / f"w{k}"
        sb.mkdir()
        for i in range(60):
            code = (k * 60 + i) % 200
            script = f"exit {code}" if i % 10 else f"sleep 0.02; exit {code}"
            try:
                pid, status, _ = sp.spawn("/bin/sh", ["/bin/sh", "-c", script], env, str(sb), None,
                                          str(sb / "o"), str(sb / "e"), 5)
                got = os.waitstatus_to_exitcode(status) if status is not None else _reap(pid)[0]
            except OSError as exc:  # pragma: no cover - the failure this test looks for
                got = exc
            if got != code:
                wrong.append((k, i, code, got))

    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, old)
        os.close(null)
    assert not any(t.is_alive() for t in threads)
    assert wrong == []
    assert hits  # the storm did blow
    assert _zombies() == []
