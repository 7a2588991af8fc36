"""The stealing protocol's loan book (``shoal/runtime/loans.py``), driven by Hypothesis.

A Hypothesis *stateful* test runs several workers' real ``LoanBook``s against each
other through simulated rings (one FIFO per ordered pair of endpoints, as the
ring matrix) under random interleavings of spawn, steal request, message
delivery (steal answers, loot, results, MOVED, CANCEL, DIED), task done, cancel
and worker death (the endpoint restarts with the next generation and the driver
announces DIED, as ``LocalBackend._on_death`` does).  It checks the protocol's
promise for spawned tasks: once everything has drained, every task whose owner
is alive was settled exactly once, with its own value, or with CancelledError /
cancelled when its scope was cancelled; no result ever reaches a future twice
or a future it does not belong to.  Driver tasks (owner 0) are settled by the
driver (WorkerLost for one that was running on a dead worker): that is
``tests/runtime/test_faults_*``'s territory, with real processes.

Only the book is real here; the loop around it (what the worker does with each
action) is the few lines of ``Sim.carry``, mirroring ``Worker.carry``.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import CancelledError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shoal.runtime import policy
from shoal.runtime.future import Future
from shoal.runtime.loans import (
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
    task_id_base,
)
from shoal.runtime.wire import OWNER_SHIFT, Kind

N = 3  # workers 1..N; endpoint 0 is the driver


class SimWorker:
    """One incarnation (endpoint, generation) of a worker: its book, deque and tasks."""

    def __init__(self, ep: int, gen: int, dead: dict | None = None):
        self.ep, self.gen = ep, gen
        self.book = LoanBook(ep, [v for v in range(1, N + 1) if v != ep], dead)
        self.deque: deque = deque()
        self.seq = task_id_base(ep, gen)
        self.scopes = [Scope(None) for _ in range(3)]  # "parents" whose children it spawns
        self.hunger = Hunger.BUSY
        self.any_cancel = False


class LoansMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.workers = {ep: SimWorker(ep, 0) for ep in range(1, N + 1)}
        self.incarnations = list(self.workers.values())  # every book, dead ones too (story)
        self.behind: dict[int, list] = {}  # id(LOOT entry) -> its MOVEDs (src, dst, entry)
        self.rings: dict[tuple[int, int], deque] = {
            (s, d): deque() for s in range(N + 1) for d in range(N + 1) if s != d}
        self.tasks: dict[int, tuple] = {}  # serial -> (owner SimWorker, LocalTask)
        self.deliveries: dict[int, int] = {}  # serial -> results that reached its future
        self.serial = 0
        self.deaths = 0
        self.runs: dict[int, int] = {}  # serial -> runs of its serialized copies (thieves)

    # -- carrying actions out (what Worker.carry does) -----------------------------

    def send(self, src: int, dst: int, kind: Kind, body) -> tuple:
        entry = (kind, body)
        self.rings[(src, dst)].append(entry)
        return entry

    def carry(self, w: SimWorker, actions) -> None:
        loot = None
        for act in actions:
            if type(act) is Send:
                entry = self.send(w.ep, act.dst, act.kind, act.body)
                if act.kind == Kind.LOOT:
                    loot = entry
                elif act.kind == Kind.MOVED and loot is not None:
                    # Worker.carry holds a MOVED back until its LOOT has left the outbox:
                    # the LOOT can die with the victim only together with its MOVEDs (die)
                    self.behind.setdefault(id(loot), []).append((w.ep, act.dst, entry))
            elif type(act) is Steal:
                self.send(w.ep, act.victim, Kind.STEAL, [w.ep, w.gen])
            elif type(act) is Run:
                w.deque.append(act.task)
            elif type(act) is Settle:
                self.settle(act.task.future, act.ok, act.value)
            elif type(act) is Fail:
                self.deliver(w, act.task_id, False, act.exc)
            elif type(act) is SetHunger:
                w.hunger = Hunger(act.value)
            else:
                raise AssertionError(f"unknown action {act!r}")

    def story(self, tid: int) -> str:
        """Task ``tid``'s story in every book that saw it (LoanBook.story), for a failure."""
        lines = [f"  w{w.ep}.g{w.gen} #{e.stimulus} {e.what.value} {e.detail!r}"
                 for w in self.incarnations for e in w.book.story(tid)]
        return f"\nstory of task {tid:#x}:\n" + ("\n".join(lines) or "  (no book saw it)")

    def settle(self, fut: Future, ok: bool, value) -> None:
        serial = fut.serial
        assert fut._state in (PENDING, CANCELLED, CANCELLED_AND_NOTIFIED), \
            f"a second result reached task {fut.task_id:#x}" + self.story(fut.task_id)
        if ok:
            assert value == serial, (f"task {fut.task_id:#x} got another task's result {value}"
                                     + self.story(fut.task_id))
        else:
            assert isinstance(value, CancelledError) and fut.scope_cancelled(), \
                repr(value) + self.story(fut.task_id)
        if fut._state == PENDING:
            self.deliveries[serial] = self.deliveries.get(serial, 0) + 1
            fut._state = FINISHED
            fut._result, fut._exception = (value, None) if ok else (None, value)

    def deliver(self, w: SimWorker, tid: int, ok: bool, value) -> None:
        """A task's result goes to its owner (Worker.deliver)."""
        owner = tid >> OWNER_SHIFT
        if owner == w.ep:
            self.carry(w, w.book.result(tid, ok, value))
        else:
            self.send(w.ep, owner, Kind.RESULT, (tid, ok, value))

    def serialize(self, task, thief, gen):
        if type(task) is WireTask:
            return task.msg
        return (task.future.task_id, task.future.serial)

    # -- rules -----------------------------------------------------------------------

    @rule(ep=st.integers(1, N), parent=st.integers(0, 2), pinned=st.booleans())
    def spawn(self, ep, parent, pinned):
        w = self.workers[ep]
        w.seq += 1
        self.serial += 1
        fut = Future.local((ep << OWNER_SHIFT) | w.seq)
        fut.serial = self.serial
        scope = w.scopes[parent]
        fut.scope_cancelled = scope.is_cancelled
        task = LocalTask(None, (), {}, fut, scope, pinned and self.serial % 3 == 0)
        w.deque.append(task)
        self.tasks[self.serial] = (w, task)
        if w.book.owed:  # a thief turned away earlier is answered now (Worker.spawn)
            self.carry(w, w.book.spawned(w.deque, 1, self.serialize))

    @rule(ep=st.integers(1, N))
    def steal(self, ep):
        w = self.workers[ep]
        if not w.deque:  # the loop (or a join) steals only with an empty deque
            self.carry(w, w.book.request())

    @rule(ep=st.integers(1, N))
    def join_ends(self, ep):
        w = self.workers[ep]
        self.carry(w, w.book.fed())

    def _waiting(self) -> list:
        return [pair for pair, ring in self.rings.items() if ring]

    @precondition(lambda self: self._waiting())
    @rule(data=st.data(), busy=st.booleans(), depth=st.integers(0, 2))
    def receive(self, data, busy, depth):
        src, dst = data.draw(st.sampled_from(self._waiting()))
        self.handle(self.workers[dst], self.rings[(src, dst)].popleft(), busy, depth)

    @rule(ep=st.integers(1, N))
    def run_one(self, ep):
        w = self.workers[ep]
        if w.deque:
            self.run(w, w.deque.pop())

    @rule(ep=st.integers(1, N), parent=st.integers(0, 2))
    def cancel_scope(self, ep, parent):
        """The driver cancels a parent task: its children are dropped or forwarded."""
        w = self.workers[ep]
        w.scopes[parent].cancelled = True
        w.any_cancel = True
        self.carry(w, w.book.cancel([], {}))

    @rule(data=st.data())
    def cancel_future(self, data):
        """A task cancels a spawned future of its own (Future.cancel)."""
        live = [t for w, t in self.tasks.values() if self.workers[w.ep] is w]
        if live:
            data.draw(st.sampled_from(live)).future.cancel()

    @precondition(lambda self: self.deaths < 4)
    @rule(ep=st.integers(1, N), unsent=st.lists(st.integers(0, 2), min_size=N, max_size=N))
    def die(self, ep, unsent=()):
        """The worker dies; the driver tells the others and starts a replacement.  The last
        ``unsent[dst - 1]`` messages it sent to peer ``dst`` die with it: a worker's sends
        wait in its outbox while a ring is full, and an outbox is the dead process's memory."""
        old = self.workers[ep]
        self.deaths += 1
        for dst, n in enumerate(unsent, 1):
            ring = self.rings.get((ep, dst))
            for _ in range(min(n, len(ring) if ring is not None else 0)):
                entry = ring[-1]
                moved = self.behind.get(id(entry), [])
                if any(all(e is not m for e in self.rings[(s, d)]) for s, d, m in moved):
                    break  # a MOVED of it was read: it had left the outbox, it is in the ring
                ring.pop()
                for s, d, m in moved:  # held back behind it, they die with it
                    self.rings[(s, d)].remove(m)
        # the replacement knows every death before it (the driver's spec, "generations")
        # (its own predecessor included: a MOVED of its task to that one re-runs it at once)
        dead = {e: w.gen if e == ep else w.gen - 1 for e, w in self.workers.items()
                if e == ep or w.gen}
        self.workers[ep] = SimWorker(ep, old.gen + 1, dead)
        self.incarnations.append(self.workers[ep])
        self.rings[(0, ep)].clear()  # the driver resets its ring to the dead endpoint
        for other in range(1, N + 1):
            if other != ep:
                self.send(0, other, Kind.DIED, [ep, old.gen])

    # -- a worker's handling of one message and one task (Worker.handle / run_*) -------

    def handle(self, w: SimWorker, msg, busy: bool, depth: int) -> None:
        kind, body = msg
        book = w.book
        if kind == Kind.STEAL:
            self.carry(w, book.answer(body[0], body[1], w.deque, busy, depth, self.serialize))
        elif kind == Kind.LOOT:
            victim, gen, msgs = body
            if gen != w.gen:
                return  # an answer to a dead predecessor: its owners re-run it (Worker.on_loot)
            self.carry(w, book.loot(victim, len(msgs)))
            for m in reversed(msgs):
                w.deque.append(WireTask(m, m[0]))
        elif kind == Kind.RESULT:
            self.carry(w, book.result(*body))
        elif kind == Kind.MOVED:
            self.carry(w, book.moved(*body))
        elif kind == Kind.CANCEL:
            w.any_cancel = True
            self.carry(w, book.cancel(body, {}))
        elif kind == Kind.DIED:
            self.carry(w, book.died(*body))
        else:
            raise AssertionError(kind)

    def run(self, w: SimWorker, task) -> None:
        if type(task) is LocalTask:
            fut = task.future
            if fut._state != PENDING:
                return
            if w.any_cancel and task.scope.is_cancelled():
                fut.cancel()
                return
            self.runs[fut.serial] = self.runs.get(fut.serial, 0) + 1
            self.settle(fut, True, fut.serial)
        else:
            tid, serial = task.msg
            if w.book.cancelled and tid in w.book.cancelled:
                self.carry(w, w.book.drop(tid))
                return
            self.runs[serial] = self.runs.get(serial, 0) + 1
            self.deliver(w, tid, True, serial)

    # -- the promise -------------------------------------------------------------------

    @invariant()
    def nothing_twice(self):
        assert all(n == 1 for n in self.deliveries.values())

    @invariant()
    def hunger_only_without_work(self):
        for w in self.workers.values():
            assert w.hunger == w.book.hunger

    def teardown(self):
        if not hasattr(self, "workers"):
            return
        # Drain: deliver every message and run every queued task until all is quiet.
        for _ in range(10_000):
            moved = False
            for (_, dst), ring in self.rings.items():
                while ring:
                    moved = True
                    self.handle(self.workers[dst], ring.popleft(), False, 0)
            for w in list(self.workers.values()):
                while w.deque:
                    moved = True
                    self.run(w, w.deque.pop())
            if not moved:
                break
        else:
            raise AssertionError("the protocol did not quiesce")
        for serial, (owner, task) in self.tasks.items():
            if self.workers[owner.ep] is not owner:
                continue  # its owner died: nobody waits for it any more
            fut = task.future
            assert fut._state != PENDING, f"task {fut.task_id:#x} was lost" + self.story(fut.task_id)
            if fut._state == FINISHED and fut._exception is None:
                assert self.deliveries.get(serial) == 1, self.story(fut.task_id)
            assert not owner.book.loans, repr(owner.book.loans) + "".join(
                self.story(tid) for tid in owner.book.loans)


