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
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import types
import weakref

from .._errors import (
    BrokenPilot,
    PilotClosed,
    RemoteTraceback,
    SerializationError,
    TaskTimeout,
    WorkerLost,
)
from ..queues import RingMatrix
from ..queues.ring import Ring
from ..runtime import context, graph, wire
from ..runtime import trace as tracing
from ..runtime.api import check_options as _check_options
from ..runtime.api import settle as _settle
from ..runtime.functions import FunctionTable
from ..runtime.future import Future, abandon, delivering_thread, run_callbacks, settle_many
from ..runtime.health import Change, Health, proc_state
from ..runtime.mailbox import Inbox, Outbox
from ..runtime.mapping import map_iter
from ..runtime.policy import Placement
from ..runtime.shared import LocalShared
from ..runtime.topology import topology as get_topology
from ..runtime.wire import Kind
from ..runtime.worker import (
    POKE,
    STATUS_DEPTH,
    STATUS_HUNGRY,
    STATUS_LOADING,
    STATUS_PID,
    STATUS_RUNNING,
    STATUS_SLOTS,
)

_CACHEABLE = (types.FunctionType, types.BuiltinFunctionType)
_ATOMIC = graph.ATOMIC
_LOG = logging.getLogger("concurrent.futures")  # where executors report failed initializers
_CANCELLED = "CANCELLED"
_PENDING = "PENDING"
_SPIN = 3  # empty pump rounds before parking (spinning would hold the GIL that submit needs)
_LIVENESS_S = 2.0  # with work outstanding, the pump checks this often for stopped workers
_NO_RESOURCES = ("resources={!r}: the local backend has no worker resources to reserve (they are "
                 "dask worker resources: backend='dask'); on one machine, give the task its CPUs "
                 "with workers= and its devices through the environment (CUDA_VISIBLE_DEVICES)")
