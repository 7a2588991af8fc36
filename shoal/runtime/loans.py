"""A worker's steal/lend/MOVED/DIED/cancel bookkeeping: a pure state machine.

The worker loop (``runtime/worker.py``) feeds every event of the stealing
protocol into one ``LoanBook`` and carries out the actions it returns; the book
does no I/O, reads no clock and sends nothing (dask's worker_state_machine
idea: events in, actions out), so a Hypothesis stateful test can drive many
books through any interleaving (``tests/runtime/test_loans_machine.py``).

Data flow::

    thief side   request() ─► Steal(victim)             the loop sends STEAL, pokes the victim
                 loot(victim, n) / wake() / fed()        answers, WAKEs, work from elsewhere
    victim side  answer(thief, gen, deque, busy, depth, serialize)
                   ─► Send(thief, LOOT, [me, gen, msgs]) + Send(owner, MOVED, ...) per other owner
                      + Fail(tid, CancelledError) for cancelled tasks found on the way
                 spawned(deque, depth, serialize) ─► the same, to a thief turned away before
    owner side   result(tid, ok, value) ─► Settle(task, ok, value)    a loan comes home
                 moved(thief, gen, ids) / died(ep, gen) ─► Run(task)  re-run a loan lost
                 cancel(ids, running) ─► Send(holder, CANCEL, ids)    forward to holders
    any side     SetHunger(value)                        the status word peers and hungry() read

State (one book per worker, worker thread only):

* ``loans``: my spawned tasks out on loan, task id -> ``Loan(task, holder, gen)``:
  where the task is now as far as I know.  A loan ends exactly once: its result
  arrives (``Settle``), or its holder's generation is dead (``Run`` again here).
  A result for a task with no loan (a duplicate after a re-run, or for a dead
  predecessor of this endpoint) is ignored, so a future is finished once.
* ``dead``: endpoint -> newest dead generation (from the driver's DIED).  A steal
  request from a dead generation is not answered; a MOVED naming one re-runs.
* ``cancelled``: ids of serialized tasks to drop instead of running or lending.
* ``owed``: thieves I answered with nothing (thief, generation).  The next child a
  running task spawns here answers them at once (``spawned``): without it a thief
  that asked while my deque was empty (or held one task, kept by the round-down)
  slept until a peer's WAKE, which comes only when a deque goes from empty to one
  task or every 32 spawns (a 2-worker user UTS left a worker idle for ~100 ms at a
  time that way while the other's deque held work).  An unasked-for LOOT is fine:
  a thief keeps whatever loot arrives.
* the thief's request: at most one STEAL in flight (``pending``), the victims
  asked this round (``cursor``), and ``hunger`` (``Hunger``: BUSY, LOOKING,
  HUNGRY), mirrored into the worker's status word by ``SetHunger``.

Invariants: a task is in exactly one place: a deque, a LOOT in flight, or a
running stack; its owner's loan names the holder it was last told about.  A LOOT
in flight belongs to the generation it answers (the thief's, from its STEAL): if
that generation dies, its replacement drops the LOOT (``Worker.on_loot``) and the
owners re-run the tasks, as for any task the dead one held.  A
victim that hands on another owner's task tells that owner (MOVED) in the same
answer; so when a holder dies, either the owner's loan names it (re-run on DIED)
or a MOVED naming it is on the way (re-run on arrival, the death being known).
Each task's future is therefore settled exactly once — its value, the
CancelledError of a dropped cancelled task — or, for a driver task, failed by
the driver (WorkerLost); nothing is lost.

The steal share (``policy.steal_share``) rounds up only when the victim answers
from inside a running task: rounding up in a help-first join let two joining
workers pass a lone stolen task back and forth forever (a deep stolen chain
livelock, tests/runtime/test_faults_errors.py).

Rejected: keeping the state as lists mutated by index inside the worker (what
this replaces: untestable without processes); a book per task (a MOVED or DIED
touches many tasks at once); serializing inside the book (pickling belongs to the
loop: the book gets an injected ``serialize`` and never sees bytes it did not
get from it).
"""

