"""The embedded local backend: worker processes on this machine, rings in shared memory.

Processes and threads::

    user threads ──submit──►  [driver→worker rings]  ──►  worker 1..N  (shoal.runtime.worker)
         ▲                                                   │  ▲  peer rings: steals, loot,
         │ futures set by                                    │  │  results of lent tasks
         └──── pump thread ◄── [worker→driver rings] ◄───────┘  ▼

``LocalBackend`` is this package's one public class.  It composes two kinds of parts.

Components: objects with private state, used through their methods only (an ast test,
tests/backends/test_local_components.py, fails on any other module touching their
state), each with its own lock or a documented single-thread ownership:

* ``processes.py`` — ``Processes``: the worker processes (start, generation per
  endpoint, reaping a death, signals, the lifeline pipe); changed by one thread at a
  time (the pump's death handling, the constructor, ``close``), read by any;
* ``timers.py`` — ``Deadlines`` (``timeout=``: deadlines from STARTED, the overrun
  kills) and ``Retries`` (``retry_delay=``: policies, retries waiting out their delay),
  each under its own leaf lock;
* ``replies.py`` — ``Replies``: the workers' STATS replies and ``export()``'s loot,
  under two leaf conditions;
* ``recent.py`` — ``RecentlyCancelled``: the ids a late MOVED must be answered for
  with a CANCEL (bounded; under ``lock``);
* ``locks.py`` — the ranks every lock is made with, and the test-time order check.

Concept modules: mixins over the backend's remaining state (the attributes
``__init__`` sets here: the task table and the rings), one per concept:

* ``submit.py`` — ``submit`` (any user thread): register the task, pick a worker with
  the pure ``Placement`` policy, push it (or stage it and push 32 at a time).
* ``cancel.py`` — ``cancel()``'s contract (True only if the task will never run), the
  status-slot handshake with the workers, force cancel, ``cancel_pending``.
* ``pump.py`` — the pump thread, the only consumer of the worker→driver rings: settles
  futures in bulk, follows steals (``MOVED``), enforces timeouts, fails or retries.
* ``lifecycle.py`` — a worker's death and replacement, quarantine of functions that
  kill workers, ``close``, and the at-fork rule for the driver.
* ``stopped.py`` — workers the health check sees stopped (SIGSTOP, a debugger): no new
  task is placed on them, and the tasks queued to them are taken back (``cancel()``'s
  handshake) and re-placed on live workers under a new id.

Their shared state is one thing: the driver's task table (``tasks``, ``staged``,
``waiting``, the placement load, each task's ``placed``/``where``/``queued``) together
with the producer side of the driver→worker rings, all under ``lock``.  Every one of
the concepts changes it, in one critical section with the ring it sends on (a
cancel's handshake, a death's re-placing, a MOVED's forwarding): split across
objects, each of those sections would span two of them and their locks.

This module keeps the constructor (every shared attribute, documented where it is
made) and the small public surface no other concept owns: ``map``, the dask
balancer's ``export``/``give_back``/``deliver``, ``stats`` and ``monitor``.

Locks, lowest rank first (locks.py; a thread takes locks of rising rank only, checked
in tests by ``locks.checking()``): ``close_lock``, ``export_lock``, ``consume_lock``
(the worker→driver rings: the pump, or a ``cancel()`` draining them; re-entrant),
``lock`` (the producer side of the driver's rings and the task table), then the
components' leaf locks; ``Future._lock`` after all of them (settling under ``lock``,
see pump.py).

Failure rules: a worker's status cell lists the driver tasks it was running;
when it dies those fail with ``WorkerLost`` (``TaskTimeout`` for the one that
overran) unless ``retries`` remain, and every other task it held is
re-placed through the cancel handshake (stopped.py ``_re_place``), never run twice.  A stopped worker keeps only what it runs (stopped.py).
A result that arrives twice (a re-run) is delivered once.

Rejected: multiprocessing's Process (spawn re-imports ``__main__``; fork is
unsafe with threads); a result-collecting thread per worker (GIL churn); a
named shared-memory segment (leaks on SIGKILL); one 1,200-line module (the
concepts above were interleaved, and so were their invariants); separate
mixins for everything (what the components replace: every attribute over one
``self``, many read in modules that never set them, the lock order only in prose);
the task table split into per-concept objects as well (see above: its critical
sections cross the concepts; the hot paths would also pay an attribute hop per
task); a lock of its own for ``RecentlyCancelled`` (each caller holds ``lock``
already, in the section that also sends the CANCEL).
"""

