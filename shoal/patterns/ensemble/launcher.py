"""Launching executable tasks: sandbox directories, input staging, fast spawn, reaping.

Called from the runner threads (runners.py) and the driver; the methods used
there (``spawn``, ``wait``, ``make_sandbox``, ``stage_in``) touch only their
task's files and the child they start.  Data flow per task::

    sandbox_of(uid) = <root>/<pipeline>/<stage>/<task>   (deterministic: resume finds it)
    stage_in(task)  -> copy / symlink / move each input into the sandbox
    spawn(...)      -> subprocess.Popen, no shell; stdin from a file or /dev/null,
                       stdout/stderr to <sandbox>/stdout, <sandbox>/stderr;
                       own process group (kill() reaches its children);
                       pinned to the granted CPUs from its first instruction (it inherits
                       the mask of the runner thread that spawns it: runners.py);
                       CUDA_VISIBLE_DEVICES = the granted GPUs (when GPUs are configured)
    wait(pid)       -> the runner reaps exactly that pid with wait4 (its rusage, and its
                       /proc io counters read just before: usage.py)

Only tasks with ``pre_exec``/``post_exec`` lines go through ``/bin/sh -c``.

Spawning: vfork + execve in the C helper (spawn.py: the child opens its
files, chdirs and calls setsid itself), else ``subprocess.Popen(cwd=...,
start_new_session=True)`` (vfork+exec in CPython 3.10+); never pinning the
driver: the runner thread that calls it is pinned (runners.py), and the
vfork-style child inherits the calling thread's mask.
Alternatives measured (issue 14, 2,000 x ``/bin/true`` on 2 cores): pinning
a spawner thread around each spawn cost 2.3 ms of migration per task;
``taskset -c <cpus> <program>`` (the previous design) doubled the children's
CPU, two execs per task; pinning the child by pid after Popen returns was
racy — a fast task (``sh -c "grep ..."``) had already started a child on the
wrong CPUs (``test_cores_pinned_and_gpus_assigned`` caught it).  stdin is one
shared read-only ``/dev/null`` descriptor.

Reaping is ``waitpid(pid)`` for our own pids only — never ``waitpid(-1)``,
which would steal the pilot's worker processes.

Rejected alternatives: ``shell=True`` for every task (a shell start per task,
quoting bugs); a helper process per task that pins and chdirs (one more exec
per task); ``preexec_fn`` (forces fork instead of vfork, unsafe with threads).

The steps that do not depend on where the process runs — sandbox creation,
staging, finding the executable, the shell wrapper, the environment, the
check of declared outputs, and ``exit_failure`` (exit status -> Failure) —
are module-level functions, shared with ``remote.run_executable``, which runs
executables on the nodes of a dask pilot: the same inputs give the same
Failure there, byte for byte.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading

from .model import EnsembleError, Failure, FailureKind, Input, Staging, Task
from .mpi import RANK_EXEC, RANK_TAIL, LauncherKind
from .spawn import Spawner, envp
from .usage import NONE, Usage, of_rusage, wait_usage

MPI_KILL_GRACE_S = 3.0  # an MPI launcher's time to stop its ranks after SIGTERM (Launcher.kill)
PER_TASK_VARS = ("SHOAL_SANDBOX", "SHOAL_TASK", "SHOAL_RANK_CPUS", "SHOAL_RANK_DIR")


def _threads(task: Task) -> int:
    """OMP_NUM_THREADS of a task: its cores, or an MPI task's cores per rank."""
    return task.cores_per_rank if task.mpi else task.cores