TestLoansMachine = LoansMachine.TestCase
TestLoansMachine.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@pytest.mark.timeout(1200)
class TestLoansMachineLong(LoansMachine.TestCase):
    """The same, longer (``-m slow``, ~1 min idle): 1,500 interleavings of up to 80 steps."""

    settings = settings(max_examples=1500, stateful_step_count=80, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("queued,busy,exporting,share", [
    (0, False, False, 0), (1, False, False, 0), (1, True, False, 1), (1, False, True, 1),
    (5, False, False, 2), (5, True, False, 3), (4, True, False, 2), (4, False, False, 2),
])
def test_steal_share_rounds_up_only_inside_a_running_task(queued, busy, exporting, share):
    assert policy.steal_share(queued, busy, exporting) == share


def test_a_joining_victim_keeps_its_lone_task():
    """The livelock rule: asked from a help-first join (not busy), a victim with one
    task keeps it; asked from inside a running task, it gives it."""
    book = LoanBook(1, [2])
    fut = Future.local((1 << OWNER_SHIFT) | 1)
    dq = deque([LocalTask(abs, (1,), {}, fut, None, False)])
    acts = book.answer(2, 0, dq, False, 1, lambda t, th, g: b"x")
    assert acts == [Send(2, Kind.LOOT, [1, 0, []])] and len(dq) == 1
    acts = book.answer(2, 0, dq, True, 1, lambda t, th, g: b"x")
    assert acts == [Send(2, Kind.LOOT, [1, 0, [b"x"]])] and not dq
    assert list(book.loans) == [fut.task_id]


def test_a_late_result_for_a_dead_generation_settles_nothing():
    """A thief's result for a task of a dead generation, read by the replacement after
    it lent out a task of its own: it must not settle that task (the task ids used to
    restart at 1 in every generation, so the replacement's first task took it)."""
    m = LoansMachine()
    m.start()
    m.spawn(1, 0, False)
    m.steal(2)  # w2 asks w1, w1 answers from inside a running task, w2 gets the loot
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), True, 1)
    m.handle(m.workers[2], m.rings[(1, 2)].popleft(), False, 0)
    m.run_one(2)  # its RESULT is in the ring to endpoint 1 ...
    m.die(1)  # ... when w1 dies; the replacement spawns and lends a task to w3
    m.spawn(1, 0, False)
    m.steal(3)
    m.handle(m.workers[1], m.rings[(3, 1)].popleft(), True, 1)
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), False, 0)  # the late RESULT
    m.teardown()  # w3 runs the replacement's task: its own value, delivered once
    assert task_id_base(1, 0) != task_id_base(1, 1)
    assert (task_id_base(3, 7) + 1) >> OWNER_SHIFT == 3