from __future__ import annotations

import itertools
import os
import random
import threading

from ...queues import RingMatrix
from ...runtime import wire
from ...runtime.functions import FunctionTable
from ...runtime.future import Future
from ...runtime.health import Health, proc_state
from ...runtime.mailbox import Inbox, Outbox
from ...runtime.mapping import map_iter
from ...runtime.policy import Placement
from ...runtime.shared import LocalShared
from ...runtime.topology import topology as get_topology
from ...runtime.wire import Kind
from ...runtime.worker import POKE, STATUS_DEPTH, STATUS_HUNGRY, STATUS_PID
from . import locks
from .cancel import Cancelling
from .lifecycle import Lifecycle, _live
from .processes import Processes
from .pump import _LIVENESS_S, Pumping
from .recent import RecentlyCancelled
from .replies import Replies
from .stopped import TakingBack
from .submit import _NO_RESOURCES, Submitting, _Task
from .timers import Deadlines, Retries

# Share of every driver->worker ring that tasks leave free for cancel()'s CANCEL_IF_QUEUED,
# which must be in the ring (not behind a backlog in the outbox) before the slots are read:
# a quarter (256 KiB by default: ~16,000 cancels of tasks already in the ring of a worker
# that does not read, e.g. one still starting; the rest holds thousands of tasks).
_CANCEL_RESERVE = 4

# A map batch's pickled input stays under this share of a ring's record limit (256 KiB by
# default): it travels as one record, not as fragments the worker reassembles, and its
# results (often as big as its input) come back as one too.  Batches of 10^6 tiny items
# or of 2 KB strings ran markedly slower when they were fragmented (benchmarks/run.py,
# map_defaults; figures in docs/benchmarks.md, "Measurements behind design choices").
MAP_RECORD_SHARE = 2