class LaunchError(Exception):
    """An executable task that could not start; ``kind`` says which step failed."""

    def __init__(self, kind: FailureKind, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def tail(path: str, limit: int = 2000) -> str:
    """The last ``limit`` bytes of a file, decoded leniently ('' if unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def rank_tails(sandbox: str, ranks: int, launcher_tail: str) -> str:
    """The launcher's stderr tail, then every rank's, each line labelled: a failure's
    stderr_tail (the ranks last, so a report's last lines show what the ranks said)."""
    parts = []
    text = launcher_tail.strip()[-RANK_TAIL:]
    if text:
        parts.append("[launcher] " + text.replace("\n", "\n[launcher] "))
    for r in range(ranks):
        text = tail(os.path.join(sandbox, f"stderr.rank{r}"), RANK_TAIL).rstrip()
        parts.append(f"[rank {r}] " + (text.replace("\n", f"\n[rank {r}] ") if text else "(no stderr)"))
    return "\n".join(parts)


def make_sandbox(path: str) -> str:
    """Create the task's sandbox directory (and its parents); LaunchError(SANDBOX) if impossible."""
    try:
        os.mkdir(path)  # the common case, one syscall: the stage's directory exists
        return path
    except FileExistsError:
        if os.path.isdir(path):
            return path
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise LaunchError(FailureKind.SANDBOX, f"cannot create sandbox {path}: {exc.strerror}") from None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise LaunchError(FailureKind.SANDBOX, f"cannot create sandbox {path}: {exc.strerror}") from None
    return path


def inside(sandbox: str, rel: str) -> str:
    """``sandbox/rel`` with every symlink among its *parent* directories removed first.

    A task (or an earlier attempt of it) may leave ``sub -> /elsewhere`` in its
    sandbox; staging into ``sub/file`` would then write or delete outside the
    sandbox.  The check is on the resolved path, not the string: a symlinked
    parent is unlinked (it belongs to the sandbox), and the final parent must
    resolve inside the sandbox or this raises LaunchError(STAGING)."""
    root = os.path.realpath(sandbox)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    cur = sandbox
    for part in parts[:-1]:
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            os.unlink(cur)
    dst = os.path.join(sandbox, *parts)
    parent = os.path.realpath(os.path.dirname(dst))
    if parent != root and not parent.startswith(root + os.sep):
        raise LaunchError(FailureKind.STAGING, f"staging target {rel!r} resolves outside the sandbox ({parent})")
    return dst


def stage_in(pairs, sandbox: str) -> None:
    """Copy / link / move each ``(Input, resolved source path)`` into ``sandbox``.

    Run again for every attempt (a retry, the re-run after a resume): what an earlier attempt
    staged is replaced only once the source is known to be there, and a MOVE whose source is
    gone keeps what the earlier attempt moved in — it is the only copy left."""
    for inp, src in pairs:
        try:
            dst = inside(sandbox, inp.target)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            dst = inside(sandbox, inp.target)  # makedirs cannot have followed a link: re-check
            if not (os.path.exists(src) if inp.mode is Staging.LINK else os.path.lexists(src)):
                if inp.mode is Staging.MOVE and os.path.lexists(dst):
                    continue  # moved in by an earlier attempt of this task
                where = f" (resolved to {src})" if src != inp.source else ""
                raise LaunchError(FailureKind.STAGING, f"input {inp.source!r} does not exist{where}")
            if os.path.lexists(dst):
                if os.path.isdir(dst) and not os.path.islink(dst):
                    shutil.rmtree(dst)
                else:
                    os.unlink(dst)
            if inp.mode is Staging.LINK:
                os.symlink(src, dst)
            elif inp.mode is Staging.MOVE:
                shutil.move(src, dst)
            elif os.path.isdir(src):
                shutil.copytree(src, dst)
            else:
                shutil.copy2(src, dst)
        except OSError as exc:
            raise LaunchError(
                FailureKind.STAGING,
                f"cannot {inp.mode.value} input {inp.source!r} -> {inp.target}: {exc.strerror or exc}"
                + (f" (resolved to {src})" if src != inp.source else ""),
            ) from None


def stage_out(pairs, sandbox: str, cwd: str) -> None:
    """Copy each ``(file or directory in the sandbox, destination)`` out (EnTK's
    download/copy_output_data); relative destinations are relative to the driver's working
    directory.  A directory is copied as a tree, merged into one already there (a re-run), and
    its symlinks stay links: nothing outside the sandbox is read.  LaunchError(STAGING)."""
    for name, dest in pairs:
        src = os.path.join(sandbox, name)
        real = os.path.realpath(src)
        root = os.path.realpath(sandbox)
        if not real.startswith(root + os.sep):
            raise LaunchError(FailureKind.STAGING, f"output {name!r} resolves outside the sandbox ({real})")
        target = os.path.join(cwd, dest)
        if os.path.isdir(target):
            target = os.path.join(target, os.path.basename(name))
        try:
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            if os.path.isdir(real):  # a directory output: its tree, links copied as links
                shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(src, target)
        except OSError as exc:
            raise LaunchError(FailureKind.STAGING,
                              f"cannot copy output {name!r} -> {dest}: {exc.strerror or exc}") from None


def check_outputs(names, sandbox: str) -> list[str]:
    """The declared outputs' paths; LaunchError(STAGING) naming the missing ones."""
    paths = [os.path.join(sandbox, name) for name in names]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise LaunchError(FailureKind.STAGING, f"declared outputs missing after exit 0: {missing}")
    return paths


def _flat(env: dict):
    for k, v in env.items():
        yield k
        yield v


def _nul_culprit(argv: list[str], env: dict) -> str:
    """Which argument or variable holds a NUL byte (execve would cut it there: silently
    another command; Popen refuses with a bare ValueError)."""
    for i, a in enumerate(argv):
        if "\0" in a:
            return f"argument {i} of {argv[0]!r} contains a NUL byte: {a!r}"
    for k, v in env.items():
        if "\0" in str(k) or "\0" in str(v):
            return f"environment variable {k!r} contains a NUL byte: {v!r}"
    return "a NUL byte in the command"  # pragma: no cover


def find_executable(exe: str, cwd: str, path: str | None) -> str:
    """``exe`` as an absolute path: relative to ``cwd`` if it has a '/', else found on ``path``."""
    if "/" in exe:
        full = os.path.join(cwd, exe)
        if os.path.isdir(full):
            raise LaunchError(FailureKind.SPAWN, f"executable {exe!r} is a directory")
        if not os.path.isfile(full):
            raise LaunchError(FailureKind.SPAWN, f"executable {exe!r} does not exist")
        if not os.access(full, os.X_OK):
            raise LaunchError(FailureKind.SPAWN, f"executable {exe!r} is not executable (chmod +x?)")
        return full
    found = shutil.which(exe, path=path)
    if found is None:
        raise LaunchError(FailureKind.SPAWN, f"executable {exe!r} not found on PATH")
    return found


_SHELL_OPERATORS = frozenset({">", ">>", "<", "<<", "|", "||", "&&", "&", ";", "2>", "2>>", "&>", "2>&1"})


def entk_word(arg: str) -> str:
    """One EnTK argument as RADICAL-Pilot writes it into its task's shell script: a redirection
    or operator (``'>'``, ``'|'``, ...) and a one-word glob (``*.txt``) bare, a word already in
    single quotes as it is, anything else in double quotes — so ``$VAR`` and ``$(...)`` expand
    and a line with spaces (``['-c', 'cat *.txt | bc']``) stays one word, as on EnTK."""
    if arg in _SHELL_OPERATORS or (("*" in arg or "?" in arg) and not any(c.isspace() for c in arg)):
        return arg
    if len(arg) >= 2 and arg[0] == arg[-1] == "'":
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command(exe: str, arguments, pre_exec, post_exec, shell: bool = False, shared: str | None = None) -> list[str]:
    """The argv to start: ``exe`` and its arguments, or ``/bin/sh -c`` around the shell lines.

    ``shell``: EnTK's tasks — ``exe arguments`` is one shell line (``entk_word``), with ``$SHARED``
    set to the run's shared area (EnTK's ``appman.shared_data``)."""
    argv = [exe, *arguments]
    if shell:
        line = " ".join([shlex.quote(exe), *(entk_word(str(a)) for a in arguments if str(a) != "")])
        lines = [f"SHARED={shlex.quote(shared)}"] if shared else []
        lines += [f"{line}\nrc=$?; [ $rc -eq 0 ] || exit $rc" for line in pre_exec]
        lines.append(line)
        lines.append("rc=$?")
        lines += list(post_exec)
        lines.append("exit $rc")
        return ["/bin/sh", "-c", "\n".join(lines)]
    if pre_exec or post_exec:
        lines = [f"{line}\nrc=$?; [ $rc -eq 0 ] || exit $rc" for line in pre_exec]
        lines.append(shlex.join(argv))
        lines.append("rc=$?")
        lines += list(post_exec)
        lines.append("exit $rc")
        argv = ["/bin/sh", "-c", "\n".join(lines)]
    return argv


def task_env(base, cores: int, environment, sandbox: str, uid: str) -> dict[str, str]:
    """``base`` + OMP_NUM_THREADS (unless the task sets it) + the task's own + SHOAL_SANDBOX/TASK."""
    env = dict(base)
    env["OMP_NUM_THREADS"] = str(cores)
    env.update({k: str(v) for k, v in environment.items()})
    env["SHOAL_SANDBOX"] = sandbox
    env["SHOAL_TASK"] = uid
    return env


def exit_failure(timeout, code: int, timed_out: bool, stderr_tail: str, attempt: int) -> Failure | None:
    """How an executable's end is classified (None: success); the same for both launch paths.

    ``code`` is ``os.waitstatus_to_exitcode``'s: negative when killed by that signal."""
    if timed_out:
        return Failure(FailureKind.TIMEOUT, f"killed after timeout={timeout}s", code, stderr_tail, attempt)
    if code != 0:
        what = f"exit code {code}" if code > 0 else f"killed by signal {-code}"
        return Failure(FailureKind.EXIT_CODE, what, code, stderr_tail, attempt)
    return None


class Launcher:
    """Sandboxes, spawns and reaps executable tasks (for the runner threads and the engine)."""

    def __init__(self, root: str, *, gpus: int = 0):
        self.root = os.path.abspath(root)
        self._prefix = os.path.join(self.root, "")
        self.cwd = os.getcwd()
        self.gpus = gpus
        self.base_env = dict(os.environ)
        self._which: dict[str, str | None] = {}
        self._procs: dict[int, subprocess.Popen] = {}  # pid -> Popen, until reaped
        self._null: int | None = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)  # stdin, shared
        self._spawner = Spawner.load(self._null)  # the C vfork helper; None: subprocess.Popen
        self._base_envp = {k: os.fsencode(k) + b"=" + os.fsencode(v) for k, v in self.base_env.items()}
        self._envp_cache: dict[tuple, list[bytes]] = {}  # see _envp; dict ops are atomic under the GIL
        self.shared = os.path.join(self.root, "~shared")  # EnTK's $SHARED ('~' is in no key: name_key)
        self._shared_sandboxes: dict[str, str] = {}  # uid -> EnTK's t.sandbox, absolute
        self._rank_launchers: dict[int, str] = {}  # pid of an MPI task's launcher -> task uid

    # -- paths ------------------------------------------------------------------------
    def sandbox_of(self, uid: str) -> str:
        if self._shared_sandboxes:
            found = self._shared_sandboxes.get(uid)
            if found is not None:
                return found
        return self._prefix + uid.replace(".", "/")  # = os.path.join(root, *uid.split(".")): keys hold no "/"

    def stage_shared(self, shared_data) -> None:
        """EnTK's ``appman.shared_data``: copy each ``'path'`` / ``'path > name'`` into the shared
        area (after the journal moved an old run's sandbox aside: ``new``), every run, so a resume
        sees the files as they are now."""
        if not shared_data:
            return
        os.makedirs(self.shared, exist_ok=True)
        for entry in shared_data:
            src, _, dst = (x.strip() for x in str(entry).partition(">"))
            src = src.rstrip("/")
            target = os.path.join(self.shared, dst or os.path.basename(src))
            try:
                if os.path.isdir(src):
                    shutil.copytree(src, target, dirs_exist_ok=True)
                else:
                    shutil.copy2(src, target)
            except OSError as exc:
                raise EnsembleError(f"shared_data {entry!r}: cannot copy {src} into the shared area: "
                                    f"{exc.strerror or exc}") from None

    def shared_sandbox(self, uid: str, directory: str) -> None:
        """Task ``uid`` runs in ``directory`` (EnTK's ``t.sandbox``; relative to the root, or absolute)."""
        self._shared_sandboxes[uid] = os.path.normpath(os.path.join(self.root, directory))

    def resolve(self, text: str, ref) -> str:
        """``$p.s.t/file`` -> ``<sandbox of p.s.t>/file``; other strings unchanged."""
        if ref is None:
            return text
        uid, rel = ref
        return os.path.join(self.sandbox_of(uid), rel) if rel else self.sandbox_of(uid)

    def make_sandbox(self, uid: str) -> str:
        return make_sandbox(self.sandbox_of(uid))

    def stage_in(self, inputs: list[Input], sandbox: str, resolve) -> None:
        stage_in([(inp, resolve(inp.source)) for inp in inputs], sandbox)

    def outputs(self, task: Task, sandbox: str) -> list[str]:
        return check_outputs(task.outputs, sandbox)

    # -- spawning ---------------------------------------------------------------------
    def _executable(self, exe: str) -> str:
        found = self._which.get(exe, "")
        if found:
            return found
        if "/" in exe:  # checked by the spawn itself; find_executable explains a failure
            found = self._which[exe] = os.path.join(self.cwd, exe)
            return found
        if exe not in self._which:
            self._which[exe] = shutil.which(exe, path=self.base_env.get("PATH"))
        found = self._which[exe]
        if found is None:
            raise LaunchError(FailureKind.SPAWN, f"executable {exe!r} not found on PATH")
        return found

    def spawn(self, task: Task, uid: str, sandbox: str, gpus, arguments: list[str],
              stdin: str | None, quick_s: float = 0.0, ranks=None) -> int | tuple[int, int, Usage]:
        """Start ``task``: its pid, or (pid, exit code, what it used) when it exited within
        ``quick_s`` and was reaped already, its group killed (the C spawn helper only: its
        rusage, no /proc byte counts).  Raises LaunchError (nothing
        left running).  ``ranks``: (RankLauncher, RankPlacement) of an MPI task (mpi.py): the
        launcher's command starts every rank through rank_exec.py; pre/post_exec run once,
        around the launch."""
        exe = self._executable(task.executable)
        extra: dict[str, str] = {}
        if ranks is not None and ranks[0].kind is not LauncherKind.NONE:
            rank_launcher, placement = ranks
            full = rank_launcher.argv(placement, [sys.executable, "-S", RANK_EXEC, exe, *arguments])
            argv = command(full[0], full[1:], task.pre_exec, task.post_exec, task._shell, self.shared)
            extra = placement.env(sandbox)
        else:
            argv = command(exe, arguments, task.pre_exec, task.post_exec, task._shell, self.shared)
        if "\0" in "".join(argv) or (task.environment and "\0" in "".join(map(str, _flat(task.environment)))):
            raise LaunchError(FailureKind.SPAWN, _nul_culprit(argv, task.environment))
        if stdin is not None and not os.path.isfile(stdin):
            raise LaunchError(FailureKind.STAGING, f"stdin file {stdin} does not exist")
        out, err = sandbox + "/" + task.stdout_file, sandbox + "/" + task.stderr_file  # sandbox_of: absolute
        try:
            if self._spawner is not None:
                pid, status, ru = self._spawner.spawn(argv[0], argv, self._envp(task, sandbox, uid, gpus, extra),
                                                      sandbox, stdin, out, err, int(quick_s * 1000))
                if status is not None:
                    return pid, os.waitstatus_to_exitcode(status), of_rusage(ru)
            else:
                env = task_env(self.base_env, _threads(task), task.environment, sandbox, uid)
                env.update(extra)
                if self.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
                pid = self._spawn_popen(argv, env, sandbox, stdin, out, err)
            if extra:
                self._rank_launchers[pid] = uid  # kill() stops it the MPI way
            return pid
        except OSError as exc:
            if "/" in task.executable:
                find_executable(task.executable, self.cwd, None)  # LaunchError: missing, not executable
            raise LaunchError(FailureKind.SPAWN, f"cannot start {task.executable!r}: {exc}") from None

    def _envp(self, task: Task, sandbox: str, uid: str, gpus, extra=None) -> list[bytes]:
        """``task_env`` (+ CUDA_VISIBLE_DEVICES) as execve entries; the inherited part is encoded once,
        and the part that does not change per task is built once per (cores, environment, gpus)."""
        key = (_threads(task), tuple((k, str(v)) for k, v in task.environment.items()) if task.environment else (),
               tuple(gpus) if self.gpus else ())
        fixed = self._envp_cache.get(key)
        if fixed is None:
            over = {"OMP_NUM_THREADS": str(_threads(task))}
            over.update({k: str(v) for k, v in task.environment.items()})
            if self.gpus:
                over["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            per_task = PER_TASK_VARS
            fixed = [e for k, e in self._base_envp.items() if k not in over and k not in per_task] + envp(
                {k: v for k, v in over.items() if k not in per_task})
            if len(self._envp_cache) < 256:  # bounded: environments may differ per task
                self._envp_cache[key] = fixed
        return fixed + envp({"SHOAL_SANDBOX": sandbox, "SHOAL_TASK": uid, **(extra or {})})

    def _spawn_popen(self, argv, env, sandbox, stdin, out, err) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        i = os.open(stdin, os.O_RDONLY | os.O_CLOEXEC) if stdin else self._null
        try:
            o = os.open(out, flags, 0o644)
            try:
                e = os.open(err, flags, 0o644)
                try:
                    proc = subprocess.Popen(argv, executable=argv[0], cwd=sandbox, env=env, stdin=i,
                                            stdout=o, stderr=e, start_new_session=True)
                finally:
                    os.close(e)
            finally:
                os.close(o)
        finally:
            if stdin:
                os.close(i)
        self._procs[proc.pid] = proc
        return proc.pid

    def close(self) -> None:
        if self._null is not None:
            os.close(self._null)
            self._null = None

    # -- ending -----------------------------------------------------------------------
    def wait(self, pid: int) -> tuple[int, Usage]:
        """Block until ``pid`` (a child this launcher spawned) exits and reap it: its exit status
        (negative: killed by that signal) and what it used (``usage.wait_usage``: wait4's
        rusage, its /proc counters read while it is a zombie).  Called by the runner thread
        that spawned it, once the child has exited."""
        proc = self._procs.pop(pid, None)
        self._rank_launchers.pop(pid, None)
        try:
            status, used = wait_usage(pid)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere (an embedding program's waitpid(-1)): lost
            code, used = 255, NONE
        if proc is not None:
            proc.returncode = code  # no "still running" warning when the Popen is collected
        return code, used

    def kill(self, pid: int) -> None:
        """SIGKILL the task's whole process group (it may have started children).

        An MPI task's launcher gets SIGTERM instead (mpirun and srun pass it on to every rank
        and clean up after them), and ``MPI_KILL_GRACE_S`` later its group and every process
        still in its session that carries the task's SHOAL_TASK get SIGKILL: mpirun's ranks
        run in process groups of their own, so a group kill alone left them running (seen:
        a 2-rank task killed at its timeout left both ranks sleeping)."""
        uid = self._rank_launchers.get(pid)
        if uid is None:
            kill_group(pid)
            return
        for target in (lambda: os.killpg(pid, signal.SIGTERM), lambda: os.kill(pid, signal.SIGTERM)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                target()
                break
        timer = threading.Timer(MPI_KILL_GRACE_S, kill_session, (pid, uid))
        timer.daemon = True
        timer.start()


def process_start(pid: int) -> float:
    """``pid``'s start time as psutil reports it (what ``kill_leftover`` compares with: the
    kernel's boot-relative start plus the boot time, which can be ~1 s off the wall clock)."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        import time

        return time.time()


def kill_leftover(pid, start, uid: str, sandbox: str | None) -> bool:
    """Kill a process a previous (killed) driver started for task ``uid`` — only one that proves
    it is that task's.

    The journal is a file anyone may have written (a trust boundary), and a process's pid and
    start time are public (``/proc/<pid>/stat``), so they alone would let a crafted journal name
    any process to kill.  The process must also carry the task's own environment as the spawn
    set it (``/proc/<pid>/environ``: ``SHOAL_TASK=<uid>`` and ``SHOAL_SANDBOX=<its sandbox>``),
    readable only for processes of the same user.  A program that cleared its environment
    (``env -i``) is not killed: the rerun proceeds, as for a pid that was reused.  pid <= 1 and
    this process are never killed."""
    if type(pid) is not int or pid <= 1 or pid == os.getpid() or not isinstance(start, int | float) \
            or not sandbox:
        return False
    try:
        import psutil

        proc = psutil.Process(pid)
        if abs(proc.create_time() - start) > 1.0:
            return False  # the pid was reused by an unrelated process
        env = proc.environ()
        if env.get("SHOAL_TASK") != uid or env.get("SHOAL_SANDBOX") != sandbox:
            return False  # not the task's process: never kill a stranger
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        return True
    except Exception:
        return False


def check_root(root: str) -> None:
    if os.path.exists(root) and not os.path.isdir(root):
        raise EnsembleError(f"sandbox root {root} exists and is not a directory; pass another sandbox=")


def kill_session(sid: int, uid: str) -> None:
    """SIGKILL the group led by ``sid`` and every process of session ``sid`` whose environment
    says it belongs to task ``uid`` (the session alone could be a newcomer's reusing the number)."""
    kill_group(sid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) != sid:  # after ") ": state, ppid, pgrp, session
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"SHOAL_TASK={uid}".encode() not in f.read().split(b"\0"):
                    continue
            os.kill(int(entry), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (or the process alone if it leads none)."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
            return
        except (ProcessLookupError, PermissionError):
            continue
