"""The local backend's worker processes: start, generations, deaths' reaping, signals.

Workers are ``python -m shoal.runtime.worker`` processes started with ``subprocess``
(fork+exec): safe when the driver has threads (a dask Client), and ``__main__`` is
never re-imported.  They inherit the segment, the doorbells and the read end of a
*lifeline* pipe; when the driver dies (even by SIGKILL) the pipe reaches EOF and every
worker exits at once.  Each is watched through a pidfd, which wakes the parked pump
when it exits (``endpoint_of``).

State (``Processes`` only; the rest of the backend asks through its methods):

* per endpoint its ``Popen`` and pidfd, and its *generation*: how many processes that
  endpoint has had die (the replacement's number; older ones are dead, so a message
  naming one is answered as from the dead, loans.LoanBook.dead);
* the lifeline pipe, and how many workers died.

Ownership (no lock of its own): changed by one thread at a time, the pump's death
handling (``reaped``, ``next_generation``, ``start`` of a replacement under ``lock``),
the constructor and ``close()``; read by any thread, each read one dict lookup (atomic
under the GIL).  A reader that needs a worker's process to stay the same across reads
holds ``lock``, under which replacements start (cancel.py ``force_cancel``).

Rejected: multiprocessing's Process (spawn re-imports ``__main__``; fork is unsafe with
threads); polling ``waitpid`` for deaths (pidfds wake the parked pump instead); the
generation bumped when the death is first seen (what the dead worker sent before dying
is drained first, and its MOVED messages must be read as from a live generation).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

from ..._errors import WorkerLost
from ...runtime import context
from ...runtime.worker import STATUS_PID


class Processes:
    """The worker processes of one backend, by endpoint (see the module docstring)."""

    def __init__(self, endpoints: range, matrix, topology, slots: list, seed: int,
                 trace_path: str | None, max_tasks: int | None):
        self._endpoints = endpoints
        self._matrix = matrix
        self._topology = topology
        self._slots = slots
        self._node_of = [node for _, node in slots]
        self._seed = seed
        self._trace_path = trace_path
        self._max_tasks = max_tasks
        self._procs: dict[int, subprocess.Popen] = {}
        self._pidfds: dict[int, int] = {}
        self._generation = dict.fromkeys(endpoints, 0)
        self._deaths = 0
        self._lifeline_r, self._lifeline_w = os.pipe()

    # -- queries -------------------------------------------------------------------------

    def proc(self, ep: int) -> subprocess.Popen | None:
        """Endpoint ``ep``'s process now (None: none, e.g. a replacement failed to start)."""
        return self._procs.get(ep)

    def pid(self, ep: int) -> int:
        proc = self._procs.get(ep)
        return proc.pid if proc is not None else 0

    def running(self, ep: int) -> bool:
        """Whether ``ep``'s process has not exited."""
        proc = self._procs.get(ep)
        return proc is not None and proc.poll() is None

    def all(self) -> list[tuple[int, subprocess.Popen]]:
        """(endpoint, process) of every worker, as of now."""
        return list(self._procs.items())

    def generation(self, ep: int) -> int:
        return self._generation[ep]

    def generations(self) -> types.MappingProxyType:
        """Endpoint -> its current generation (a live read-only view)."""
        return types.MappingProxyType(self._generation)

    def procs(self) -> types.MappingProxyType:
        """Endpoint -> its process (a live read-only view)."""
        return types.MappingProxyType(self._procs)

    def deaths(self) -> int:
        return self._deaths

    def pidfds(self) -> list[int]:
        """The pidfds the pump parks on (one becomes readable when its worker exits)."""
        return list(self._pidfds.values())

    def endpoint_of(self, pidfd: int) -> int | None:
        """Which endpoint ``pidfd`` watches now (None: none)."""
        for ep, fd in list(self._pidfds.items()):
            if fd == pidfd:
                return ep
        return None

    def lifeline_w(self) -> int:
        """The write end of the lifeline (-1 once closed)."""
        return self._lifeline_w

    # -- changes -------------------------------------------------------------------------

    def start(self, ep: int) -> None:
        """Start ``ep``'s process of its current generation (raises if it cannot)."""
        cpu, node = self._slots[ep - 1]
        spec = {
            "endpoint": ep,
            "generation": self._generation[ep],
            # every endpoint's current generation (this one's included): older ones are dead
            # (a request one of them left in a ring is not answered, a MOVED naming one
            # re-runs at once; loans.LoanBook.dead)
            "generations": [[e, g] for e, g in self._generation.items()],
            "cpu": cpu,
            "real_cpu": self._topology.real_cpu(cpu),
            "node": node,
            "node_of": self._node_of,
            "seed": self._seed,
            "lifeline": self._lifeline_r,
            "rings": self._matrix.spec(),
            "trace": self._trace_path,
            "max_tasks": self._max_tasks,
            "sys_path": [p for p in sys.path if p],  # so tasks import what the driver imports
            # modules to import in the worker right after others are (shoal.runtime.post_import)
            "after_import": {k: sorted(v) for k, v in context.worker_after_import.items()},
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [_package_root(), env.get("PYTHONPATH")] if p)
        key_fd = spec["authkey_fd"] = _authkey_pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "shoal.runtime.worker", json.dumps(spec)],
                pass_fds=[*self._matrix.fds(), self._lifeline_r, key_fd],
                env=env,
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(key_fd)
        try:
            pidfd = os.pidfd_open(proc.pid)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        self._procs[ep] = proc
        self._pidfds[ep] = pidfd

    def wait_started(self, timeout: float) -> None:
        """Return once every worker runs its loop (its pid is in its status cell); a
        worker that exits first (a broken interpreter, an import error) is an error."""
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while True:
            waiting = [ep for ep in self._endpoints if not self._matrix.status(ep)[STATUS_PID]]
            if not waiting:
                return
            for ep in waiting:
                code = self._procs[ep].poll()
                if code is not None:
                    raise WorkerLost(f"worker {ep} exited with code {code} while starting "
                                     f"({sys.executable} -m shoal.runtime.worker)")
            if time.monotonic() > deadline:
                raise WorkerLost(f"workers {waiting} did not start within {timeout} s")
            time.sleep(pause)
            pause = min(0.01, pause * 2)

    def signal(self, ep: int, sig: int) -> None:
        """Send ``sig`` to ``ep``'s process (gone already: nothing)."""
        try:
            self._procs[ep].send_signal(sig)
        except ProcessLookupError:
            pass

    def reaped(self, ep: int) -> subprocess.Popen:
        """``ep``'s process exited (its pidfd woke the pump): reap it, stop watching it."""
        proc = self._procs[ep]
        proc.wait()
        os.close(self._pidfds.pop(ep))
        self._deaths += 1
        return proc

    def next_generation(self, ep: int) -> int:
        """The death of ``ep`` is accounted for: its next process is the next generation.
        Returns the dead one's."""
        dead = self._generation[ep]
        self._generation[ep] = dead + 1
        return dead

    def forked(self) -> None:
        """In a forked child: forget the parent's processes, close their fds here."""
        for fd in [*self._pidfds.values(), self._lifeline_w]:
            if fd < 0:
                continue  # closed by the parent's close() before the fork
            try:
                os.close(fd)
            except OSError:
                pass
        self._pidfds, self._procs = {}, {}

    def teardown(self) -> None:
        """Kill what still runs, close every fd (the last step of ``close()``)."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()
        for fd in (self._lifeline_r, self._lifeline_w):
            try:
                os.close(fd)
            except OSError:
                pass
        # Forgotten, not just closed: the at-fork hook (``_forked``) of every later child
        # would close these numbers again, and by then they name someone else's file (a
        # Popen's pipe: its child failed with EBADF before exec).
        self._lifeline_r = self._lifeline_w = -1


def _authkey_pipe() -> int:
    """The read end of a pipe holding the driver's ``multiprocessing`` authkey, for a worker.

    ``Manager`` proxies (and ``multiprocessing.connection`` listeners of the driver)
    authenticate with ``multiprocessing.current_process().authkey``; the stdlib's pool
    children inherit it, so a worker adopts it too (worker.py ``_adopt_authkey``).  A pipe,
    not the command line or the environment: argv is world-readable in /proc, and the key
    lets its holder talk to every manager of the driver.  The key is 32 bytes: the write
    never blocks (a pipe holds 64 KiB)."""
    from multiprocessing import process  # the driver's key exists from this import on

    key = bytes(process.current_process().authkey)
    r, w = os.pipe()
    try:
        os.write(w, key)
    finally:
        os.close(w)
    return r


def _package_root() -> str:
    """The directory holding the ``shoal`` package, so workers import the same code."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
