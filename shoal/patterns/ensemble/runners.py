"""Runner threads: one per CPU of a run, each spawns the executables granted that CPU and reaps them.

Data flow (local executables only; function tasks and dask go through the pilot)::

    engine: journal RUNNING + commit ──► Runners.submit(item, cpus, launch) ──► the queue of the
            runner of min(cpus)
    runner: pin the child's mask ──► launch() (sandbox, staging, spawn) ──► post SPAWNED(pid, start)
            ──► blocking waitpid(pid) ──► post EXITED(exit code) ──► next job
            (a child that exits within QUICK_S: SPAWNED and EXITED posted with one wake-up,
            and the engine does not journal its pid: a dead process needs no killing; with the
            C spawn helper, launch() itself waits those QUICK_S, kills the group and reaps)
    engine: poll(wake pipe) ──► Runners.events (SPAWNED/EXITED, in order per item) ──► journal

Why threads per CPU: an exec'd ``/bin/true`` lives for well under a millisecond, so the cost of
an executable ensemble is latency and CPU around the spawn, not the task.  Measured on the 2-core
machine (issue 14, 2,000 x ``/bin/true``): spawning on the driver thread waited for each exec;
a pool of spawner threads plus pidfds polled by the driver still made every task cost two thread
wake-ups, a ``poll`` and a driver pass before its CPU was free again; and pinning the child
through ``taskset -c`` doubled the children's CPU (two execs per task: 1.29 ms vs 0.58 ms).
Here the runner of a CPU is pinned to that CPU once, so a child it spawns inherits the mask
(vfork copies the calling thread's affinity: pinned from its first instruction, no extra exec,
no migration of the driver), and it waits for its own child in ``waitpid`` (the GIL released),
so an exit is seen at once, with no pidfd and no polling.

Invariants:
  * every pid a runner spawns is reaped by that runner (``waitpid(pid)``, never ``waitpid(-1)``,
    which would steal the pilot's worker processes); the engine never waits itself;
  * a task's process group does not outlive it: when the task exits (normally, by a signal, for
    its timeout) its runner SIGKILLs the group *before* reaping it, so background children it
    left (``sleep 600 &``) die with it; the unreaped zombie keeps the group id from being reused
    by then (a child that left the group with ``setsid``/``setpgid`` escapes this, as in a shell);
  * kills go through ``Runners.kill``, which signals a pid only while it has not exited
    (``waitid(WNOWAIT)`` sees the exit and leaves a zombie, so the pid is not reused until
    the runner, under the same lock, has forgotten it and only then reaps it);
  * per item, SPAWNED is posted before EXITED, and each exactly once; a job taken after
    ``stop_new()`` is answered SPAWNED(NOT_STARTED) without launching (walltime drain, abort);
    ``busy`` stays true until every submitted job has posted its last event, and a drain
    waits on that count, not on the engine's own bookkeeping;
  * a task granted CPUs S is spawned by the runner of min(S); the Scheduler never grants a CPU
    to two running tasks, so a runner has at most one child at a time; its queue holds at most
    the next job besides the current one (the Scheduler's queueing behind, which the engine
    asks for while tasks are short: the runner goes from one child to the next without waiting
    for a driver pass, and the driver starts that task's timeout clock at its SPAWNED);
  * a queued job never waits behind a long child: once the current child outlives QUICK_S
    its runner answers BOUNCED to what is queued and, until that child exits, ``submit``
    answers BOUNCED to new jobs for that CPU (both under ``_lock``, so none slips in between);
    the engine places a bounced task again;
  * the child's mask: S when S is a subset of this process's CPUs, else unpinned (synthetic
    topologies name CPUs this host lacks); the runner changes its own mask only for such a
    child and restores it right after the spawn.

Rejected alternatives: a thread per running task (unbounded with long tasks; here it is one per
CPU, and a task holds at least one CPU); ``waitpid(-1)`` / SIGCHLD (steals the pilot's workers);
``taskset`` per task (an extra exec); pinning the child by pid after the spawn (racy: the child
may already have started its own children); a fork-server process (one more process and IPC hop
on the critical path, and the same spawn cost inside it).
"""

from __future__ import annotations

import collections
import contextlib
import enum
import os
import queue
import select
import threading
import time
from collections.abc import Callable, Iterable


class Event(enum.Enum):
    SPAWNED = "spawned"  # (item, pid | exception | NOT_STARTED, the pid's start time or None)
    EXITED = "exited"  # (item, exit code as os.waitstatus_to_exitcode gives it, Usage or None)


NOT_STARTED = "not started"  # the answer to a job taken after stop_new()
BOUNCED = "bounced"  # a job queued behind a child that outlived QUICK_S: the engine places it again
QUICK_S = 0.005  # a child that exits this soon is reported SPAWNED+EXITED with one wake-up