def test_a_steal_answer_to_a_dead_thief_is_not_run_by_its_replacement():
    """w1 answers w2's request (LOOT in the ring to endpoint 2) and w2 dies before reading
    it: w1 re-runs its loan (DIED), and w2's replacement must drop the answer meant for
    its predecessor.  It ran it too: every such task ran twice (found by the SIGKILL storm;
    real processes: tests/runtime/test_worker_death.py)."""
    m = LoansMachine()
    m.start()
    m.spawn(1, 0, False)
    m.steal(2)
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), True, 1)  # LOOT [1, gen 0, [task]]
    m.die(2)
    m.handle(m.workers[1], m.rings[(0, 1)].popleft(), False, 0)  # DIED: w1 re-runs its loan
    m.handle(m.workers[2], m.rings[(1, 2)].popleft(), False, 0)  # the replacement reads the LOOT
    assert not m.workers[2].deque
    m.teardown()
    assert m.runs == {1: 1}


def test_a_dead_thiefs_request_answered_with_its_replacements_task_reruns_it():
    """Hypothesis found it (the long run): w1 dies with a STEAL in the ring to w2; w2 steals
    a task from w1's replacement, then answers the stale STEAL (DIED not read yet) with that
    task, and tells the owner (the replacement) MOVED to endpoint 1 generation 0.  The
    replacement drops the LOOT (not its generation) and must re-run its task on the MOVED:
    it knows its own predecessor is dead.  Before, the task was lost."""
    m = LoansMachine()
    m.start()
    m.steal(1)  # STEAL [1, 0] in the ring to w2
    m.steal(2)  # STEAL [2, 0] in the ring to w1
    m.die(1)
    m.spawn(1, 0, False)  # the replacement's task X
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), True, 1)  # it gives X to w2
    m.handle(m.workers[2], m.rings[(1, 2)].popleft(), False, 0)  # the stale STEAL: owed
    m.handle(m.workers[2], m.rings[(1, 2)].popleft(), False, 0)  # the LOOT with X
    m.spawn(2, 0, False)  # w2 answers the owed (dead) thief with X: MOVED(1, 0, [X]) to w1
    assert m.rings[(0, 2)], "w2 has not read DIED yet"
    m.teardown()  # the replacement drops the LOOT (generation 0) and re-runs X on the MOVED