class LocalBackend(Submitting, Cancelling, Pumping, Lifecycle, TakingBack):
    """Worker processes on this machine, connected by shared-memory rings."""

    kind = "local"

    def cancel_many(self, futs: list[Future]) -> list[bool]:
        """``Backend.cancel_many``: each future's own ``cancel()`` (no round trip to share)."""
        return [f.cancel() for f in futs]

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
        # the producer side of the driver rings and the task table (locks.py: the order)
        self.lock = locks.make("lock", locks.Rank.TABLE)
        # the consumer side of the worker rings: the pump, or a cancel() draining to its marks
        self.consume_lock = locks.make("consume_lock", locks.Rank.CONSUME, reentrant=True)
        self.deferred_callbacks: list | None = None  # pump.py _run_callbacks (consume_lock held)
        self.out = {ep: Outbox(self.matrix.ring(0, ep), self.matrix.doorbell(ep),
                                  self.matrix.ring(0, ep).capacity // _CANCEL_RESERVE)
                    for ep in self.endpoints}
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
        self.deadlines = Deadlines()  # timeout=: from STARTED; the overrun kills (timers.py)
        self.retries = Retries()  # retry_delay=: policies, retries waiting (timers.py)
        self.replies = Replies()  # STATS replies and export()'s loot (replies.py)
        self.recently_cancelled = RecentlyCancelled()  # a MOVED of one gets a CANCEL (recent.py)
        self.export_lock = locks.make("export_lock", locks.Rank.EXPORT)  # one export() at a time
        self.shared = LocalShared(workers + 1)  # SharedFactory: one memfd per object
        self.closing = False
        self.closed = False
        self.close_lock = locks.make("close_lock", locks.Rank.CLOSE)
        self.pid = os.getpid()  # the process that owns the rings (a fork may not use them)
        self.forked = False
        self.health = Health(_LIVENESS_S)  # down endpoints (restart backoff), stopped workers
        self.down = self.health.down  # endpoint without a process -> Down
        self.pump_errors = 0
        self.cancels_refused = 0  # cancel() said False: a worker's ring had no room for it
        self.taken_back = 0  # tasks taken back from stopped workers and re-placed (stopped.py)
        # tasks whose holder died, to re-place through the handshake (stopped.py _re_place)
        self.orphans: list[_Task] = []
        self.messages_in = 0
        # the worker processes: start, generations, reaping, signals (processes.py)
        self.processes = Processes(self.endpoints, self.matrix, self.topology, self.slots, seed,
                                   self.trace_path, self.max_tasks)
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
    def procs(self):
        """Endpoint -> its worker process now (a read-only view; processes.py owns it)."""
        return self.processes.procs()

    @property
    def generation(self):
        """Endpoint -> its current generation (a read-only view; processes.py owns it)."""
        return self.processes.generations()

    @property
    def lifeline_w(self) -> int:
        """The lifeline pipe's write end (-1 once closed; processes.py owns it)."""
        return self.processes.lifeline_w()

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
                        window_bytes=window_bytes, submit=submit, catch=not retries,
                        record_bytes=self.matrix.ring(0, 1).max_message // MAP_RECORD_SHARE)

    def export(self, timeout: float = 1.0) -> list[bytes]:
        """Steal spawned tasks as endpoint 0: every worker gives half its deque (spawned
        tasks only, oldest first: the biggest subtrees).  Returns their TASK messages,
        now lent to endpoint 0: ``deliver`` each one's result, or ``give_back`` the
        message; their owners wait for them.  Any thread; one export at a time."""
        with self.export_lock:
            with self.lock:
                if self.closing:
                    return []
                self.replies.expect_loot(self.endpoints)
                for ep in self.endpoints:
                    self._send(ep, wire.encode_control(Kind.STEAL, [0, 0]))
                    pid = self.matrix.status(ep)[STATUS_PID]
                    if pid and not self.out[ep].doorbell.sleeping:
                        try:
                            os.kill(pid, POKE)  # deep in a task: answer from the signal handler
                        except OSError:
                            pass
            return self.replies.collect_loot(timeout)

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

    def stats(self, timeout: float = 2.0) -> dict:
        self.replies.ask_stats()
        with self.lock:
            for ep in self.endpoints:
                self._send(ep, wire.encode_control(Kind.STATS, []))
        replies = self.replies.wait_stats(self.n, timeout)
        workers = [replies.get(ep) or self._silent(ep) for ep in self.endpoints]
        return {
            "backend": self.kind,
            "workers": workers,
            "driver": {
                "outstanding": len(self.tasks),
                "worker_deaths": self.processes.deaths(),
                "waiting_for_inputs": len(self.waiting),
                "restart_failures": self.health.restart_failures,
                "workers_down": sorted(self.down),
                "workers_stopped": sorted(self.health.stopped),
                "pump_errors": self.pump_errors,
                "cancels_refused": self.cancels_refused,
                "taken_back": self.taken_back,
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
                rows.append({
                    "worker": ep, "pid": self.processes.pid(ep),
                    "cpu": self.slots[ep - 1][0], "node": self.node_of[ep - 1],
                    "generation": self.processes.generation(ep), "running": status[STATUS_DEPTH],
                    "hungry": bool(status[STATUS_HUNGRY]),
                    "parked": bool(box is not None and box.doorbell.sleeping),
                    "down": ep in self.down, "stopped": ep in self.health.stopped,
                })
        latest = self.replies.latest(self.endpoints)
        for row in rows:
            row["stats"] = latest[row["worker"]]
        return {"backend": self.kind, "workers": rows, "dashboard_link": None,
                "driver": {"outstanding": len(self.tasks), "worker_deaths": self.processes.deaths(),
                           "messages_in": self.messages_in,
                           "messages_out": sum(box.sent for box in self.out.values())}}

    def _silent(self, ep: int) -> dict:
        """A worker's stats entry when it did not answer: why, as far as the driver knows."""
        out = {"worker": ep, "unresponsive": True}
        if ep in self.down:
            out["state"] = "down"
            out["restart_error"] = self.down[ep].why
        else:
            proc = self.processes.proc(ep)
            state = proc_state(proc.pid) if proc is not None else None
            out["pid"] = proc.pid if proc is not None else None
            out["state"] = "stopped" if state in ("T", "t") else "busy"
        return out