class Runners:
    """One runner thread per CPU id; ``events`` is read by the engine (owner) only."""

    def __init__(self, cpus: Iterable[int], *, wait: Callable[[int], tuple], wake: Callable[[], None],
                 kill: Callable[[int], None], started: Callable[[int], float] = lambda pid: time.time()):
        try:
            self.affinity: frozenset[int] | None = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            self.affinity = None
        self._wait = wait  # blocking reap of one pid -> (exit code, Usage) (Launcher.wait)
        self._wake = wake  # wakes the engine's poll (thread-safe, never blocks)
        self._kill = kill  # SIGKILL a pid's process group (Launcher.kill)
        self._started = started  # a pid's start time, as a resume's kill_leftover will compare it
        self._lock = threading.Lock()
        self._live: set[int] = set()  # spawned and not yet exited: their pids cannot be reused
        self._jobs = 0  # submitted and not yet answered with their last event
        self.events: collections.deque = collections.deque()
        self._stop_new = False
        self._long: set[int] = set()  # CPUs whose runner waits on a child that outlived QUICK_S
        self._queues: dict[int, queue.SimpleQueue] = {}
        self._threads: list[threading.Thread] = []
        for cpu in sorted(set(cpus)):
            q: queue.SimpleQueue = queue.SimpleQueue()
            t = threading.Thread(target=self._loop, args=(cpu, q), name=f"shoal-runner-{cpu}", daemon=True)
            self._queues[cpu] = q
            self._threads.append(t)
            t.start()

    def submit(self, item, cpus, launch: Callable[[], int | tuple]) -> None:
        """Run ``launch`` on the runner of ``min(cpus)``.  It returns the pid (the runner reaps it),
        or (pid, exit code, Usage) for a child that exited within QUICK_S and that ``launch`` reaped
        itself, its group killed first (the C spawn helper: spawn, wait, kill and reap in one call
        without the GIL; the pid was never published, so no kill can have aimed at it), or raises."""
        cpu = min(cpus)
        with self._lock:  # the runner of a long child drains its queue under the same lock
            if cpu in self._long:  # queued behind a long child: answered at once, never stuck there
                self.events.append((Event.SPAWNED, item, BOUNCED, None))
                return
            self._jobs += 1
            self._queues[cpu].put((item, frozenset(cpus), launch))

    @property
    def busy(self) -> bool:
        """Some job has not posted its last event yet (EXITED, or a SPAWNED without a pid)."""
        return self._jobs > 0

    def kill(self, pid: int) -> None:
        """SIGKILL ``pid``'s process group if it has not exited (the engine's kill: timeouts,
        walltime, abort).  A pid whose exit was seen is left alone: once reaped, the number may
        belong to another process."""
        with self._lock:
            if pid in self._live:
                self._kill(pid)

    def stop_new(self) -> None:
        """Jobs not yet taken are answered NOT_STARTED from now on (running children are not touched)."""
        self._stop_new = True

    def close(self, timeout: float = 10.0) -> None:
        for q in self._queues.values():
            q.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    # -- the runner threads ------------------------------------------------------------
    def _child_mask(self, cpus: frozenset[int]) -> frozenset[int] | None:
        if self.affinity is None:
            return None
        return cpus if cpus <= self.affinity else self.affinity

    def _set_mask(self, mask) -> frozenset[int] | None:
        if mask is None:
            return None
        try:
            os.sched_setaffinity(0, mask)  # 0: this thread
            return mask
        except OSError:
            return None

    def _loop(self, cpu: int, q: queue.SimpleQueue) -> None:
        mine = self._set_mask(self._child_mask(frozenset((cpu,))))
        while True:
            job = q.get()
            if job is None:
                return
            item, cpus, launch = job
            if self._stop_new:
                self._post(Event.SPAWNED, item, NOT_STARTED, None, last=True)
                continue
            want = self._child_mask(cpus)
            changed = want is not None and want != mine and self._set_mask(want) is not None
            try:
                pid = launch()
            except BaseException as exc:  # noqa: BLE001 - handed to the engine, which decides
                pid = exc
            finally:
                if changed:
                    self._set_mask(mine if mine is not None else self.affinity)
            if isinstance(pid, tuple):  # already reaped: one wake-up for both events
                self.events.append((Event.SPAWNED, item, pid[0], None))
                self._post(Event.EXITED, item, pid[1], pid[2], last=True)
                continue
            if not isinstance(pid, int):
                self._post(Event.SPAWNED, item, pid, None, last=True)
                continue
            with self._lock:
                self._live.add(pid)
            if self._exited_soon(pid):  # a short task: one wake-up for both events
                self.events.append((Event.SPAWNED, item, pid, None))
            else:  # the engine journals the pid and its start now
                self._post(Event.SPAWNED, item, pid, self._started(pid))
                self._bounce(cpu, q)
                with contextlib.suppress(ChildProcessError):
                    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie: the pid stays ours
                with self._lock:
                    self._long.discard(cpu)
            with self._lock:
                self._live.discard(pid)
            self._kill(pid)  # what the task left behind in its group dies with it (the zombie
            code, used = self._wait(pid)  # still holds the pgid)
            self._post(Event.EXITED, item, code, used, last=True)

    def _bounce(self, cpu: int, q: queue.SimpleQueue) -> None:
        """This CPU's child outlived QUICK_S: answer BOUNCED to the jobs queued behind it (and,
        through ``submit``, to those that come while it runs), so the engine places them on a
        CPU that frees up first instead of leaving them behind a task of unknown length."""
        bounced = False
        with self._lock:
            self._long.add(cpu)
            while True:
                try:
                    job = q.get_nowait()
                except queue.Empty:
                    break
                if job is None:  # close(): keep the sentinel for after this child
                    q.put(None)
                    break
                self.events.append((Event.SPAWNED, job[0], BOUNCED, None))
                self._jobs -= 1
                bounced = True
        if bounced:
            try:
                self._wake()
            except Exception:  # noqa: BLE001 - a wake-up that fails must not kill the runner
                pass

    def _exited_soon(self, pid: int) -> bool:
        """True if ``pid`` exits within QUICK_S (it is not reaped here)."""
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return False
        try:
            return bool(select.select([fd], [], [], QUICK_S)[0])
        except OSError:
            return False
        finally:
            os.close(fd)

    def _post(self, kind: Event, item, a, b, last: bool = False) -> None:
        self.events.append((kind, item, a, b))
        if last:
            with self._lock:
                self._jobs -= 1
        try:
            self._wake()
        except Exception:  # noqa: BLE001 - a wake-up that fails must not kill the runner
            pass