from __future__ import annotations

from collections import deque as _deque
from concurrent.futures import CancelledError
from enum import Enum, IntEnum
from typing import Callable, NamedTuple

from . import policy
from .future import PENDING
from .wire import OWNER_SHIFT, Kind

__all__ = [
    "Fail", "Hunger", "Loan", "LoanBook", "LocalTask", "Run", "Scope", "Send", "SetHunger",
    "Settle", "Steal", "Stimulus", "StoryEntry", "WireTask", "first_seq", "task_id_base",
]


class Hunger(IntEnum):
    """The hungry word of a worker's status cell (written by that worker only).

    BUSY: it has work (a task runs, or its deque is not empty).  LOOKING: its deque is
    empty and it asks victims for work (from its loop or from a help-first join).
    HUNGRY: it asked every victim in vain and parks until a peer's ``WAKE`` (peers that
    spawn wake only these).  Readers that test the word for truth see "idle": LOOKING
    or HUNGRY.
    """

    BUSY = 0
    HUNGRY = 1
    LOOKING = 2


_BUSY, _HUNGRY, _LOOKING = int(Hunger.BUSY), int(Hunger.HUNGRY), int(Hunger.LOOKING)


# -- the task records the deque holds --------------------------------------------------


class Scope:
    """Cancellation scope of a running task: its children check it before they run."""

    __slots__ = ("cancelled", "parent")

    def __init__(self, parent):
        self.cancelled = False
        self.parent = parent

    def is_cancelled(self) -> bool:
        s = self
        while s is not None:
            if s.cancelled:
                return True
            s = s.parent
        return False


class LocalTask:
    """A task spawned here, still a Python object (worker thread only)."""

    __slots__ = ("fn", "args", "kwargs", "future", "scope", "pinned")

    def __init__(self, fn, args, kwargs, future, scope, pinned):
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.future = future
        self.scope = scope
        self.pinned = pinned  # has unresolved future arguments: never lent out


class WireTask:
    """A serialized task (from the driver, or stolen): kept as bytes until it runs."""

    __slots__ = ("msg", "task_id", "pinned")

    def __init__(self, msg: bytes, task_id: int):
        self.msg = msg
        self.task_id = task_id
        self.pinned = False


class Loan:
    """One of my spawned tasks out on loan: who holds it now (endpoint, generation)."""

    __slots__ = ("task", "holder", "gen")

    def __init__(self, task: LocalTask, holder: int, gen: int):
        self.task = task
        self.holder = holder
        self.gen = gen

    def __repr__(self) -> str:
        return f"Loan({self.task.future.task_id:#x} -> w{self.holder}/g{self.gen})"


# -- actions out -----------------------------------------------------------------------


class Send(NamedTuple):
    """Send control message ``kind`` with msgpack ``body`` to endpoint ``dst``."""

    dst: int
    kind: Kind
    body: object


class Steal(NamedTuple):
    """Send a STEAL request to ``victim`` (and poke it if it is awake in a task)."""

    victim: int


class Run(NamedTuple):
    """Put ``task`` (a loan whose holder died) back on my deque: it runs here again."""

    task: LocalTask


class Settle(NamedTuple):
    """A loan came home: finish ``task``'s future with ``value`` (or raise it)."""

    task: LocalTask
    ok: bool
    value: object


class Fail(NamedTuple):
    """Deliver error ``exc`` as the result of serialized task ``task_id`` to its owner."""

    task_id: int
    exc: BaseException


class SetHunger(NamedTuple):
    """Write ``value`` (a Hunger) into my status word."""

    value: int


_NOTHING: tuple = ()