def test_cancelling_a_loan_that_came_home_sends_nothing_to_myself():
    """A thief gave my lent task back to me (MOVED names me as its holder); cancelling its
    parent then sent CANCEL to myself, and there is no ring to myself (found by the
    stateful test: KeyError in the worker loop).  Now it is dropped here, and the parent
    waiting on it gets CancelledError."""
    m = LoansMachine()
    m.start()
    m.spawn(1, 0, False)
    m.steal(2)  # w2 takes the child ...
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), True, 1)
    m.handle(m.workers[2], m.rings[(1, 2)].popleft(), False, 0)
    m.steal(1)  # ... and gives it back to w1 before running it
    m.handle(m.workers[2], m.rings[(1, 2)].popleft(), True, 1)
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), False, 0)  # the LOOT
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), False, 0)  # MOVED: held by w1
    assert [loan.holder for loan in m.workers[1].book.loans.values()] == [1]
    m.cancel_scope(1, 0)
    assert not any(m.rings.values())  # nothing sent, to myself or anyone
    m.run_one(1)  # the serialized task comes up: dropped, CancelledError to its parent
    (fut,) = [t.future for _, t in m.tasks.values()]
    assert isinstance(fut._exception, CancelledError)
    m.teardown()


def test_a_books_story_tells_a_lent_task_from_loan_to_re_run():
    """``LoanBook.story(tid)``: what the book did with a task, numbered by the event that
    did it; bounded (the oldest entries go first)."""
    from shoal.runtime import loans

    book = LoanBook(1, [2, 3])
    fut = Future.local((1 << OWNER_SHIFT) | 1)
    dq = deque([LocalTask(None, (), {}, fut, None, False)])
    book.answer(2, 0, dq, True, 0, lambda task, thief, gen: b"x")
    book.moved(3, 0, [fut.task_id])
    book.died(3, 0)
    story = book.story(fut.task_id)
    assert [e.what for e in story] == [loans.Stimulus.LENT, loans.Stimulus.MOVED,
                                       loans.Stimulus.RERUN]
    assert story[0].detail == (2, 0) and story[1].detail == (3, 0)
    assert story[1].stimulus < story[2].stimulus
    assert [e.what for e in book.story() if e.task is None] == [loans.Stimulus.DIED]
    for _ in range(loans.STORY_LIMIT):
        book.cancel_if_queued([7], {})
    assert len(book.story()) == loans.STORY_LIMIT and not book.story(fut.task_id)