# Submit batching: once every worker has _STAGE_LOAD tasks outstanding, new tasks wait in
# ``staged`` and go out _BATCH at a time (one placement decision, one doorbell); below
# that load each task is pushed at once, so a lone submit never waits.
_BATCH = 32
_STAGE_LOAD = 64
_RESULT = wire.RESULT
_OK_STATUS = int(wire.Status.OK)
_unpack_result = wire.RESULT_HDR.unpack_from
_pack_task = wire.TASK_HDR.pack
_TASK = wire.TASK
_dumps = wire.pickle.dumps
_loads = wire.pickle.loads
_log = logging.getLogger("shoal.runtime")
_live: weakref.WeakSet = weakref.WeakSet()  # this process's backends (for fork detection)


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
        initializer=None,
        initargs: tuple = (),
        max_tasks_per_child: int | None = None,
        start_timeout: float = 60.0,
    ):
        self.topology = get_topology(spec=topology)
        if workers is None:
            workers = len(self.topology.usable_cpus)
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise TypeError(f"workers must be an int or None, got {workers!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got workers={workers}")
        self.n = workers
        if max_tasks_per_child is not None and (isinstance(max_tasks_per_child, bool) or not isinstance(
                max_tasks_per_child, int) or max_tasks_per_child < 1):
            raise ValueError(f"max_tasks_per_child must be an int >= 1 or None, got {max_tasks_per_child!r}")
        self.max_tasks = max_tasks_per_child
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, got {initializer!r}")
        self.init_msg = wire.encode_init(initializer, initargs) if initializer is not None else None
        self.start_timeout = start_timeout
        self.broken: str | None = None  # why the pilot takes no work (a failed initializer)
        self.forced: dict[int, int] = {}  # endpoint killed by cancel(force=True) -> task id
        self.trace_path = os.path.abspath(trace) if trace else None
        self.seed = seed
        self.slots = self.topology.worker_slots(workers)
        self.node_of = [node for _, node in self.slots]
        self.placement = Placement(self.node_of, random.Random(seed))
        self.matrix = RingMatrix(workers + 1, ring_capacity, peer_capacity)
        self.lock = threading.Lock()  # driver threads on the producer side of driver rings
        self.consume_lock = threading.RLock()  # the consumer side: the pump, or a cancel()
        self.out = {ep: Outbox(self.matrix.ring(0, ep), self.matrix.doorbell(ep)) for ep in self.endpoints}
        self.inboxes = [(ep, Inbox(self.matrix.ring(ep, 0))) for ep in self.endpoints]
        self.doorbell = self.matrix.doorbell(0)
        self._cancel_cb = self._cancel
        self._probe_cb = self._probe
        self.tasks: dict[int, _Task] = {}
        self.staged: list[_Task] = []  # submitted, not yet pushed (see _BATCH); lock held
        self.waiting: dict[int, Future] = {}  # submitted, waiting for their dependencies
        self.ids = itertools.count(1)
        self.functions = FunctionTable()  # what the workers know (bounded), what is quarantined
        self.fn_ids = self.functions.ids  # id(fn) -> (fn id, fn): read on the hot path
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
        self.shared = LocalShared(workers + 1)  # SharedFactory: one memfd per object
        self.closing = False
        self.closed = False
        self.close_lock = threading.Lock()
        self.pid = os.getpid()  # the process that owns the rings (a fork may not use them)
        self.forked = False
        self.health = Health(_LIVENESS_S)  # down endpoints (restart backoff), stopped workers
        self.down = self.health.down  # endpoint without a process -> Down
        self.pump_errors = 0
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
        _live.add(self)

    @property
    def endpoints(self) -> range:
        return range(1, self.n + 1)

    @property
    def nodes(self) -> int:
        """One machine."""
        return 1

    def map(self, fn, iterables, *, ordered: bool = True, chunksize: int | None = None,
            timeout: float | None = None, window_bytes: int | None = None, retries: int = 0,
            task_timeout: float | None = None, resources=None):
        """``Pilot.map``: ``mapping.map_iter`` over ``submit`` (each batch one task)."""
        if resources is not None:
            raise ValueError(_NO_RESOURCES.format(resources))
        submit = None
        if retries or task_timeout is not None:
            def submit(runner, args, kwargs):
                return self.submit(runner, args, kwargs, retries=retries, timeout=task_timeout)

        return map_iter(self, fn, iterables, ordered=ordered, chunksize=chunksize, timeout=timeout,
                        window_bytes=window_bytes, submit=submit, catch=not retries)

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
            "max_tasks": self.max_tasks,
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
        try:
            pidfd = os.pidfd_open(proc.pid)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        self.procs[ep] = proc
        self.pidfds[ep] = pidfd
        if self.init_msg is not None:
            self._send(ep, self.init_msg, wake=False)  # first in its ring: before any task

    def _wait_started(self, timeout: float) -> None:
        """Return once every worker runs its loop (its pid is in its status cell); a
        worker that exits first (a broken interpreter, an import error) is an error."""
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while True:
            waiting = [ep for ep in self.endpoints if not self.matrix.status(ep)[STATUS_PID]]
            if not waiting:
                return
            for ep in waiting:
                code = self.procs[ep].poll()
                if code is not None:
                    raise WorkerLost(f"worker {ep} exited with code {code} while starting "
                                     f"({sys.executable} -m shoal.runtime.worker)")
            if time.monotonic() > deadline:
                raise WorkerLost(f"workers {waiting} did not start within {timeout} s")
            time.sleep(pause)
            pause = min(0.01, pause * 2)


    def _replace(self, ep: int) -> None:
        """Start a replacement on ``ep`` (lock held).  A failure (no free fds, ENOMEM, the
        pids limit) leaves ``ep`` down; the pump retries with backoff and says so."""
        try:
            self._start_worker(ep)
        except BaseException as exc:  # noqa: BLE001 - the pump thread must not die of it
            entry = self.health.start_failed(ep, repr(exc), time.monotonic())
            _log.warning("shoal: could not start a replacement for worker %d (attempt %d: %r); "
                         "its tasks go to the other workers; retrying in %.2f s",
                         ep, entry.tries, exc, entry.delay)
            return
        if self.health.started(ep):
            _log.warning("shoal: worker %d is back (pid %d)", ep, self.procs[ep].pid)
        for msg in self.functions.defines.values():
            self._send(ep, msg, wake=False)

    def _retry_down(self) -> None:
        with self.lock:
            for ep in self.health.due(time.monotonic()):
                if not self.closing:
                    self._replace(ep)

    def _on_death(self, ep: int) -> None:
        """A worker process exited: account for its tasks, tell the others, replace it."""
        with self.consume_lock:  # no cancel() drains the inbox being reset
            self._on_death_locked(ep)

    def _on_death_locked(self, ep: int) -> None:
        proc = self.procs[ep]
        proc.wait()
        os.close(self.pidfds.pop(ep))
        self.deaths += 1
        self._drain_inboxes()  # results it sent before dying are not lost
        status = self.matrix.status(ep)
        depth = status[STATUS_DEPTH]
        running = {status[STATUS_RUNNING + i] for i in range(min(depth, STATUS_SLOTS))}
        loading = status[STATUS_LOADING]
        for i in range(RingMatrix.STATUS_WORDS):
            status[i] = 0
        if loading:  # it died unpickling a function: no other worker gets that DEFINE again
            self._quarantine(loading, ep, proc)
        overran = self.timed_out.pop(ep, None)
        with self.stats_cond:
            self.latest_stats.pop(ep, None)  # a monitor shows the replacement, not the dead
        forced = self.forced.pop(ep, None)
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
            self.health.lost(ep)  # re-sent tasks go elsewhere
            broken = []
            for tid, task in list(self.tasks.items()):
                if task.placed == ep:
                    self.placement.finished(ep - 1)
                    task.placed = 0
                if task.where == ep:
                    if tid in running or tid == overran:
                        lost.append(task)
                    elif self.functions.quarantined and self.functions.is_quarantined(task.fn):
                        broken.append(task)
                    else:
                        self._dispatch(task)
            for inbox_ep, box in self.inboxes:
                if inbox_ep == ep:
                    box.reset()
            if not self.closing and self.broken is None:
                self._replace(ep)
        for task in broken:
            self._fail_or_retry(task.future.task_id, task, SerializationError(
                self.functions.quarantined[id(task.fn)][1]), retry=False)
        if self.broken is not None:
            self._fail_all(BrokenPilot(self.broken))
            return
        for task in lost:
            tid = task.future.task_id
            if tid == forced:
                continue  # cancel(force=True) settled it already
            if tid == overran:
                err = TaskTimeout(f"task {task.name} ran longer than its timeout of {task.timeout} s; "
                                  f"worker {ep} was killed and replaced")
            else:
                err = WorkerLost(f"worker {ep} (pid {proc.pid}) died with exit code {proc.returncode} "
                                 f"while running task {task.name}; a replacement was started")
            self._fail_or_retry(tid, task, err)

    def _quarantine(self, fn_id: int, ep: int, proc) -> None:
        """Function ``fn_id`` killed worker ``ep`` while being unpickled: drop its DEFINE
        (replacements would die of it too), fail its tasks, refuse new ones."""
        with self.lock:
            why = self.functions.quarantine(fn_id, lambda name: (
                f"function {name} killed worker {ep} (pid {proc.pid}, exit code "
                f"{proc.returncode}) while the worker unpickled it (importing its module?); "
                "it is quarantined: its tasks fail, the others go on"))
        if why is not None:
            _log.error("shoal: %s", why)

    # -- submitting --------------------------------------------------------------------

    def submit(self, fn, args: tuple, kwargs: dict, *, retries: int = 0, timeout: float | None = None,
               resources=None) -> Future:
        # The hot path of tiny tasks: every line here costs ~0.1 us per task.
        if self.closing:
            if self.broken is not None:
                raise BrokenPilot(self.broken)
            raise PilotClosed(self._closed_reason())
        if type(retries) is not int or retries or timeout is not None or resources is not None:
            _check_options(retries, timeout)
            if resources is not None:
                raise ValueError(_NO_RESOURCES.format(resources))
        fut = Future()
        tid = fut.task_id = next(self.ids)
        fut._canceller = self._cancel_cb  # made once: a bound method per future is GC work
        fut._prober = self._probe_cb
        entry = self.fn_ids.get(id(fn))
        if entry is not None and not kwargs and not retries and timeout is None:
            # The fast path: a function the workers know, plain positional arguments (no
            # futures among them, nothing pickle could refuse or send by reference).
            for v in args:
                if type(v) not in _ATOMIC:
                    break
            else:
                task = _Task(fut, _pack_task(_TASK, 0, entry[0], tid) + _dumps((args, kwargs), 5),
                             0, None, fn)
                with self.lock:
                    self.tasks[tid] = task
                    staged = self.staged
                    staged.append(task)
                    if len(staged) >= _BATCH or self.placement.min_load() < _STAGE_LOAD or self.down:
                        self._flush_staged()
                return fut
        if (args and graph.any_future(args)) or (kwargs and graph.any_future(kwargs.values())):
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
        flags = wire.TIMED if timeout is not None else 0
        entry = self.fn_ids.get(id(fn))
        if entry is not None:
            fn_id = entry[0]
            try:  # wire.dump_args inlined (the hot path); anything unusual goes through it
                payload = _dumps((args, kwargs), 5)
                if b"main__" in payload:
                    payload = wire.dump_args(args, kwargs, fn)
            except Exception:
                payload = wire.dump_args(args, kwargs, fn)
        elif type(fn) in _CACHEABLE and self._fn_id(fn):
            fn_id = self._fn_id(fn)
            payload = wire.dump_args(args, kwargs, fn)
        elif callable(fn):  # bound methods, partials, callable objects: their state may change
            fn_id = 0
            flags |= wire.INLINE_FN
            payload = wire.dump_inline(fn, args, kwargs)
        else:
            raise TypeError(f"submit() needs a callable, got {type(fn).__name__} {fn!r}")
        tid = fut.task_id
        task = _Task(fut, _pack_task(_TASK, flags, fn_id, tid) + payload, retries, timeout, fn)
        with self.lock:
            if fut._state == _CANCELLED:
                return
            self.tasks[tid] = task
            staged = self.staged
            staged.append(task)
            if len(staged) >= _BATCH or self.placement.min_load() < _STAGE_LOAD or self.down:
                self._flush_staged()

    def _flush_staged(self) -> None:
        """Push the staged tasks (lock held): one placement decision and one doorbell for
        the batch.  Who stages makes sure someone flushes: a task is staged only while
        every worker has ``_STAGE_LOAD`` tasks outstanding, so results are on their way
        and the pump, which flushes every round (and never parks with tasks staged),
        is awake soon; ``cancel()`` takes a staged task out first (``_probe``)."""
        staged, self.staged = self.staged, []
        live = [t for t in staged if t.future._state == _PENDING]  # cancelled ones stay here
        if not live:
            return
        if self.down:  # a worker has no process now: _dispatch finds live ones
            for task in live:
                self._dispatch(task)
            return
        w = self.placement.choose()
        self.placement.submitted(w, len(live))
        ep = w + 1
        for task in live:
            task.placed = task.where = ep
        box = self.out[ep]
        box.send_many([t.msg for t in live])
        if box.pending:
            self.doorbell.ring()

    def _submit_later(self, fut, fn, args, kwargs, retries, timeout) -> None:
        """Hold a task until the futures among its arguments are done, then send it.

        From now on the task counts as outstanding (``waiting``): ``close`` waits
        for it, ``close(cancel_pending=True)`` cancels it."""
        deps = graph.collect_futures((args, kwargs))
        with self.lock:
            self.waiting[fut.task_id] = fut

        def on_deps_done():
            with self.lock:
                self.waiting.pop(fut.task_id, None)
            if fut.done():
                return
            err = graph.failed_dependency(deps)
            if err is not None:
                _settle(fut, False, err)
                return
            try:
                self._submit_now(fut, fn, graph.resolve(args), graph.resolve(kwargs), retries, timeout)
            except BaseException as exc:  # noqa: BLE001 - the task's own failure
                _settle(fut, False, exc)

        graph.when_done(deps, on_deps_done)

    def _fn_id(self, fn) -> int:
        """The id under which the workers know ``fn``; 0: send it with the task instead
        (``shoal.runtime.functions``: bounded, lambdas on second use, quarantine)."""
        entry = self.fn_ids.get(id(fn))
        if entry is not None:
            return entry[0]
        with self.lock:
            if not self.functions.wants(fn):
                return 0
        blob = wire.dump_function(fn)
        with self.lock:
            entry = self.fn_ids.get(id(fn))
            if entry is not None:
                return entry[0]
            fn_id, msg = self.functions.define(fn, blob)
            for ep in self.endpoints:
                self._send(ep, msg, wake=False)
        return fn_id

    def function_of(self, fn_id: int):
        """The function sent to the workers under ``fn_id`` (None if unknown)."""
        return self.functions.function_of(fn_id)

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
        if self.down and w + 1 in self.down:  # no process there now: any live worker
            live = self.health.live(self.endpoints)
            if live:
                w = live[task.future.task_id % len(live)] - 1
        self.placement.submitted(w)
        ep = w + 1
        task.placed = task.where = ep
        self._send(ep, task.msg)

    def _cancel(self, fut: Future) -> None:
        with self.lock:
            if self.waiting and self.waiting.pop(fut.task_id, None) is not None:
                return  # still waiting for its inputs: nothing was sent
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

    def _running_on(self, tid: int) -> int:
        """The endpoint whose status cell says it runs driver task ``tid`` now (0: none)."""
        status = self.matrix.status
        for ep in self.endpoints:
            cell = status(ep)
            depth = cell[STATUS_DEPTH]
            for i in range(min(depth, STATUS_SLOTS)):
                if cell[STATUS_RUNNING + i] == tid:
                    return ep
        return 0

    def _run_state(self, tid: int) -> int:
        """Like ``_running_on``, but a worker that has *claimed* ``tid`` (slot written, depth
        not yet raised) is waited for: it is deciding, within microseconds, whether a
        cancel reached it first (it drops the claim) or not (it raises the depth).

        The handshake with the worker (``Worker.run_wire``) is Dekker's: the driver pushes
        CANCEL_IF_QUEUED then fences (the doorbell ring) then reads the slots; the worker
        writes its claim, fences, then rechecks its driver ring.  At least one sees the
        other, so ``cancel()`` never returns True for a task that then runs (the cancel goes
        to every worker, so also a thief that got the task before the driver heard)."""
        status = self.matrix.status
        deadline = None
        while True:
            claimed = 0
            for ep in self.endpoints:
                cell = status(ep)
                depth = cell[STATUS_DEPTH]
                for i in range(min(depth + 1, STATUS_SLOTS)):
                    if cell[STATUS_RUNNING + i] == tid:
                        if i < depth:
                            return ep
                        claimed = ep
            if not claimed:
                return 0
            now = time.monotonic()
            if deadline is None:
                deadline = now + 5.0
            elif now > deadline or self.procs[claimed].poll() is not None:
                return claimed  # stuck or dead between claim and confirm: call it started
            os.sched_yield()

    def _probe(self, fut: Future, cancel: bool = False) -> bool:
        """Whether a worker runs ``fut``'s task now; if so the future goes RUNNING
        (``Future.running()``/``cancel()`` ask: RUNNING is read from the workers'
        status cells on demand, so the hot path sends no message per start).  With
        ``cancel``, first tell the holder to drop the task unless it started."""
        tid = fut.task_id
        task = self.tasks.get(tid)
        if task is None and cancel:
            with self.lock:  # a result being settled (_on_results) is FINISHED once we get it
                task = self.tasks.get(tid)
        if self.closed or task is None:
            return False
        if cancel and not task.where:
            with self.lock:
                if not task.where:  # staged, not pushed: take it out, so it never is
                    try:
                        self.staged.remove(task)
                    except ValueError:
                        pass
                    return False
        if cancel and task.where:
            # To every worker: a thief may hold the task before the driver hears of the steal.
            # (With retries left, only to its holder: a re-run after a refused cancel must not
            # meet a stale cancel elsewhere; there a steal in flight can still race.)
            msg = wire.encode_control(Kind.CANCEL_IF_QUEUED, [tid])
            with self.lock:
                if not self.closed:
                    for ep in (self.endpoints if not task.retries else (task.where,)):
                        self._send(ep, msg)
        if not self._run_state(tid):
            if cancel:
                # Not running: not started, or finished with its result still in a ring
                # (a worker clears its status only after sending the result).  Drain the
                # rings: a finished task's future is then FINISHED and cancel() says False.
                self._drain_inboxes()
                return fut._state != "PENDING"
            return False
        fut.set_running_or_notify_cancel()
        return True

    def force_cancel(self, fut: Future) -> bool:
        """Cancel ``fut`` even while it runs: kill and replace the worker running it."""
        if fut.cancel():
            return True
        with self.lock:
            task = self.tasks.get(fut.task_id)
            ep = self._running_on(fut.task_id) if task is not None else 0
            if not ep or self.closed:
                return False
            del self.tasks[fut.task_id]
            if task.placed:
                self.placement.finished(task.placed - 1)
                task.placed = 0
            self.forced[ep] = fut.task_id
        _force_cancelled(fut)  # outside the lock: its done callbacks may submit
        try:
            self.procs[ep].send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    def cancel_children(self, fut: Future) -> None:
        """A running task's spawned children that have not started are dropped (it runs on)."""
        ep = self._running_on(fut.task_id)
        if ep:
            with self.lock:
                if not self.closed:
                    self._send(ep, wire.encode_control(Kind.CANCEL, [fut.task_id]))

    def cancel_pending(self) -> int:
        """Cancel every task no worker has started (``shutdown(cancel_futures=True)``).

        Workers start in the background (the constructor does not wait); so that
        "not started" does not just mean "submitted before the workers were up", this
        first waits (bounded) until they run and each one holding work has begun a
        task, as a process pool's first tasks are already under way by then."""
        try:
            self._wait_started(self.start_timeout)
        except WorkerLost:
            pass
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            idle = [ep for ep in self.endpoints
                    if self.placement.load(ep - 1) and not self.matrix.status(ep)[STATUS_DEPTH]]
            if not idle:
                break
            time.sleep(0.001)
        with self.lock:
            futs = list(self.waiting.values()) + [t.future for t in self.tasks.values()]
        return sum(1 for fut in futs if fut.cancel())

    def _fail_all(self, exc: BaseException) -> None:
        with self.lock:
            tasks = list(self.tasks.values())
            self.tasks.clear()
        for task in tasks:
            _settle(task.future, False, exc)

    def _on_init_failed(self, ep: int, tb: str) -> None:
        """A worker's initializer raised: log it and break the pilot (a process pool's rule)."""
        _LOG.critical("Exception in initializer of shoal worker %d:\n%s", ep, tb)
        first_line = tb.strip().splitlines()[-1] if tb.strip() else "?"
        self.broken = (f"a worker's initializer failed ({first_line}); the pilot cannot run tasks: "
                       f"create a new shoal.Pilot")
        self.closing = True
        self._fail_all(BrokenPilot(self.broken))

    def _fail_or_retry(self, tid: int, task: _Task, exc: BaseException, retry: bool = True) -> None:
        if retry and task.retries > 0 and not self.closing:
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
        """The pump thread's body: it never dies before ``close``.  Anything a round
        raises (BaseException included) is reported and the loop goes on."""
        delivering_thread(self._probe_cb)  # a done-callback here that waits on a pending future would hang
        errors = 0
        while True:
            try:
                self._pump_rounds()
                return
            except BaseException:  # noqa: BLE001 - a dead pump would hang every future
                if self.closed:
                    return
                self.pump_errors += 1
                errors += 1
                _log.exception("shoal: the pump thread hit an error; it goes on")
                time.sleep(min(1.0, 0.001 * 2 ** min(errors, 10)))

    def _pump_rounds(self) -> None:
        idle = 0
        while True:
            got = self._drain_inboxes()
            if self.staged:
                with self.lock:
                    if self.staged:
                        self._flush_staged()
            if self.deadlines:
                self._check_deadlines()
            if self.down:
                self._retry_down()
            if any(box.pending for box in self.out.values()):
                with self.lock:
                    for box in self.out.values():
                        box.flush()
            if self.tasks and self.health.check_due(time.monotonic()):
                self._check_liveness()
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
            if self.down and not self.closing:
                due = self.health.wake_in(time.monotonic())
                timeout = due if timeout is None else min(timeout, due)
            if self.tasks:
                timeout = _LIVENESS_S if timeout is None else min(timeout, _LIVENESS_S)
            if any(box.pending for box in self.out.values()):
                timeout = 0.001
            fds = list(self.pidfds.values())
            woke = self.doorbell.park(self._readable, timeout, fds)
            for fd in woke:
                for ep, pidfd in list(self.pidfds.items()):
                    if pidfd == fd:
                        self._on_death(ep)

    def _check_liveness(self) -> None:
        """Report workers that are stopped (SIGSTOP, a debugger): their tasks cannot
        progress, and without a ``timeout=`` nothing else would say why."""
        for ep, proc in list(self.procs.items()):
            change = self.health.saw(ep, proc.pid, None if ep in self.down else proc_state(proc.pid))
            if change is Change.STOPPED:
                _log.warning("shoal: worker %d (pid %d) is stopped (SIGSTOP or a debugger); its "
                             "tasks wait until it gets SIGCONT. Give tasks a timeout= to bound "
                             "them.", ep, proc.pid)
            elif change is Change.RUNS_AGAIN:
                _log.warning("shoal: worker %d (pid %d) runs again", ep, proc.pid)

    def _readable(self) -> bool:
        if self.closed:
            return True
        if self.staged:
            return True
        for _, box in self.inboxes:
            if box.ring.readable():
                return True
        return False

    def _drain_inboxes(self) -> bool:
        """Consume what the workers sent (the pump; also ``cancel()``: one at a time)."""
        with self.consume_lock:
            return self._drain_locked()

    def _drain_locked(self) -> bool:
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
                    try:
                        if m[0] == _RESULT:
                            _, status, tid = _unpack_result(m)
                            try:
                                value = _loads(m[16:] if len(m) < 4096 else memoryview(m)[16:])
                            except BaseException as exc:  # noqa: BLE001 - even SystemExit
                                results.append((tid, False, wire.result_unpickling_error(tid, status, exc)))
                                continue
                            if status == _OK_STATUS:
                                results.append((tid, True, value))
                            else:
                                exc, tb, hops = value
                                exc.__cause__ = RemoteTraceback(tb, hops)
                                results.append((tid, False, exc))
                        else:
                            self._handle(ep, m)
                    except BaseException:  # noqa: BLE001 - one bad message, not the batch
                        self.pump_errors += 1
                        _log.exception("shoal: a message from worker %d could not be handled", ep)
                if results:
                    self._on_results(results)
        return got

    def _on_results(self, results: list) -> None:
        """Finish the futures of a batch of results: one lock round and one load update per
        worker for the batch, then the futures in bulk (``settle_many``)."""
        settle, retry = [], []
        tasks = self.tasks
        done_on: dict[int, int] = {}
        with self.lock:
            for tid, ok, value in results:
                task = tasks.get(tid)
                if task is None:
                    continue  # cancelled, or a duplicate after a re-run
                if not ok and task.retries > 0:
                    retry.append((tid, task, value))
                    continue
                del tasks[tid]
                placed = task.placed
                if placed:
                    done_on[placed] = done_on.get(placed, 0) + 1
                settle.append((task.future, ok, value))
            finished = self.placement.finished
            for ep, n in done_on.items():
                finished(ep - 1, n)
            # Settled under the lock that popped them: a cancel() that finds its task gone
            # (it looks under this lock) then finds the future FINISHED; settled after the
            # release, such a cancel() said True for a task whose result was being set.
            called: list = []
            settle_many(settle, _log, called)
        run_callbacks(called, _log)
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
                task.future.set_running_or_notify_cancel()
        elif kind == Kind.INIT_FAILED:
            self._on_init_failed(*wire.decode_control(msg))
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
            workers = [self.stats_replies.get(ep) or self._silent(ep) for ep in self.endpoints]
        return {
            "backend": self.kind,
            "workers": workers,
            "driver": {
                "outstanding": len(self.tasks),
                "worker_deaths": self.deaths,
                "waiting_for_inputs": len(self.waiting),
                "restart_failures": self.health.restart_failures,
                "workers_down": sorted(self.down),
                "workers_stopped": sorted(self.health.stopped),
                "pump_errors": self.pump_errors,
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
        victim in vain; ``parked``: asleep on its doorbell) and its health
        (``down``: could not be restarted; ``stopped``: SIGSTOPped).
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
                    "down": ep in self.down, "stopped": ep in self.health.stopped,
                })
        with self.stats_cond:
            for row in rows:
                row["stats"] = self.latest_stats.get(row["worker"])
        return {"backend": self.kind, "workers": rows, "dashboard_link": None,
                "driver": {"outstanding": len(self.tasks), "worker_deaths": self.deaths,
                           "messages_in": self.messages_in,
                           "messages_out": sum(box.sent for box in self.out.values())}}

    def _silent(self, ep: int) -> dict:
        """A worker's stats entry when it did not answer: why, as far as the driver knows."""
        out = {"worker": ep, "unresponsive": True}
        if ep in self.down:
            out["state"] = "down"
            out["restart_error"] = self.down[ep].why
        else:
            proc = self.procs.get(ep)
            state = proc_state(proc.pid) if proc is not None else None
            out["pid"] = proc.pid if proc is not None else None
            out["state"] = "stopped" if state in ("T", "t") else "busy"
        return out

    def _closed_reason(self) -> str:
        if self.forked:
            return (f"this pilot belongs to process {self.pid}, and this process ({os.getpid()}) "
                    "is a fork of it: a forked process cannot use its parent's pilot (the workers "
                    "and rings are the parent's); open a new shoal.Pilot in the child")
        if context.exiting:
            return "cannot schedule new futures after interpreter shutdown"
        return "cannot schedule new futures after shutdown: submit() on a closed pilot; open a new shoal.Pilot"

    def _forked(self) -> None:
        """In the child of ``os.fork()`` (at-fork hook): never touch the parent's workers,
        rings or processes; every use raises ``PilotClosed`` saying why."""
        self.forked = True
        self.closing = self.closed = True
        for fd in [*self.pidfds.values(), self.lifeline_w]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pidfds, self.procs = {}, {}
        # The parent's outstanding futures can never settle here: fail them, so result()
        # in the child raises instead of waiting forever.  No done-callbacks (user code in
        # an at-fork hook); no thread waits on them in the child (only this one survived).
        abandon([*self.waiting.values(), *(t.future for t in self.tasks.values())],
                PilotClosed(self._closed_reason()))
        self.tasks, self.waiting, self.staged = {}, {}, []
        self.out, self.inboxes = {}, []

    def close(self, cancel_pending: bool = False) -> None:
        with self.close_lock:  # the exit handler and a collected pilot's closer may race
            self._close(cancel_pending)

    def _close(self, cancel_pending: bool) -> None:
        if self.closed:
            return
        self.closing = True
        while True:  # tasks waiting for inputs are outstanding too (they finish or cancel)
            with self.lock:
                futs = list(self.waiting.values()) + [t.future for t in self.tasks.values()]
            if not futs:
                break
            if cancel_pending:
                for f in futs:
                    f.cancel()
                break
            cf.wait(futs)
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


def _force_cancelled(fut: Future) -> None:
    """Move a RUNNING future to CANCELLED (``Future.cancel`` refuses RUNNING ones)."""
    with fut._condition:
        if fut._state not in ("PENDING", "RUNNING"):
            return
        fut._state = "CANCELLED"
        fut._condition.notify_all()
    fut._invoke_callbacks()
    fut.set_running_or_notify_cancel()  # CANCELLED -> CANCELLED_AND_NOTIFIED, tells wait()


def _after_fork_in_child() -> None:
    for backend in list(_live):
        backend._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _package_root() -> str:
    """The directory holding the ``shoal`` package, so workers import the same code."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