class CancelledIds(set):
    """Ids of serialized tasks to drop when they come up (a set), bounded by forgetting
    the *oldest* first.

    Entries go stale: the driver's cancel-if-queued goes to every worker (a thief may
    hold the task), and only the one that meets the task drops its entry.  It was a set
    cleared whole at 100,000 entries, which also forgot fresh cancels of tasks still
    queued here: they ran although cancel() had said True.  Now only an id cancelled
    ``LIMIT`` cancels ago can be forgotten, by then long run or dropped elsewhere."""

    LIMIT = 100_000
    __slots__ = ("order",)

    def __init__(self):
        super().__init__()
        self.order: _deque = _deque()  # ids in the order added (some already discarded)

    def add(self, tid: int) -> None:
        if tid in self:
            return
        super().add(tid)
        order = self.order
        order.append(tid)
        if len(self) > self.LIMIT:
            while order:
                old = order.popleft()
                if old in self:
                    super().discard(old)
                    break
        elif len(order) > 2 * self.LIMIT:  # many discarded: drop them from the order too
            self.order = _deque(t for t in order if t in self)


class Stimulus(Enum):
    """What a task's story entry records: the event the book handled and what it did."""

    LENT = "lent"  # answer(): given to a thief (detail: (thief, gen))
    HANDED_ON = "handed on"  # answer(): a task of another owner went on (MOVED to its owner)
    RETURNED = "returned"  # result(): the loan's result came home (detail: ok)
    DUPLICATE = "duplicate"  # result(): a result for no loan (a re-run's, a predecessor's)
    MOVED = "moved"  # moved(): its holder handed it on (detail: (thief, gen))
    RERUN = "re-run"  # moved()/died(): its holder is dead, it runs here again
    DIED = "died"  # died(): endpoint died (detail: (ep, gen); task None)
    DROPPED = "dropped"  # drop(): cancelled, not run
    CANCELLED = "cancelled"  # cancel()/cancel_if_queued(): to be dropped when it comes up
    FORKED = "forked"  # forked(): a child process forgot the loans (detail: how many)


class StoryEntry(NamedTuple):
    """One line of a book's story: ``stimulus`` numbers the event the book was handed (one
    per call of its methods), so entries of one event read together."""

    stimulus: int
    what: Stimulus
    task: int | None
    detail: object = None


STORY_LIMIT = 4096  # story entries a book keeps (the oldest go first)