def test_a_forked_child_forgets_its_loans_through_the_book():
    book = LoanBook(1, [2])
    fut = Future.local((1 << OWNER_SHIFT) | 1)
    book.answer(2, 0, deque([LocalTask(None, (), {}, fut, None, False)]), True, 0,
                lambda task, thief, gen: b"x")
    assert book.loans
    book.forked()
    assert not book.loans and book.story()[-1].detail == 1


def test_a_loot_that_dies_in_its_victims_outbox_takes_its_moved_with_it():
    """w2 holds w1's child and hands it on to w3, and dies with that LOOT still in its
    outbox.  The MOVED to w1 was held back behind it (Worker.carry), so it dies too: w1
    still sees w2 as the holder and re-runs the child at w2's death.  (Had the MOVED gone
    first, w1 would wait on w3, which never got the child: found by the SIGKILL storm,
    for a driver task.)"""
    m = LoansMachine()
    m.start()
    m.spawn(1, 0, False)
    m.steal(2)
    m.handle(m.workers[1], m.rings[(2, 1)].popleft(), True, 1)  # w1 lends the child to w2
    m.handle(m.workers[2], m.rings[(1, 2)].popleft(), False, 0)  # w2 has it (a WireTask)
    m.steal(3)  # w3 asks w1 first (nothing there), then w2
    m.handle(m.workers[1], m.rings[(3, 1)].popleft(), True, 1)
    m.handle(m.workers[3], m.rings[(1, 3)].popleft(), False, 0)
    m.steal(3)
    m.handle(m.workers[2], m.rings[(3, 2)].popleft(), True, 1)  # w2 hands it on to w3
    m.die(2, unsent=[0, 0, 1])  # the LOOT to w3 dies with w2, and the MOVED behind it
    assert not m.rings[(2, 1)] and not m.rings[(2, 3)]
    assert [loan.holder for loan in m.workers[1].book.loans.values()] == [2]
    m.teardown()
    assert m.runs == {1: 1}
