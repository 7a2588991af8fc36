"""The embedded local backend: worker processes on this machine, rings in shared memory.

Processes and threads::

    user threads ──submit──►  [driver→worker rings]  ──►  worker 1..N  (shoal.runtime.worker)
         ▲                                                   │  ▲  peer rings: steals, loot,
         │ futures set by                                    │  │  results of lent tasks
         └──── pump thread ◄── [worker→driver rings] ◄───────┘  ▼

* ``submit`` (any user thread) registers the task, picks a worker with the
  pure ``Placement`` policy (NUMA-aware redirect-push) and pushes one message.
  A process-local mutex serializes driver threads on the producer side of
  the driver's rings; no lock is ever shared with a worker.
* The pump thread is the only consumer of the worker→driver rings.  It sets
  futures, tracks where stolen driver tasks went (``MOVED``), enforces
  timeouts, and notices dead workers through pidfds (no polling), then
  replaces them.  When nothing arrives it parks on the driver's doorbell.
* Workers are ``python -m shoal.runtime.worker`` processes started with
  ``subprocess`` (fork+exec): safe when the driver has threads (a dask
  Client), and ``__main__`` is never re-imported.  They inherit the segment,
  the doorbells and the read end of a *lifeline* pipe; when the driver dies
  (even by SIGKILL) the pipe reaches EOF and every worker exits at once.  The
  segment is a memfd, so no /dev/shm name exists to leak.

Failure rules: a worker's status cell lists the driver tasks it was running;
when it dies those fail with ``WorkerLost`` (``TaskTimeout`` for the one that
overran) unless ``retries`` remain, and every other task it held is
resubmitted quietly.  A result that arrives twice (a re-run) is delivered once.

Rejected: multiprocessing's Process (spawn re-imports ``__main__``; fork is
unsafe with threads); a result-collecting thread per worker (GIL churn); a
named shared-memory segment (leaks on SIGKILL).
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import types

from .._errors import PilotClosed, SerializationError, TaskTimeout, WorkerLost
from ..queues import RingMatrix
from ..queues.ring import Ring
from ..runtime import trace as tracing
from ..runtime import wire
from ..runtime.future import Future
from ..runtime.mailbox import Inbox, Outbox
from ..runtime.policy import Placement
from ..runtime.topology import topology as get_topology
from ..runtime.wire import Flag, Kind
from ..runtime.worker import (
    _ATOMIC,
    POKE,
    STATUS_DEPTH,
    STATUS_HUNGRY,
    STATUS_PID,
    STATUS_RUNNING,
    STATUS_SLOTS,
    has_futures,
    resolve_futures,
)

_CACHEABLE = (types.FunctionType, types.BuiltinFunctionType)
_CANCELLED = "CANCELLED"
_SPIN = 3  # empty pump rounds before parking (spinning would hold the GIL that submit needs)


class _Task:
    """Driver-side record of one outstanding task."""

    __slots__ = ("future", "msg", "retries", "timeout", "placed", "where", "fn")

    def __init__(self, future, msg, retries, timeout, fn):
        self.future = future
        self.msg = msg  # the TASK message, kept for resubmission
        self.retries = retries
        self.timeout = timeout
        self.placed = 0  # endpoint chosen by Placement (its load counts this task)
        self.where = 0  # endpoint that holds it now, as far as the driver knows
        self.fn = fn

    @property
    def name(self) -> str:
        return f"{wire.describe(self.fn)} ({self.future.task_id:#x})"


class LocalBackend:
    """Worker processes on this machine, connected by shared-memory rings."""

    kind = "local"

    def __init__(
        self,
        workers: int | None = None,
        *,
        topology: str | None = None,
        trace: str | None = None,
        seed: int = 0,
        ring_capacity: int = 1 << 20,
        peer_capacity: int = 1 << 18,
    ):
        self.topology = get_topology(spec=topology)
        if workers is None:
            workers = len(self.topology.usable_cpus)
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise TypeError(f"workers must be an int or None, got {workers!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got workers={workers}")
        self.n = workers
        self.trace_path = os.path.abspath(trace) if trace else None
        self.seed = seed
        self.slots = self.topology.worker_slots(workers)
        self.node_of = [node for _, node in self.slots]
        self.placement = Placement(self.node_of, random.Random(seed))
        self.matrix = RingMatrix(workers + 1, ring_capacity, peer_capacity)
        self.lock = threading.Lock()  # driver threads on the producer side of driver rings
        self.out = {ep: Outbox(self.matrix.ring(0, ep), self.matrix.doorbell(ep)) for ep in self.endpoints}
        self.inboxes = [(ep, Inbox(self.matrix.ring(ep, 0))) for ep in self.endpoints]
        self.doorbell = self.matrix.doorbell(0)
        self._cancel_cb = self._cancel
        self.tasks: dict[int, _Task] = {}
        self.ids = itertools.count(1)
        self.fn_ids: dict[int, tuple[int, object]] = {}  # id(fn) -> (fn id, fn kept alive)
        self.defines: list[bytes] = []
        self.deadlines: list = []  # heap of (deadline, task id, endpoint)
        self.timed_out: dict[int, int] = {}  # endpoint killed -> task id that overran
        self.stats_replies: dict[int, dict] = {}
        self.latest_stats: dict[int, dict] = {}  # every worker's last STATS reply (monitor())
        self.stats_cond = threading.Condition()
        self.recently_cancelled: dict[int, None] = {}  # task ids, oldest first (MOVED races)
        self.loot: list[bytes] = []  # export(): steal answers to endpoint 0 ...
        self.loot_wait: set[int] = set()  # ... and the workers yet to answer
        self.loot_cond = threading.Condition()
        self.export_lock = threading.Lock()
        self.closing = False
        self.closed = False
        self.deaths = 0
        self.messages_in = 0
        self.generation = dict.fromkeys(self.endpoints, 0)
        self.procs: dict[int, subprocess.Popen] = {}
        self.pidfds: dict[int, int] = {}
        self.lifeline_r, self.lifeline_w = os.pipe()
        try:
            for ep in self.endpoints:
                self._start_worker(ep)
        except BaseException:
            self._teardown()
            raise
        self.pump_thread = threading.Thread(target=self._pump, name="shoal-pump", daemon=True)
        self.pump_thread.start()

    @property
    def endpoints(self) -> range:
        return range(1, self.n + 1)

    # -- workers -----------------------------------------------------------------------

    def _start_worker(self, ep: int) -> None:
        cpu, node = self.slots[ep - 1]
        spec = {
            "endpoint": ep,
            "generation": self.generation[ep],
            "cpu": cpu,
            "real_cpu": self.topology.real_cpu(cpu),
            "node": node,
            "node_of": self.node_of,
            "seed": self.seed,
            "lifeline": self.lifeline_r,
            "rings": self.matrix.spec(),
            "trace": self.trace_path,
            "sys_path": [p for p in sys.path if p],  # so tasks import what the driver imports
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [_package_root(), env.get("PYTHONPATH")] if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal.runtime.worker", json.dumps(spec)],
            pass_fds=[*self.matrix.fds(), self.lifeline_r],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        self.procs[ep] = proc
        self.pidfds[ep] = os.pidfd_open(proc.pid)

    def _on_death(self, ep: int) -> None:
        """A worker process exited: account for its tasks, tell the others, replace it."""
        proc = self.procs[ep]
        proc.wait()
        os.close(self.pidfds.pop(ep))
        self.deaths += 1
        self._drain_inboxes()  # results it sent before dying are not lost
        status = self.matrix.status(ep)
        depth = status[STATUS_DEPTH]
        running = {status[STATUS_RUNNING + i] for i in range(min(depth, STATUS_SLOTS))}
        for i in range(RingMatrix.STATUS_WORDS):
            status[i] = 0
        overran = self.timed_out.pop(ep, None)
        with self.stats_cond:
            self.latest_stats.pop(ep, None)  # a monitor shows the replacement, not the dead
        dead_gen = self.generation[ep]
        self.generation[ep] = dead_gen + 1
        lost: list[_Task] = []
        with self.lock:
            # Unread messages to the dead worker: its tasks go elsewhere, the rest is moot.
            ring = Ring(self.matrix.segment.buf, *self.matrix._ring_offsets[(0, ep)])
            while ring.readable():
                ring.pop()
            ring.close()
            self.out[ep].pending.clear()
            for other in self.endpoints:
                if other != ep:
                    self._send(other, wire.encode_control(Kind.DIED, [ep, dead_gen]))
            for tid, task in list(self.tasks.items()):
                if task.placed == ep:
                    self.placement.finished(ep - 1)
                    task.placed = 0
                if task.where == ep:
                    if tid in running or tid == overran:
                        lost.append(task)
                    else:
                        self._dispatch(task)
            for inbox_ep, box in self.inboxes:
                if inbox_ep == ep:
                    box.reset()
            if not self.closing:
                self._start_worker(ep)
                for msg in self.defines:
                    self._send(ep, msg, wake=False)
        for task in lost:
            tid = task.future.task_id
            if tid == overran:
                err = TaskTimeout(f"task {task.name} ran longer than its timeout of {task.timeout} s; "
                                  f"worker {ep} was killed and replaced")
            else:
                err = WorkerLost(f"worker {ep} (pid {proc.pid}) died with exit code {proc.returncode} "
                                 f"while running task {task.name}; a replacement was started")
            self._fail_or_retry(tid, task, err)

    # -- submitting --------------------------------------------------------------------

    def submit(self, fn, args: tuple, kwargs: dict, *, retries: int = 0, timeout: float | None = None) -> Future:
        # The hot path of tiny tasks: every line here costs ~0.1 us per task.
        if self.closing:
            raise PilotClosed("submit() on a closed pilot; open a new shoal.Pilot")
        if type(retries) is not int or retries or timeout is not None:
            _check_options(retries, timeout)
        fut = Future()
        fut.task_id = next(self.ids)
        fut._canceller = self._cancel_cb  # made once: a bound method per future is GC work
        if (args and _any_future(args)) or (kwargs and _any_future(kwargs.values())):
            if not callable(fn):
                raise TypeError(f"submit() needs a callable, got {type(fn).__name__} {fn!r}")
            self._submit_later(fut, fn, args, kwargs, retries, timeout)
            return fut
        try:
            self._submit_now(fut, fn, args, kwargs, retries, timeout)
        except SerializationError as exc:
            fut.set_exception(exc)  # the error belongs to this task, not to the caller's loop
        return fut

    def _submit_now(self, fut, fn, args, kwargs, retries, timeout) -> None:
        flags = Flag.TIMED if timeout is not None else 0
        entry = self.fn_ids.get(id(fn))
        if entry is not None:
            fn_id = entry[0]
            payload = wire.dump_args(args, kwargs, fn)
        elif type(fn) in _CACHEABLE:
            fn_id = self._fn_id(fn)
            payload = wire.dump_args(args, kwargs, fn)
        elif callable(fn):  # bound methods, partials, callable objects: their state may change
            fn_id = 0
            flags |= Flag.INLINE_FN
            payload = wire.dump_inline(fn, args, kwargs)
        else:
            raise TypeError(f"submit() needs a callable, got {type(fn).__name__} {fn!r}")
        task = _Task(fut, wire.encode_task(fut.task_id, fn_id, flags, payload), retries, timeout, fn)
        with self.lock:
            if fut._state == _CANCELLED:
                return
            self.tasks[fut.task_id] = task
            self._dispatch(task)

    def _submit_later(self, fut, fn, args, kwargs, retries, timeout) -> None:
        """Hold a task until the futures among its arguments are done, then send it."""
        deps = []
        _collect_futures((args, kwargs), deps)
        remaining = [len(deps)]
        lock = threading.Lock()

        def on_dep_done(_dep):
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            if fut.done():
                return
            for d in deps:
                if d.cancelled():
                    fut.set_exception(cf.CancelledError(f"a dependency of task {fut.task_id:#x} was cancelled"))
                    return
                if d.exception() is not None:
                    fut.set_exception(d.exception())
                    return
            try:
                self._submit_now(fut, fn, resolve_futures(args), resolve_futures(kwargs), retries, timeout)
            except Exception as exc:
                fut.set_exception(exc)

        for d in deps:
            d.add_done_callback(on_dep_done)

    def _fn_id(self, fn) -> int:
        entry = self.fn_ids.get(id(fn))
        if entry is not None:
            return entry[0]
        blob = wire.dump_function(fn)
        with self.lock:
            entry = self.fn_ids.get(id(fn))
            if entry is not None:
                return entry[0]
            fn_id = len(self.fn_ids) + 1
            msg = wire.encode_define(fn_id, blob)
            self.defines.append(msg)
            for ep in self.endpoints:
                self._send(ep, msg, wake=False)
            self.fn_ids[id(fn)] = (fn_id, fn)
        return fn_id

    def function_of(self, fn_id: int):
        """The function sent to the workers under ``fn_id`` (None if unknown)."""
        for fid, fn in list(self.fn_ids.values()):
            if fid == fn_id:
                return fn
        return None

    def _send(self, ep: int, msg: bytes, wake: bool = True) -> None:
        """Send to a worker (lock held).  What does not fit waits in the outbox; the pump
        flushes it, so the pump must not sleep through it: ring its doorbell."""
        box = self.out[ep]
        box.send(msg, wake)
        if box.pending:
            self.doorbell.ring()

    def _dispatch(self, task: _Task) -> None:
        """Send a task to a worker (lock held)."""
        if task.placed:
            self.placement.finished(task.placed - 1)
        w = self.placement.choose()
        self.placement.submitted(w)
        ep = w + 1
        task.placed = task.where = ep
        self._send(ep, task.msg)

    def _cancel(self, fut: Future) -> None:
        with self.lock:
            task = self.tasks.pop(fut.task_id, None)
            if task is None:
                return
            if task.placed:
                self.placement.finished(task.placed - 1)
            if task.where and not self.closed:
                self._send(task.where, wire.encode_control(Kind.CANCEL, [fut.task_id]))
                # it may have been stolen meanwhile: a MOVED on its way is forwarded the cancel
                self.recently_cancelled[fut.task_id] = None
                if len(self.recently_cancelled) > 4096:
                    self.recently_cancelled.pop(next(iter(self.recently_cancelled)))

    def _fail_or_retry(self, tid: int, task: _Task, exc: BaseException) -> None:
        if task.retries > 0 and not self.closing:
            task.retries -= 1
            with self.lock:
                if tid in self.tasks:
                    self._dispatch(task)
                    return
        with self.lock:
            self.tasks.pop(tid, None)
            if task.placed:
                self.placement.finished(task.placed - 1)
                task.placed = 0
        _settle(task.future, False, exc)

    # -- the pump thread ---------------------------------------------------------------

    def _pump(self) -> None:
        idle = 0
        while True:
            got = self._drain_inboxes()
            if self.deadlines:
                self._check_deadlines()
            if any(box.pending for box in self.out.values()):
                with self.lock:
                    for box in self.out.values():
                        box.flush()
            if got:
                idle = 0
                continue
            if self.closed:
                return
            idle += 1
            if idle < _SPIN:
                continue
            timeout = None
            if self.deadlines:
                timeout = max(0.0, self.deadlines[0][0] - time.monotonic())
            if any(box.pending for box in self.out.values()):
                timeout = 0.001
            fds = list(self.pidfds.values())
            woke = self.doorbell.park(self._readable, timeout, fds)
            for fd in woke:
                for ep, pidfd in list(self.pidfds.items()):
                    if pidfd == fd:
                        self._on_death(ep)

    def _readable(self) -> bool:
        if self.closed:
            return True
        for _, box in self.inboxes:
            if box.ring.readable():
                return True
        return False

    def _drain_inboxes(self) -> bool:
        got = False
        for ep, box in self.inboxes:
            if box.ring.readable():
                msgs = box.receive(256)
                if not msgs:
                    continue
                got = True
                self.messages_in += len(msgs)
                results = []
                for m in msgs:
                    if m[0] == Kind.RESULT:
                        results.append(wire.decode_result(m))
                    else:
                        self._handle(ep, m)
                if results:
                    self._on_results(results)
        return got

    def _on_results(self, results: list) -> None:
        """Finish the futures of a batch of results: one lock round for the batch."""
        settle, retry = [], []
        tasks, finished = self.tasks, self.placement.finished
        with self.lock:
            for tid, ok, value in results:
                task = tasks.get(tid)
                if task is None:
                    continue  # cancelled, or a duplicate after a re-run
                if not ok and task.retries > 0:
                    retry.append((tid, task, value))
                    continue
                del tasks[tid]
                if task.placed:
                    finished(task.placed - 1)
                settle.append((task.future, ok, value))
        for fut, ok, value in settle:
            _settle(fut, ok, value)
        for tid, task, value in retry:
            self._fail_or_retry(tid, task, value)

    def _handle(self, ep: int, msg: bytes) -> None:
        kind = msg[0]
        if kind == Kind.MOVED:
            thief, gen, ids = wire.decode_control(msg)
            with self.lock:
                for tid in ids:
                    task = self.tasks.get(tid)
                    if task is None and tid in self.recently_cancelled:
                        self._send(thief, wire.encode_control(Kind.CANCEL, [tid]))
                    if task is not None:
                        task.where = thief
                        if self.generation[thief] != gen:
                            self._dispatch(task)  # the thief died since: send it elsewhere
        elif kind == Kind.STARTED:
            tid, where = wire.decode_control(msg)
            task = self.tasks.get(tid)
            if task is not None and task.timeout is not None:
                task.where = where
                heapq.heappush(self.deadlines, (time.monotonic() + task.timeout, tid, where))
        elif kind == Kind.STATS:
            reply = wire.decode_control(msg)
            reply["at"] = time.time()
            with self.stats_cond:
                self.stats_replies[ep] = reply
                self.latest_stats[ep] = reply
                self.stats_cond.notify_all()
        elif kind == Kind.LOOT:
            victim, msgs = wire.decode_control(msg)
            with self.loot_cond:
                waited = victim in self.loot_wait
                if waited:
                    self.loot_wait.discard(victim)
                    self.loot.extend(msgs)
                    self.loot_cond.notify_all()
            if msgs and not waited:  # an answer after export() gave up: run it here
                self.give_back(msgs)

    # -- lending spawned work to another machine (the dask backend's balancer) -----------

    def export(self, timeout: float = 1.0) -> list[bytes]:
        """Steal spawned tasks as endpoint 0: every worker gives half its deque (spawned
        tasks only, oldest first: the biggest subtrees).  Returns their TASK messages,
        now lent to endpoint 0: ``deliver`` each one's result, or ``give_back`` the
        message; their owners wait for them.  Any thread; one export at a time."""
        with self.export_lock:
            with self.lock:
                if self.closing:
                    return []
                with self.loot_cond:
                    self.loot, self.loot_wait = [], set(self.endpoints)
                for ep in self.endpoints:
                    self._send(ep, wire.encode_control(Kind.STEAL, [0, 0]))
                    pid = self.matrix.status(ep)[STATUS_PID]
                    if pid and not self.out[ep].doorbell.sleeping:
                        try:
                            os.kill(pid, POKE)  # deep in a task: answer from the signal handler
                        except OSError:
                            pass
            deadline = time.monotonic() + timeout
            with self.loot_cond:
                while self.loot_wait and deadline > time.monotonic():
                    self.loot_cond.wait(deadline - time.monotonic())
                got, self.loot, self.loot_wait = self.loot, [], set()
            return got

    def hungry(self) -> int:
        """Workers that found nothing to steal and wait for work (status words; any thread)."""
        return sum(1 for ep in self.endpoints if self.matrix.status(ep)[STATUS_HUNGRY])

    def give_back(self, msgs: list[bytes]) -> None:
        """Run exported TASK messages here after all (any worker; results go to owners)."""
        with self.lock:
            if self.closing:
                return
            for m in msgs:
                self._send(self.placement.choose() + 1, m)

    def deliver(self, task_id: int, ok: bool, value) -> None:
        """The result of an exported task, from another machine: to the task's owner."""
        msg = wire.encode_result(task_id, value) if ok else wire.encode_error(task_id, value)
        with self.lock:
            if not self.closing and (task_id >> wire.OWNER_SHIFT) in self.out:
                self._send(task_id >> wire.OWNER_SHIFT, msg)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, tid, ep = heapq.heappop(self.deadlines)
            task = self.tasks.get(tid)
            if task is None or task.where != ep or ep in self.timed_out:
                continue
            self.timed_out[ep] = tid
            try:
                self.procs[ep].send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- introspection and shutdown ----------------------------------------------------

    def stats(self, timeout: float = 2.0) -> dict:
        with self.stats_cond:
            self.stats_replies.clear()
        with self.lock:
            for ep in self.endpoints:
                self._send(ep, wire.encode_control(Kind.STATS, []))
        deadline = time.monotonic() + timeout
        with self.stats_cond:
            while len(self.stats_replies) < self.n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.stats_cond.wait(left)
            workers = [self.stats_replies.get(ep, {"worker": ep, "unresponsive": True}) for ep in self.endpoints]
        return {
            "backend": self.kind,
            "workers": workers,
            "driver": {
                "outstanding": len(self.tasks),
                "worker_deaths": self.deaths,
                "messages_in": self.messages_in,
                "messages_out": sum(box.sent for box in self.out.values()),
            },
        }

    def monitor(self) -> dict:
        """A monitor's sample that never waits (the dashboard's, once a second; any thread).

        Asks every worker for fresh counters (one STATS message each: answered between
        tasks, so a worker deep in a long task answers after it) and returns the
        latest answers so far, each with ``at`` (epoch seconds), plus what the
        driver sees without asking: each worker's pid and state from its status
        words (``running``: driver tasks on its stack; ``hungry``: asked every
        victim in vain; ``parked``: asleep on its doorbell).
        """
        with self.lock:
            if self.closing:
                return {"backend": self.kind, "workers": [], "closing": True}
            for ep in self.endpoints:
                self._send(ep, wire.encode_control(Kind.STATS, []))
            rows = []
            for ep in self.endpoints:
                status = self.matrix.status(ep)
                box = self.out.get(ep)
                proc = self.procs.get(ep)
                rows.append({
                    "worker": ep, "pid": proc.pid if proc is not None else 0,
                    "cpu": self.slots[ep - 1][0], "node": self.node_of[ep - 1],
                    "generation": self.generation[ep], "running": status[STATUS_DEPTH],
                    "hungry": bool(status[STATUS_HUNGRY]),
                    "parked": bool(box is not None and box.doorbell.sleeping),
                })
        with self.stats_cond:
            for row in rows:
                row["stats"] = self.latest_stats.get(row["worker"])
        return {"backend": self.kind, "workers": rows,
                "driver": {"outstanding": len(self.tasks), "worker_deaths": self.deaths,
                           "messages_in": self.messages_in,
                           "messages_out": sum(box.sent for box in self.out.values())}}

    def close(self, cancel_pending: bool = False) -> None:
        if self.closed:
            return
        self.closing = True
        if cancel_pending:
            for task in list(self.tasks.values()):
                task.future.cancel()
        else:
            cf.wait([t.future for t in list(self.tasks.values())])
        with self.lock:
            for ep in self.endpoints:
                self._send(ep, wire.encode_control(Kind.SHUTDOWN, []))
        deadline = time.monotonic() + 5.0
        for proc in self.procs.values():
            try:
                proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.closed = True
        self.doorbell.ring()  # the pump may be parked with nothing to read
        self.pump_thread.join(5.0)
        for task in list(self.tasks.values()):
            _settle(task.future, False, PilotClosed("the pilot closed before this task finished"))
        self.tasks.clear()
        if self.trace_path:
            tracing.merge(self.trace_path, list(self.endpoints))
        self._teardown()

    def _teardown(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for fd in self.pidfds.values():
            os.close(fd)
        self.pidfds.clear()
        for fd in (self.lifeline_r, self.lifeline_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.inboxes = []
        self.out = {}
        self.matrix.close()


def _check_options(retries, timeout) -> None:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got retries={retries!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0, got timeout={timeout!r}")


def _any_future(values) -> bool:
    for v in values:
        if type(v) not in _ATOMIC and has_futures(v):
            return True
    return False


def _settle(fut: Future, ok: bool, value) -> None:
    try:
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
    except cf.InvalidStateError:
        pass  # cancelled meanwhile


def _collect_futures(obj, out: list, depth: int = 0) -> None:
    if isinstance(obj, Future):
        out.append(obj)
    elif depth < 5 and type(obj) in (list, tuple):
        for x in obj:
            _collect_futures(x, out, depth + 1)
    elif depth < 5 and type(obj) is dict:
        for x in obj.values():
            _collect_futures(x, out, depth + 1)


def _package_root() -> str:
    """The directory holding the ``shoal`` package, so workers import the same code."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