class LoanBook:
    """The stealing protocol's state of one worker (worker thread only; no I/O).

    It keeps a bounded story (``story(tid)``, dask's ``story()``): what happened to each
    task it lent, got back, handed on, re-ran, dropped or was told to cancel, numbered by
    the event that did it, so a failed stateful test (tests/runtime/test_loans_machine.py)
    prints a task's history instead of only its end.  Hunger changes are not in it (they
    happen per steal round, not per task).  Rejected: an unbounded log (a worker lives for
    millions of tasks), and recording in the worker (the book is where the decisions are).
    """

    # What the worker may read directly, on its hot paths (one attribute read, no call):
    # ``hunger`` (is there a ``fed()`` to report), ``owed`` (is a ``spawned()`` due).  Every
    # other question goes through a query method (``is_lent``, ``lent``, ``waits_for``,
    # ``should_drop``, ``story``) and every change through an event method; the worker
    # never assigns to the book, never mutates a container it holds, and keeps no alias
    # of one (tests/runtime/test_loan_book_interface.py checks worker.py with ast).
    # Rejected: read-only views of ``cancelled`` and ``owed`` (a copy or a proxy per
    # spawn and per task start, for what a truthiness test answers).
    READABLE = frozenset({"hunger", "owed"})

    def __init__(self, me: int, victims: list[int], dead: dict[int, int] | None = None):
        self.me = me
        self.victims = victims  # whom to ask, in order (policy.victim_order)
        self.loans: dict[int, Loan] = {}
        # endpoint -> newest dead generation: from the driver's DIED, and for a replacement
        # the deaths before it started (``dead``, its own predecessor included): a steal
        # request a dead thief left in my ring is not answered, as its answer would be
        # dropped (Worker.on_loot) with my tasks in it and no DIED for that thief will
        # ever come to re-run them; a MOVED of my task to a dead one re-runs it at once.
        self.dead: dict[int, int] = dict(dead or {})
        self.cancelled = CancelledIds()  # ids of serialized tasks to drop
        self.owed: list[tuple[int, int]] = []  # (thief, gen) I answered with nothing
        self.pending: int | None = None  # victim of the STEAL in flight
        self.cursor = 0  # victims asked this round
        self.hunger = _BUSY
        self.stimuli = 0  # events handled that wrote to the story
        self._story: _deque = _deque(maxlen=STORY_LIMIT)

    def _told(self) -> int:
        """Number the event being handled (for its story entries)."""
        self.stimuli += 1
        return self.stimuli

    def story(self, tid: int | None = None) -> list[StoryEntry]:
        """The story entries of task ``tid`` (None: every entry), oldest first."""
        return [e for e in self._story if tid is None or e.task == tid]

    # -- queries (no event: nothing changes, nothing goes in the story) -----------------

    def is_lent(self, tid: int) -> bool:
        """Whether my spawned task ``tid`` is out on loan (a thief may run it right now)."""
        return tid in self.loans

    def lent(self) -> int:
        """How many of my spawned tasks are out on loan."""
        return len(self.loans)

    def waits_for(self, victim: int) -> bool:
        """Whether my steal request in flight went to ``victim``."""
        return victim == self.pending

    def should_drop(self, tid: int) -> bool:
        """Whether serialized task ``tid`` was cancelled here: drop it (``drop``), never run it."""
        cancelled = self.cancelled
        return bool(cancelled) and tid in cancelled

    # -- events --------------------------------------------------------------------------

    def forked(self) -> None:
        """This process is a fork of the worker (``os.fork`` in a task): it owns no loans
        (their results go to the parent) and must not settle the parent's futures."""
        self._story.append(StoryEntry(self._told(), Stimulus.FORKED, None, len(self.loans)))
        self.loans = {}

    # -- the thief's side --------------------------------------------------------------

    def request(self) -> list:
        """My deque is empty: whom to ask.  No ``Steal`` in the answer means park: an
        answer is on its way, or every victim was asked in vain this round."""
        if self.pending is not None:
            return []
        out: list = []
        if self.cursor >= len(self.victims):
            if self.hunger == _HUNGRY or not self.victims:
                if not self.victims and self.hunger != _HUNGRY:
                    self.hunger = _HUNGRY
                    out.append(SetHunger(_HUNGRY))
                return out
            # Announce hunger (peers wake us; the dask balancer sees an idle node), then
            # one more round: a peer that spawned work just before it could see the flag
            # is asked once more.
            self.hunger = _HUNGRY
            out.append(SetHunger(_HUNGRY))
            self.cursor = 0
        elif self.hunger == _BUSY:
            self.hunger = _LOOKING
            out.append(SetHunger(_LOOKING))
        victim = self.victims[self.cursor]
        self.cursor += 1
        self.pending = victim
        out.append(Steal(victim))
        return out

    def loot(self, victim: int, n: int) -> list:
        """``victim`` answered my request with ``n`` tasks (a late answer of a victim I
        gave up on, after it died and came back, is kept all the same)."""
        if victim == self.pending:
            self.pending = None
        if not n:
            return []
        self.cursor = 0
        return self.fed()

    def wake(self) -> list:
        """A peer has work (WAKE): start a new round of requests."""
        self.cursor = 0
        if self.hunger == _HUNGRY:
            self.hunger = _LOOKING
            return [SetHunger(_LOOKING)]
        return []

    def fed(self) -> list:
        """Work arrived (a task, loot, a re-run) or a join ended: I am busy."""
        if self.hunger:
            self.hunger = _BUSY
            return [SetHunger(_BUSY)]
        return []

    # -- the victim's side -------------------------------------------------------------

    def answer(self, thief: int, gen: int, deque: _deque, busy: bool, depth: int,
               serialize: Callable[[LocalTask, int, int], object]) -> list:
        """``thief`` (generation ``gen``) asks for work: take its share from the old end
        of ``deque`` (mutated), ``serialize(task, thief, gen)`` each (None: it cannot
        travel and stays).  Pinned tasks stay; the driver (thief 0, exporting for
        another machine) gets spawned tasks only; cancelled ones are dropped."""
        if self.dead.get(thief, -1) >= gen:
            return []  # asked before it died; its replacement asks for itself
        give = policy.steal_share(len(deque), busy, thief == 0 and depth > 0)
        loot, moved, keep, out = [], {}, [], []
        cancelled = self.cancelled
        loans = self.loans
        story, sid = self._story, self._told()
        while give > 0 and deque:
            task = deque.popleft()
            wire_task = type(task) is WireTask
            if wire_task and cancelled and task.task_id in cancelled:
                out += self.drop(task.task_id)  # cancelled here: dropped, never handed on
                continue
            if task.pinned or (thief == 0 and wire_task):
                keep.append(task)
                continue
            if not wire_task and task.future._state != PENDING:
                keep.append(task)  # cancelled meanwhile: it settles when popped here
                continue
            msg = serialize(task, thief, gen)
            if msg is None:
                keep.append(task)  # unpicklable: it simply stays here
                continue
            give -= 1
            loot.append(msg)
            if not wire_task:
                loans[task.future.task_id] = Loan(task, thief, gen)
                story.append(StoryEntry(sid, Stimulus.LENT, task.future.task_id, (thief, gen)))
            else:
                tid = task.task_id
                owner = tid >> OWNER_SHIFT
                if owner != self.me:
                    moved.setdefault(owner, []).append(tid)
                    story.append(StoryEntry(sid, Stimulus.HANDED_ON, tid, (thief, gen)))
                else:  # my own task, back from a thief, leaves again: follow it
                    loan = loans.get(tid)
                    if loan is not None:
                        loan.holder, loan.gen = thief, gen
                    story.append(StoryEntry(sid, Stimulus.LENT, tid, (thief, gen)))
        deque.extendleft(reversed(keep))
        out.append(Send(thief, Kind.LOOT, [self.me, gen, loot]))
        for owner, ids in moved.items():
            out.append(Send(owner, Kind.MOVED, [thief, gen, ids]))
        if thief:  # the driver's export asks again by itself
            owed = self.owed
            for i, (who, _) in enumerate(owed):
                if who == thief:
                    del owed[i]
                    break
            if not loot:
                owed.append((thief, gen))  # answered when work appears here (spawned)
        return out

    def spawned(self, deque: _deque, depth: int,
                serialize: Callable[[LocalTask, int, int], object]) -> list:
        """A running task spawned a child while a thief I had to turn away waits (``owed``):
        answer that request now, from inside the running task (the share rounds up, so
        the new child goes if nothing older can), instead of leaving the thief asleep
        until my deque empties again or my next poll.  Nothing is sent when there is
        still nothing to give (e.g. only pinned tasks)."""
        if deque[-1].pinned:
            return []
        thief, gen = self.owed.pop(0)
        out = self.answer(thief, gen, deque, True, depth, serialize)
        for i, act in enumerate(out):
            if type(act) is Send and act.kind == Kind.LOOT:
                if not act.body[2]:
                    del out[i]  # nothing after all: still owed (answer put it back)
                break
        return out

    def drop(self, tid: int) -> list:
        """Serialized task ``tid`` was cancelled and is dropped, not run.  A worker that
        owns it (a spawned child lent out) is told, so a parent waiting on it gets
        CancelledError instead of waiting forever.  The driver is told of its own tasks
        (DROPPED): it settled them when its cancel() said True, but a cancel() that gave
        up waiting on a claim said False, and then the task must still run somewhere."""
        self.cancelled.discard(tid)
        self._story.append(StoryEntry(self._told(), Stimulus.DROPPED, tid))
        if tid >> OWNER_SHIFT:
            return [Fail(tid, CancelledError(f"task {tid:#x} was cancelled"))]
        return [Send(0, Kind.DROPPED, [tid])]

    # -- the owner's side --------------------------------------------------------------

    def result(self, tid: int, ok: bool, value) -> list:
        """A result for my task ``tid`` arrived (from its holder, or from myself)."""
        loan = self.loans.pop(tid, None)
        if loan is None:  # a duplicate after a re-run, or for a predecessor of this endpoint
            self._story.append(StoryEntry(self._told(), Stimulus.DUPLICATE, tid, ok))
            return []
        self._story.append(StoryEntry(self._told(), Stimulus.RETURNED, tid, ok))
        return [Settle(loan.task, ok, value)]

    def moved(self, thief: int, gen: int, ids) -> list:
        """A victim handed my tasks ``ids`` on to ``thief`` (generation ``gen``)."""
        out = []
        loans = self.loans
        sid = self._told()
        for tid in ids:
            loan = loans.get(tid)
            if loan is not None:
                loan.holder, loan.gen = thief, gen
                self._story.append(StoryEntry(sid, Stimulus.MOVED, tid, (thief, gen)))
                if self.dead.get(thief, -1) >= gen:
                    out += self._rerun(tid, sid)
        return out

    def died(self, ep: int, gen: int) -> list:
        """The driver says generation ``gen`` of endpoint ``ep`` is dead."""
        self.dead[ep] = max(gen, self.dead.get(ep, -1))
        sid = self._told()
        self._story.append(StoryEntry(sid, Stimulus.DIED, None, (ep, gen)))
        out = []
        for tid in [t for t, loan in self.loans.items() if loan.holder == ep and loan.gen <= gen]:
            out += self._rerun(tid, sid)
        if self.pending == ep:
            self.pending = None  # its replacement does not owe us an answer
        self.owed[:] = [(who, g) for who, g in self.owed if who != ep or g > gen]
        return out

    def _rerun(self, tid: int, sid: int) -> list:
        task = self.loans.pop(tid).task
        self._story.append(StoryEntry(sid, Stimulus.RERUN, tid))
        if task.future._state == PENDING:
            return [Run(task), *self.fed()]
        return []

    # -- cancellation ------------------------------------------------------------------

    def cancel(self, ids, running: dict) -> list:
        """Cancel tasks ``ids``: a running one's scope (``running``: id -> Scope) is
        marked (its children see it), a queued one is dropped when it comes up; then
        every loan whose scope is now cancelled is forwarded to its holder."""
        sid = self._told()
        for tid in ids:
            self._mark_cancelled(tid, running, sid)
        by_holder: dict[int, list] = {}
        for tid, loan in self.loans.items():
            scope = loan.task.scope
            if scope is not None and scope.is_cancelled():
                by_holder.setdefault(loan.holder, []).append(tid)
        # A loan can come home as a serialized task (a thief gave it back to me and told me
        # so with MOVED): no CANCEL to myself (there is no ring to myself), drop it here.
        for tid in by_holder.pop(self.me, ()):
            self._mark_cancelled(tid, running, sid)
        return [Send(holder, Kind.CANCEL, tids) for holder, tids in by_holder.items()]

    def _mark_cancelled(self, tid: int, running: dict, sid: int) -> None:
        """A running task's scope is marked (its children see it); a queued one is
        remembered and dropped when it comes up."""
        self._story.append(StoryEntry(sid, Stimulus.CANCELLED, tid, tid in running))
        scope = running.get(tid)
        if scope is not None:
            scope.cancelled = True
        else:
            self.cancelled.add(tid)

    def cancel_if_queued(self, ids, running: dict) -> None:
        """The driver's ``cancel()``: drop these unless they run (then it said False)."""
        sid, story = self._told(), self._story
        for tid in ids:
            story.append(StoryEntry(sid, Stimulus.CANCELLED, tid, tid in running))
            if tid not in running:
                self.cancelled.add(tid)


GEN_SHIFT = 32  # a spawned task's id: owner endpoint (16 bits), generation (16), number (32)


def first_seq(gen: int) -> int:
    """The sequence number before the first task a worker of generation ``gen`` spawns.

    A replacement must never reuse the ids of its dead predecessor: a late RESULT
    for one of those (sent by a thief before the death was known) would settle the
    replacement's task of the same number with another task's value."""
    return (gen & 0xFFFF) << GEN_SHIFT


def task_id_base(ep: int, gen: int) -> int:
    """The id before the first task endpoint ``ep`` spawns in generation ``gen``."""
    return (ep << OWNER_SHIFT) | first_seq(gen)
