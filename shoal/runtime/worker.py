"""The worker loop: private deque, help-first joins, stealing by request.

One worker process per CPU (``python -m shoal.runtime.worker SPEC``), started by
a backend with the shared ring segment and doorbells passed as inherited fds.
Endpoint 0 is the driver; workers are endpoints 1..N.  Every ordered pair of
endpoints has its own SPSC ring, so nothing here ever takes a lock.

Loop (``Worker.run``)::

    poll inboxes ─► messages: TASK (driver work, kept serialized) → deque left end,
       │            STEAL → answer with the oldest half of the deque (LOOT),
       │            RESULT of a task I lent out → finish its local future, ...
    deque non-empty? ─► pop newest, run it  (spawned children go on the right end)
    else steal ─► send STEAL to the next victim (same NUMA node first, seeded order),
       │          at most one request in flight; answers arrive as LOOT messages
    else park on the doorbell (no CPU) until a message or a busy peer's wake-up.

Invariants:
* The deque belongs to this process only; thieves never touch it.  They ask,
  and this loop answers *between tasks* (and every 32 spawns), giving the
  oldest tasks (the biggest subtrees) and keeping the newest (cache-warm).
* A spawned task stays a Python object until it is stolen; only then is it
  pickled (``_serialize``).  That is what keeps ``spawn`` + run in microseconds.
* Every task has an owner endpoint (in its id) that receives the result.  An
  owner remembers each task it lent out (a ``Loan``) until the result comes
  back; a victim that hands away somebody else's task tells that owner where
  it went (``MOVED``).  When the driver announces a dead worker (``DIED``),
  owners re-run what they had lent to it, so nothing is lost; a task may then
  run twice, but its future is finished once.  All of that bookkeeping (and
  the thief's request state and hunger word) is ``runtime/loans.py``'s
  ``LoanBook``, a pure state machine: this loop feeds it events (messages,
  steals, joins) and carries out the actions it returns (``Worker.carry``).
* ``status`` (shared memory) lists the driver tasks this worker is running
  (nested by help-first joins), so the driver knows, after a crash, which
  tasks were running (fail or retry) and which were only queued (resubmit).

Rejected: a shared deque with CAS (Chase-Lev) — needs atomics on Python
objects across processes; random stealing without locality; blocking joins
(deadlock with few workers); a thread per worker for steal answers (the GIL
would serialize it with the tasks anyway).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections import deque

from .._room import in_room
from .._tick import nudge
from ..queues import RingMatrix
from . import context, policy, wire
from .future import Future, set_local_exception, set_local_result
from .graph import has_futures, resolve
from .loans import (
    Fail,
    Hunger,
    LoanBook,
    LocalTask,
    Run,
    Scope,
    Send,
    SetHunger,
    Settle,
    Steal,
    WireTask,
    first_seq,
)
from .mailbox import Inbox, Outbox
from .trace import Tracer
from .wire import Flag, Kind

_PENDING = "PENDING"
# Status cell words (shared memory, written by the worker only, read by the driver and thieves)
STATUS_PID = 0  # the worker's pid, for SIGURG pokes
STATUS_HUNGRY = 1  # a Hunger value: is this worker idle, looking for work?
STATUS_DEPTH = 2  # how many driver tasks are running here (nested by help-first joins)
STATUS_RUNNING = 3  # their ids, innermost last, up to STATUS_SLOTS
STATUS_LOADING = RingMatrix.STATUS_WORDS - 1  # fn id of the DEFINE being unpickled (0: none)
STATUS_SLOTS = STATUS_LOADING - STATUS_RUNNING
POKE = signal.SIGURG  # ignored by default, so a stale pid can never be killed by it
_POLL_EVERY = 32  # spawns between two inbox polls inside a busy task
_WAKE_MSG = bytes((Kind.WAKE,))
_SPIN = 1000  # readable() checks (~50 ns each) before parking: saves two syscalls a message


_HUNGRY = int(Hunger.HUNGRY)

# Nesting cap (see max_nesting): a help-first join costs ~5 Python frames of the runtime
# (Future.result -> help_until -> run_task -> run_local -> the task) plus the task's own;
# 20 frames per level leaves ~15 to the user's code.
FRAMES_PER_NESTING = 20
NESTING_CEILING = 256  # more nested joins than this is a runaway chain, whatever the stack
NESTING_FLOOR = 4


def max_nesting() -> int:
    """Tasks a worker can nest in help-first joins with this process's recursion limit.

    A worker raises its limit (``_room_for_deep_joins``) so this is NESTING_CEILING there;
    under the interpreter's default limit of 1000 it is 50.
    """
    return max(NESTING_FLOOR, min(NESTING_CEILING, sys.getrecursionlimit() // FRAMES_PER_NESTING))


class Worker:
    """One worker's event loop (the worker process's main thread only)."""

    def __init__(self, spec: dict, matrix: RingMatrix):
        self.ep: int = spec["endpoint"]
        self.gen: int = spec["generation"]
        self.cpu: int = spec["cpu"]
        self.node: int = spec["node"]
        self.lifeline: int = spec["lifeline"]
        self.node_of: list[int] = spec["node_of"]  # per worker index (endpoint - 1)
        n = matrix.n
        self.matrix = matrix
        self.inboxes = [(src, Inbox(matrix.ring(src, self.ep))) for src in range(n) if src != self.ep]
        self.driver_box = self.inboxes[0][1]  # from endpoint 0
        self.out = {dst: Outbox(matrix.ring(self.ep, dst), matrix.doorbell(dst)) for dst in range(n) if dst != self.ep}
        # thief -> MOVED messages (owner, message) held back until my LOOT to that thief has
        # left its outbox (see ``carry``)
        self.behind_loot: dict[int, list] = {}
        self.doorbell = matrix.doorbell(self.ep)
        self.status = matrix.status(self.ep)
        # the status cells of this runtime's other workers (hungry_peers reads them)
        self.peer_status = [matrix.status(ep) for ep in range(1, n) if ep != self.ep]
        self.deque: deque = deque()
        self.fns: dict[int, object] = {}  # fn id -> function (from the driver's DEFINE)
        self.fn_ids: dict[int, int] = {}  # id(function) -> fn id
        self.undefined: list = []  # WireTasks waiting for a DEFINE
        self.running_scopes: dict[int, Scope] = {}
        self.any_cancel = False
        self.scope: Scope | None = None
        self.in_user = False  # True while a task's own code runs (SIGURG may then poll)
        self.poked = False  # a SIGURG came while runtime code ran: poll when the task's code resumes
        self.busy = False  # True while polling from inside a running task (signal, spawn)
        self.in_handler = False  # True while the SIGURG handler polls (on_signal)
        self.unsettled: list = []  # Settle actions met in the handler, carried out by the next poll
        self.depth = 0  # tasks on this worker's stack (nested by help-first joins)
        self._cancel_local_cb = self.cancel_local  # one bound method, not one per spawn
        self._lent_cb = self.lent_out
        self.seq = first_seq(self.gen)  # ids never repeat a dead predecessor's
        self.stop = False
        rng = random.Random(spec["seed"] * 1_000_003 + self.ep)
        order = policy.victim_order(self.ep - 1, self.node_of, rng)
        self.victims = [v + 1 for v in order]
        # the stealing protocol's state (loans, dead generations, cancels, requests)
        dead = {ep: gen - 1 for ep, gen in spec.get("generations", []) if gen}  # before I started
        # changed only through its events, read through its queries (loans.LoanBook.READABLE)
        self.book = LoanBook(self.ep, self.victims, dead)
        self.victims_tried: list[int] = []  # first victims asked, in order (for locality tests)
        self.c = dict.fromkeys(
            (
                "tasks_run", "spawned", "steal_requests_sent", "steal_requests_local",
                "steal_requests_remote", "steal_requests_answered",
                "steal_requests_failed", "stolen_local", "stolen_remote", "tasks_given",
                "steal_answers_given", "messages_in", "messages_out", "stale_loot_dropped",
                "pokes", "pokes_deferred",
            ),
            0,
        )
        self.idle_s = 0.0
        self.asked_at = 0.0  # when the steal request in flight was sent
        self.steal_wait_s = 0.0  # summed time from a steal request to its answer
        self.steal_wait_max_s = 0.0  # the longest such wait
        self.started = time.perf_counter()
        self.tracer = Tracer(self.ep) if spec.get("trace") else None
        self.retire_after = spec.get("max_tasks") or 0  # driver tasks, then exit (replaced)
        self.forked = 0  # pid of this process when it is a task's fork (see after_fork)

    # -- spawning (called from tasks through shoal.spawn) ------------------------------

    def spawn(self, fn, args: tuple, kwargs: dict) -> Future:
        in_user, self.in_user = self.in_user, False  # runtime code: no steal answers from signals
        self.seq += 1
        fut = Future.local((self.ep << wire.OWNER_SHIFT) | self.seq)
        pinned = (bool(args) and has_futures(args)) or (bool(kwargs) and has_futures(kwargs))
        fut._canceller = self._cancel_local_cb
        fut._prober = self._lent_cb
        deq = self.deque
        deq.append(LocalTask(fn, args, kwargs, fut, self.scope, pinned))
        c = self.c
        c["spawned"] += 1
        if self.book.owed:  # a thief I turned away waits: answer it now (loans.LoanBook.spawned)
            self.carry(self.book.spawned(deq, self.depth, self._serialize))
        if not c["spawned"] % _POLL_EVERY:
            self.busy = True  # answering from inside a running task
            try:
                self.poll()
            finally:
                self.busy = False
            if len(deq) > 1:
                self.wake_sleepers()
        elif len(deq) == 1:
            self.wake_sleepers()  # a task is running here and offers its first child
        self.in_user = in_user
        if self.poked and in_user:
            self.poll_in_task()  # a thief poked while spawn ran (on_signal)
        return fut

    def wake_sleepers(self) -> None:
        """Tell one hungry peer (it asked everybody in vain) that there is work here to steal."""
        status = self.matrix.status
        for dst in self.victims:
            if status(dst)[STATUS_HUNGRY] == _HUNGRY:
                self.send(dst, _WAKE_MSG)
                return

    def hungry_peers(self) -> int:
        """How many other workers of this runtime are idle right now (LOOKING or HUNGRY)."""
        n = 0
        for cell in self.peer_status:
            if cell[STATUS_HUNGRY]:
                n += 1
        return n

    max_nesting = staticmethod(max_nesting)  # for shoal.current_worker(), which imports no worker

    def carry(self, actions) -> None:
        """Carry out the loan book's actions: the only place its decisions meet I/O."""
        for act in actions:
            kind = type(act)
            if kind is Send:
                if act.kind == Kind.MOVED and (self.out[act.body[0]].pending
                                               or act.body[0] in self.behind_loot):
                    # A MOVED tells the owner the thief holds its task; while my LOOT to that
                    # thief waits in my outbox, the thief does not, and if I die the LOOT dies
                    # with me: the owner would wait on a live thief forever.  Held back, it
                    # dies with me too, and the owner re-runs its task when it hears of my
                    # death (LoanBook.died; for the driver, lifecycle.py).
                    self.behind_loot.setdefault(act.body[0], []).append(
                        (act.dst, wire.encode_control(act.kind, act.body)))
                    continue
                self.send(act.dst, wire.encode_control(act.kind, act.body))
            elif kind is SetHunger:
                self.status[STATUS_HUNGRY] = act.value
            elif kind is Settle:
                if self.in_handler:  # never inside the user's code: see on_signal
                    self.unsettled.append(act)
                else:
                    (set_local_result if act.ok else set_local_exception)(act.task.future, act.value)
            elif kind is Run:
                self.deque.append(act.task)
            elif kind is Fail:
                self.deliver(act.task_id, wire.encode_error(act.task_id, act.exc))
            elif kind is Steal:
                self.ask(act.victim)
            else:  # pragma: no cover - a new action nobody carries out
                raise TypeError(f"unknown loan-book action {act!r}")

    def lent_out(self, fut: Future, cancelling: bool = False) -> bool:
        """A spawned future's prober (``Future.cancel``/``running``): is its task out on
        loan?  A thief may run it right now, and nothing can stop it there in time, so
        ``cancel()`` says False (the task runs once and its future gets the result), as
        for a task that runs.  It used to say True and the thief ran the task anyway
        (tests/attack/test_contract_local.py's ``test_cancel_inside_tasks``, about 1 run in
        10 at load 15).  ``running()`` learns nothing from it: the state stays PENDING."""
        return self.book.is_lent(fut.task_id)

    def cancel_local(self, fut: Future) -> None:
        """A spawned future was cancelled: so are the children of its task."""
        self.any_cancel = True
        scope = getattr(fut, "_scope", None)
        if scope is not None:
            scope.cancelled = True

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        context.worker = self
        deq = self.deque
        while not self.stop:
            if self.poll():
                continue
            if deq:
                self.run_task(deq.pop())
            elif not self.steal():
                self.park()

    def help_until(self, fut: Future, timeout: float | None = None) -> None:
        """Run other tasks until ``fut`` is done (help-first join): worker thread only."""
        deadline = None if timeout is None else time.monotonic() + timeout
        deq = self.deque
        in_user, self.in_user = self.in_user, False
        looked = False  # asked for work: the hunger word may say idle (only steal() sets it)
        try:
            while not fut.done():
                if self.stop:
                    raise RuntimeError("the worker is shutting down")
                if self.poll():
                    continue
                if deq:
                    self.run_task(deq.pop())
                    continue
                looked = True
                if not self.steal():
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise TimeoutError(f"task {fut.task_id:#x} not done after {timeout} s")
                        self.park(min(left, 0.05))
                    else:
                        self.park()
        finally:
            self.in_user = in_user
            if looked and self.book.hunger:
                self.carry(self.book.fed())  # the task goes on: busy, not idle
        if self.poked and in_user:
            self.poll_in_task()  # a thief poked after the last poll of the join (on_signal)

    def on_signal(self, signum, frame) -> None:
        """A thief poked us (SIGURG) while a task runs: answer it now, not after the task.

        Runs in the main thread between two bytecodes of the task.  Only when the
        interrupted code is the user's (``in_user``) may it touch the worker's state.
        Otherwise runtime code was interrupted and the poke is remembered (``poked``):
        the next ``poll`` answers it, and the places that hand control back to a task's
        code (``run_local``, ``run_wire``, the end of ``spawn`` and of a join) poll
        first if none came.  The poke used to be dropped there: "the loop answers in a
        moment anyway" holds between tasks, but a poke that landed in a task's prelude
        (unpickling its arguments) or in ``spawn`` left the STEAL unread until the task
        spawned 32 children or ended, and the thief asleep meanwhile (its one request in
        flight; about 1 run in 12 of tests/runtime/test_worker_info.py's thief test).

        The handler answers thieves and updates the loan book, but it never settles a
        future: a result that comes home meanwhile is kept (``unsettled``) and settled by
        the next ``poll`` outside the handler -- in the loop, a join, or ``spawn``.  Settling
        runs the future's done-callbacks, and the handler interrupts the task between
        any two bytecodes, also inside the standard library's ``add_done_callback``
        between its check of the state and its append of the callback: a future settled
        there ran the callbacks it had, then got the new one appended, never to be called
        (a dask graph's walker waited forever for it: ``pilot.get`` hung in 6 runs of 9 on
        a 10,000-node chain).  Worker-local futures have no lock to make that check and
        append atomic, and a lock would not help either: the handler runs on the thread
        that holds it, so it would deadlock where the RLock of driver-made futures lets it
        in.  The same holds for the user's own locks, which a done-callback run from here
        could find held by the code it interrupted.  Rejected: a guard that every
        future's condition raises so the handler defers while it is held (it covers the
        standard library's code but not a user's lock, and it costs every future
        operation); answering only STEAL in the handler and leaving every other message
        for later (reorders each ring's messages, which the loan book's proofs assume in
        order).  Callbacks of spawned futures therefore run inside a call into the
        runtime (``spawn``, ``result``/``exception``/``done``, a join) or between tasks,
        never between two bytecodes of the user's code.
        """
        c = self.c
        c["pokes"] += 1
        nudge(frame)  # a running search loop polls at its next level entry (shoal/_tick.py)
        if self.in_user and not self.in_handler:
            self.in_handler = True
            try:
                self.poll_in_task()
            finally:
                self.in_handler = False
        else:
            c["pokes_deferred"] += 1
            self.poked = True

    def poll_in_task(self) -> None:
        """Read the inboxes from inside a running task (steal answers round up), again
        if a poke came meanwhile (it may stand for a STEAL written after the read)."""
        while True:
            self.in_user = False
            self.busy = True
            try:
                self.poll()
            finally:
                self.busy = False
                self.in_user = True
            if not self.poked:  # read after in_user: a later poke polls by itself
                return

    def park(self, timeout: float | None = None) -> None:
        """Spin briefly (a new message is often microseconds away), then sleep on the doorbell."""
        t0 = time.perf_counter()
        readable = self.readable
        woke = None
        yield_ = os.sched_yield
        for _ in range(_SPIN):
            if readable():
                break
            yield_()  # let a driver sharing this core run; no sleep, so no wake-up syscall
        else:
            if any(box.pending for box in self.out.values()):
                timeout = 0.001 if timeout is None else min(timeout, 0.001)
            woke = self.doorbell.park(readable, timeout, (self.lifeline,))
        t1 = time.perf_counter()
        self.idle_s += t1 - t0
        if self.tracer is not None:
            self.tracer.span("idle", t0, t1, cat="idle")
        if woke:
            os._exit(0)  # the driver is gone (lifeline at EOF)

    def readable(self) -> bool:
        for _, box in self.inboxes:
            if box.ring.readable():
                return True
        return False

    def poll(self) -> bool:
        self.poked = False  # whatever a poke asked for is read now
        got = False
        if self.unsettled and not self.in_handler:
            got = True
            self.settle_deferred()
        for src, box in self.inboxes:
            if box.ring.readable():
                msgs = box.receive()
                if msgs:
                    got = True
                    self.c["messages_in"] += len(msgs)
                    for m in msgs:
                        self.handle(src, m)
        for box in self.out.values():
            if box.pending:
                box.flush()
        if self.behind_loot:
            for thief in [t for t in self.behind_loot if not self.out[t].pending]:
                self.release_moved(thief)
        return got

    def release_moved(self, thief: int) -> None:
        """My LOOT to ``thief`` is in its ring now: send the MOVEDs held behind it."""
        for owner, msg in self.behind_loot.pop(thief, ()):
            self.send(owner, msg)

    def settle_deferred(self) -> None:
        """Settle the futures whose results came home while the SIGURG handler polled
        (``on_signal``), in arrival order; their done-callbacks run here."""
        todo, self.unsettled = self.unsettled, []
        for act in todo:
            (set_local_result if act.ok else set_local_exception)(act.task.future, act.value)

    def drain_driver(self) -> None:
        """Handle everything the driver has sent so far (a cancel may sit behind many tasks)."""
        box = self.driver_box
        for _ in range(10_000):
            msgs = box.receive(256)
            if not msgs:
                return
            self.c["messages_in"] += len(msgs)
            for m in msgs:
                self.handle(0, m)

    def flush_to_driver(self) -> None:
        """Wait until nothing waits in the outbox to the driver (a result that did not fit
        its ring: a big one, fragmented, or a backlog the pump has not read yet).

        A driver task's status slot must stay set until its result is in the ring: the
        driver's ``cancel()`` reads a clear slot as "not running", then drains the rings
        up to their tails of that moment; a result still waiting here would be missed and
        cancel() would say True for a task that ran.  The pump reads this ring whatever
        else happens (it never waits on a worker), so this ends; the lifeline ends the
        process if the driver dies.  Meanwhile this worker keeps reading its inboxes (no
        task runs): the driver's ring must not fill up behind it, or the driver could not
        get a cancel through to it (``LocalBackend._probe``)."""
        box = self.out[0]
        if not box.pending or box.flush():
            return
        pause = 0.0
        busy, self.busy = self.busy, True
        try:
            while not box.flush():
                if self.poll():
                    pause = 0.0
                    continue
                if pause:
                    time.sleep(pause)
                else:
                    os.sched_yield()
                pause = min(0.001, pause * 2 or 0.00002)
        finally:
            self.busy = busy

    def send(self, dst: int, msg: bytes) -> None:
        self.c["messages_out"] += 1
        self.out[dst].send(msg)

    # -- messages ----------------------------------------------------------------------

    def handle(self, src: int, msg: bytes) -> None:
        kind = msg[0]
        if kind == wire.TASK:
            _, _, tid = wire.decode_task_header(msg)
            self.deque.appendleft(WireTask(msg, tid))
            if self.book.hunger:
                self.carry(self.book.fed())
        elif kind == wire.RESULT:
            self.on_result(msg)
        elif kind == Kind.DEFINE:
            status = self.status
            status[STATUS_LOADING] = int.from_bytes(msg[1:5], "little")  # a crash here names it
            context.loading = "a task's function"
            try:
                fn_id, fn = wire.decode_define(msg)
            finally:
                context.loading = None
            status[STATUS_LOADING] = 0
            self.fns[fn_id] = fn
            self.fn_ids[id(fn)] = fn_id
            if self.undefined:
                waiting, self.undefined = self.undefined, []
                self.deque.extend(waiting)
                self.carry(self.book.fed())
        elif kind == Kind.STEAL:
            thief, gen = wire.decode_control(msg)
            self.answer_steal(thief, gen)
        elif kind == Kind.LOOT:
            self.on_loot(*wire.decode_control(msg))
        elif kind == Kind.MOVED:
            thief, gen, ids = wire.decode_control(msg)
            self.carry(self.book.moved(thief, gen, ids))
        elif kind == Kind.CANCEL:
            self.any_cancel = True
            self.carry(self.book.cancel(wire.decode_control(msg), self.running_scopes))
        elif kind == Kind.CANCEL_IF_QUEUED:
            # running ones stay: the driver's cancel() said False for them
            self.book.cancel_if_queued(wire.decode_control(msg), self.running_scopes)
        elif kind == Kind.DIED:
            ep, gen = wire.decode_control(msg)
            self.carry(self.book.died(ep, gen))
            # a half-sent fragmented message to the dead endpoint stays in the ring for
            # its replacement, which drops it; nothing else to do here
        elif kind == Kind.STATS:
            self.send(0, wire.encode_control(Kind.STATS, self.stats()))
        elif kind == Kind.WAKE:
            self.carry(self.book.wake())  # a peer has work: a new round of steal requests
        elif kind == Kind.SHUTDOWN:
            self.stop = True
        elif kind == Kind.INIT:
            self.run_initializer(msg)

    def run_initializer(self, msg: bytes) -> None:
        """The pilot's ``initializer(*initargs)``, before any task.  If it raises, the
        driver is told (it logs the traceback and marks the pilot broken, as a process
        pool does) and this worker stops."""
        try:
            fn, args = wire.cloudpickle.loads(memoryview(msg)[1:])
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported, then this worker ends
            import traceback

            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.send(0, wire.encode_control(Kind.INIT_FAILED, [self.ep, tb]))
            self.stop = True

    def on_result(self, msg: bytes) -> None:
        """A result for a task of mine: a loan came home (or a duplicate: ignored)."""
        tid, ok, value = wire.decode_result(msg)
        self.carry(self.book.result(tid, ok, value))

    def deliver(self, tid: int, msg: bytes) -> None:
        owner = tid >> wire.OWNER_SHIFT
        if owner == self.ep:
            self.on_result(msg)  # my own task came back to me through thieves
        else:
            self.send(owner, msg)

    # -- stealing ----------------------------------------------------------------------

    def steal(self) -> bool:
        """Ask the next victim for work; False when an answer is on its way or every
        victim was asked in vain this round (the loop parks then)."""
        actions = self.book.request()
        if not actions:
            return False
        self.carry(actions)
        return type(actions[-1]) is Steal

    def ask(self, victim: int) -> None:
        """Send a steal request to ``victim``, and poke it if it is awake (in a task)."""
        c = self.c
        c["steal_requests_sent"] += 1
        local = self.node_of[victim - 1] == self.node
        c["steal_requests_local" if local else "steal_requests_remote"] += 1
        if len(self.victims_tried) < 64:
            self.victims_tried.append(victim)
        self.asked_at = time.perf_counter()
        self.send(victim, wire.encode_control(Kind.STEAL, [self.ep, self.gen]))
        if not self.out[victim].doorbell.sleeping:
            pid = self.matrix.status(victim)[STATUS_PID]
            if pid:
                try:
                    os.kill(pid, POKE)  # the victim may be deep in a task: interrupt it
                except OSError:
                    pass  # gone; the driver will tell us (DIED)

    def answer_steal(self, thief: int, gen: int) -> None:
        """A thief asks: the book takes its share off the old end of the deque (rounded
        up only when asked from inside a running task: ``policy.steal_share``)."""
        actions = self.book.answer(thief, gen, self.deque, self.busy, self.depth, self._serialize)
        if not actions:
            return  # asked before it died; its replacement asks for itself
        self.carry(actions)
        given = next(len(a.body[2]) for a in actions if type(a) is Send and a.kind == Kind.LOOT)
        self.c["steal_answers_given"] += 1
        self.c["tasks_given"] += given
        if self.tracer is not None and given:
            self.tracer.instant(f"gave {given} to w{thief}", cat="steal")

    def _serialize(self, task, thief: int, gen: int):
        """The message that carries ``task`` to a thief, or None if it cannot travel."""
        if type(task) is WireTask:
            return task.msg
        fut = task.future
        fn = task.fn
        fn_id = self.fn_ids.get(id(fn))
        try:
            if fn_id is not None:
                payload = wire.dump_args(task.args, task.kwargs, fn)
                return wire.encode_task(fut.task_id, fn_id, 0, payload)
            payload = wire.dump_inline(fn, task.args, task.kwargs)
            return wire.encode_task(fut.task_id, 0, Flag.INLINE_FN, payload)
        except Exception:
            return None  # unpicklable: it simply stays here

    def on_loot(self, victim: int, gen: int, msgs: list) -> None:
        if gen != self.gen:
            # An answer to my dead predecessor, still in the ring from ``victim`` (it was
            # sent before the victim heard of the death).  Its tasks are not mine: their
            # owners re-run them (loans.LoanBook.died, the driver's MOVED of a dead
            # generation).  Run here too, each ran twice (issue 13: 1 run in 8 of the
            # SIGKILL cancel storm).  Not a ``loot`` event either: an answer to a request
            # of mine from that victim may still be on its way.
            self.c["stale_loot_dropped"] += len(msgs)
            return
        if self.book.waits_for(victim):
            waited = time.perf_counter() - self.asked_at
            self.steal_wait_s += waited
            if waited > self.steal_wait_max_s:
                self.steal_wait_max_s = waited
        self.carry(self.book.loot(victim, len(msgs)))
        if not msgs:
            self.c["steal_requests_failed"] += 1
            return
        self.c["steal_requests_answered"] += 1
        local = self.node_of[victim - 1] == self.node
        self.c["stolen_local" if local else "stolen_remote"] += len(msgs)
        for m in reversed(msgs):
            self.deque.append(WireTask(m, wire.decode_task_header(m)[2]))
        if self.tracer is not None:
            self.tracer.instant(f"stole {len(msgs)} from w{victim}", cat="steal")

    # -- running -----------------------------------------------------------------------

    def run_task(self, task) -> None:
        if type(task) is LocalTask:
            self.run_local(task)
        else:
            self.run_wire(task)

    def run_local(self, task: LocalTask) -> None:
        fut = task.future
        if fut._state != _PENDING:
            return  # cancelled while waiting
        if self.any_cancel and task.scope is not None and task.scope.is_cancelled():
            fut.cancel()
            return
        outer = self.scope
        self.scope = fut._scope = Scope(task.scope)
        tracer = self.tracer
        t0 = time.perf_counter() if tracer is not None else 0.0
        self.depth += 1
        try:
            args, kwargs = task.args, task.kwargs
            if task.pinned:
                args, kwargs = resolve(args), resolve(kwargs)
            self.in_user = True
            if self.poked:
                self.poll_in_task()  # a thief poked while the task was being set up
            value = task.fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - everything travels to the waiter
            self.in_user = False
            set_local_exception(fut, exc)
        else:
            self.in_user = False
            set_local_result(fut, value)
        finally:
            self.in_user = False
            self.scope = outer
            self.depth -= 1
        self.c["tasks_run"] += 1
        if tracer is not None:
            tracer.span(getattr(task.fn, "__name__", "task"), t0, time.perf_counter())

    def run_wire(self, task: WireTask) -> None:
        msg, tid = task.msg, task.task_id
        if self.book.should_drop(tid):
            self.carry(self.book.drop(tid))
            return
        flags, fn_id, _ = wire.decode_task_header(msg)
        body = memoryview(msg)[wire.TASK_HDR.size:]
        if flags & wire.INLINE_FN:  # a plain int: IntFlag's & costs ~1 us
            fn = None
        else:
            fn = self.fns.get(fn_id)
            if fn is None:
                self.undefined.append(task)  # its DEFINE is still on the way from the driver
                return
        driver_task = tid >> wire.OWNER_SHIFT == 0
        status = self.status
        if driver_task:
            # Start handshake with Future.cancel in the driver (see LocalBackend._run_state):
            # claim the slot, fence, look once more for a cancel the driver pushed before
            # it read the slots, then confirm by raising the depth.
            depth = status[STATUS_DEPTH]
            if depth < STATUS_SLOTS:
                status[STATUS_RUNNING + depth] = tid
                self.doorbell.ring()  # a StoreLoad fence (our own bell: nobody sleeps on it now)
                if self.driver_box.ring.readable():
                    self.drain_driver()
                    if self.book.should_drop(tid):
                        status[STATUS_RUNNING + depth] = 0
                        self.carry(self.book.drop(tid))
                        return
            status[STATUS_DEPTH] = depth + 1
        if flags & wire.TIMED:
            self.send(0, wire.encode_control(Kind.STARTED, [tid, self.ep]))
        scope = Scope(self.scope)
        self.running_scopes[tid] = scope
        outer = self.scope
        self.scope = scope
        tracer = self.tracer
        t0 = time.perf_counter() if tracer is not None else 0.0
        self.depth += 1
        try:
            context.loading = "a task's arguments"
            try:
                if fn is None:
                    fn, args, kwargs = wire.load_args(body, "an inline task")
                elif type(fn) is wire.Unloadable:
                    fn()  # raises the SerializationError that says why it could not be loaded
                else:
                    args, kwargs = wire.load_args(body, wire.describe(fn))
            finally:
                context.loading = None
            self.in_user = True
            if self.poked:
                self.poll_in_task()  # a thief poked while the arguments were unpickled
            value = fn(*args, **kwargs)
            self.in_user = False
        except BaseException as exc:  # noqa: BLE001
            self.in_user = False
            result = wire.encode_error(tid, exc)
        else:
            result = wire.encode_result(tid, value)
        finally:
            self.in_user = False
            self.scope = outer
            self.depth -= 1
            del self.running_scopes[tid]
        self.c["tasks_run"] += 1
        if tracer is not None:
            tracer.span(getattr(fn, "__name__", "task"), t0, time.perf_counter())
        try:
            self.deliver(tid, result)
        finally:
            # Only now is the task done: a worker that dies while pickling or sending its
            # result fails the task (quarantine) instead of having it re-sent; and a cancel()
            # that finds neither the claim nor (draining) the result knows the task never
            # started (LocalBackend._probe).
            if driver_task:
                if self.out[0].pending:  # the slot clears only once the whole result is in the ring
                    self.flush_to_driver()
                status = self.status
                depth = status[STATUS_DEPTH] - 1
                if depth < STATUS_SLOTS:
                    status[STATUS_RUNNING + depth] = 0  # no stale claim for a retry of this id
                status[STATUS_DEPTH] = depth
        if driver_task and self.retire_after and not self.depth:
            self.retire_after -= 1
            if not self.retire_after:
                self.stop = True  # max_tasks_per_child: the driver starts a fresh worker

    # -- a task that forks ----------------------------------------------------------------

    def after_fork(self) -> None:
        """At-fork hook in the child of a task's ``os.fork()``: the child must never become
        a second consumer or producer of this worker's rings.  It loses them here; when it
        gets back into the loop (the task returned instead of calling ``os._exit``), it
        exits (``_ForkedOut``) before touching any shared state."""
        self.stop = True
        self.forked = os.getpid()
        self.inboxes = []
        self.out = _ForkedOut(self.ep)
        self.status = [0] * RingMatrix.STATUS_WORDS  # private now: the cell is the parent's
        self.deque = deque()
        self.unsettled = []
        self.behind_loot = {}
        self.book.forked()

    # -- reporting ---------------------------------------------------------------------

    def stats(self) -> dict:
        out = dict(self.c)
        out.update(
            worker=self.ep, cpu=self.cpu, node=self.node, pid=os.getpid(),
            generation=self.gen, queued=len(self.deque), idle_s=round(self.idle_s, 6),
            steal_wait_s=round(self.steal_wait_s, 6), steal_wait_max_s=round(self.steal_wait_max_s, 6),
            victims_tried=list(self.victims_tried), lent=self.book.lent(),
            uptime_s=round(time.perf_counter() - self.started, 6),
        )
        return out


class _ForkedOut(dict):
    """A forked child's outboxes: sending anything means the child came back into the
    worker loop, so it exits instead (with a line on stderr saying why)."""

    def __init__(self, ep: int):
        super().__init__()
        self.ep = ep

    def __missing__(self, dst):
        _exit_forked(self.ep)


def _exit_forked(ep: int) -> None:
    try:
        sys.stderr.write(f"shoal: a task forked worker {ep}; the child (pid {os.getpid()}) returned "
                         "into the worker loop and exits now (end a forked child with os._exit)\n")
        sys.stderr.flush()
    finally:
        os._exit(70)


def _watch_lifeline(fd: int) -> None:
    """Exit the moment the driver is gone, even while a task runs (daemon thread)."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        if poller.poll():
            os._exit(0)


_STACK = 112 << 20  # main-thread stack wanted: Linux leaves >= 128 MiB below it for growth
_STACK_PER_LEVEL = 1100  # bytes of C stack one recursion level may take (generous)


def _room_for_deep_joins() -> None:
    """Deep help-first joins nest Python frames, so workers allow deep recursion, but
    never deeper than the C stack can hold: C-level recursion (repr, pickle, a Python
    function called from C) must end in RecursionError, as in plain Python, not in a
    segfault.  The soft stack limit is raised (the main thread's stack grows on demand
    up to it) and the recursion limit is sized to the stack there is."""
    import resource

    have = 8 << 20
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
        want = _STACK if hard == resource.RLIM_INFINITY else min(_STACK, hard)
        if soft == resource.RLIM_INFINITY or soft >= want:
            have = want
        else:
            resource.setrlimit(resource.RLIMIT_STACK, (want, hard))
            have = want
    except (ValueError, OSError):
        pass
    sys.setrecursionlimit(max(sys.getrecursionlimit(), min(100_000, have // _STACK_PER_LEVEL)))


def _adopt_driver_state(spec: dict) -> None:
    """What a task may need of the driver, adopted when the task imports what needs it
    (``post_import``: no worker start pays for ``multiprocessing`` or joblib up front):
    the driver's ``multiprocessing`` authkey, read from its pipe now (processes.py
    ``_authkey_pipe``), and the modules the driver's integrations ask for."""
    from . import post_import

    fd = spec.get("authkey_fd")
    if fd is not None:
        with os.fdopen(fd, "rb") as pipe:
            key = pipe.read()
        if key:
            post_import.when_imported("multiprocessing.process", lambda mod: setattr(
                mod.current_process(), "authkey", key))
    for name, modules in spec.get("after_import", {}).items():
        for module in modules:
            post_import.when_imported(name, lambda _mod, module=module: __import__(module))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    sys.path[:0] = [p for p in spec.get("sys_path", ()) if p not in sys.path]
    _adopt_driver_state(spec)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    try:
        os.sched_setaffinity(0, {spec["real_cpu"]})
    except (AttributeError, OSError, ValueError):
        pass
    threading.Thread(target=_watch_lifeline, args=(spec["lifeline"],), daemon=True).start()
    matrix = RingMatrix.attach(spec["rings"])
    worker = Worker(spec, matrix)
    worker.status[STATUS_PID] = os.getpid()
    signal.signal(POKE, worker.on_signal)
    os.register_at_fork(after_in_child=worker.after_fork)
    _room_for_deep_joins()
    # the task loop runs from the base of a frame-stack chunk of its own (shoal/_room.py:
    # a user's recursion that sat on a chunk boundary at the worker's stack depth paid
    # 2 syscalls and a page fault per call); once per worker, not once per task
    in_room(worker.run)
    if worker.forked:
        _exit_forked(worker.ep)
    if worker.tracer is not None:
        worker.tracer.dump(f"{spec['trace']}.w{worker.ep}")
    for dst, box in list(worker.out.items()):
        for _ in range(1000):
            if box.flush():
                break
            time.sleep(0.001)
        worker.release_moved(dst)
    for box in worker.out.values():
        for _ in range(1000):
            if box.flush():
                break
            time.sleep(0.001)
    os._exit(0)  # skip interpreter teardown: views into the segment die with us


if __name__ == "__main__":
    sys.exit(main())
