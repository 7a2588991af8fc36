"""``cancel()`` says True only for a task that will never run (the stdlib's contract),
also while other threads submit and cancel thousands of tasks at once (issue 13).

The race this guards: ``cancel()`` of a task no worker is running (its status slot is
clear) must still find a result the worker already sent.  It drained one round of the
worker rings (at most 256 messages each); behind a backlog the result lay further back,
the future was still PENDING, and cancel() said True for a task that had run.  Now it
drains up to the rings' tails as they were when it read the slots, and a worker clears
its slot only once the whole result is in its ring (a big result, fragmented, may wait
in its outbox).  The tasks write a side-effect file, the reference nobody here wrote.
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import random
import threading
import time

import pytest
from rt_tasks import mark, ran, until

import shoal
from shoal.runtime.worker import STATUS_DEPTH


def big_after_mark(path: str, i: int, size: int) -> bytes:
    mark(path, i)
    return bytes(size)


def idle(backend) -> bool:
    return all(not backend.matrix.status(ep)[STATUS_DEPTH] for ep in backend.endpoints)


def test_cancel_finds_a_result_deep_in_a_backlog_and_says_false(tmp_path):
    """Deterministic: the pump is held off (this thread holds the consumer lock), so 640
    results pile up in the rings, more than one drain round (256 a worker) takes.  Every
    task has run and no worker runs anything: cancel() must find each result and say
    False.  Before the fix the first cancel() here said True."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        backend = pilot._backend
        pilot.submit(mark, path, -1).result(60)  # workers up, the function defined
        with backend.consume_lock:  # the pump waits: results stay in the rings
            futs = [pilot.submit(mark, path, i) for i in range(640)]
            until(lambda: len(ran(path)) == 641, what="all tasks ran")
            until(lambda: idle(backend), what="workers idle")
            said = [fut.cancel() for fut in reversed(futs)]
        assert not any(said), f"cancel() said True for {sum(said)} tasks that ran"
        assert [f.result(60) for f in futs] == list(range(640))


def test_cancel_while_a_big_result_is_still_being_sent_says_false(tmp_path):
    """A result bigger than the worker's ring goes out in fragments; what does not fit
    waits in the worker's outbox until the driver reads.  The worker must keep the task's
    status slot until the last fragment is in the ring: cancelled in between, the task is
    "running" (cancel False), never "not running, no result" (cancel True)."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(1, ring_capacity=1 << 16) as pilot:
        backend = pilot._backend
        pilot.submit(mark, path, -1).result(60)
        with backend.consume_lock:
            fut = pilot.submit(big_after_mark, path, 0, 1 << 18)  # 4x the ring
            until(lambda: 0 in ran(path), what="the task ran")
            # Before the fix the slot cleared at once with fragments still in the outbox;
            # with it, it stays set until the driver reads (bounded wait either way).
            deadline = time.monotonic() + 1.0
            while not idle(backend) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert not fut.cancel(), "cancel() said True for a task that had run"
        assert len(fut.result(60)) == 1 << 18


def _submit_and_cancel(pilot, path: str, per_thread: int, threads: int = 3) -> tuple[list, dict]:
    """``threads`` threads submit ``mark`` tasks while one more cancels half of them."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    futs: list = []
    lock = threading.Lock()
    said: dict = {}
    rng = random.Random(13)

    def submitter(k: int) -> None:
        for i in range(k * 1_000_000, k * 1_000_000 + per_thread):
            f = pilot.submit(mark, path, i)
            f.arg = i
            q.put(f)
            with lock:
                futs.append(f)

    def canceller() -> None:
        for _ in range(threads * per_thread):
            f = q.get()
            if rng.random() < 0.5:
                said[f] = f.cancel()

    ts = [threading.Thread(target=submitter, args=(k,)) for k in range(threads)]
    ts.append(threading.Thread(target=canceller))
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return futs, said


def check_contract(futs: list, said: dict, path: str) -> None:
    done, not_done = cf.wait(futs, timeout=120)
    assert not not_done, f"{len(not_done)} futures never settled"
    runs = ran(path)
    assert all(n == 1 for n in runs.values()), "a task ran twice"
    bad = [f.arg for f in futs if f.cancelled() and f.arg in runs]
    assert not bad, f"cancel() said True but the task ran: {len(bad)} tasks, e.g. {bad[:5]}"
    lost = [f.arg for f in futs if not f.cancelled() and f.arg not in runs]
    assert not lost, f"not cancelled and never ran: {lost[:5]}"
    assert all(said[f] == f.cancelled() for f in said), "cancel()'s answer and the state differ"
    assert all(f.result() == f.arg for f in futs if not f.cancelled())


def test_three_submitters_and_a_canceller_bounded(tmp_path):
    """The issue's reproducer, small (the heavy one is behind ``-m slow``)."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        futs, said = _submit_and_cancel(pilot, path, 4000)
        check_contract(futs, said, path)
        assert not pilot._backend.tasks and not pilot._backend.staged


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(10))
def test_three_submitters_and_a_canceller_heavy(tmp_path, round_):
    """The s-break reproducer as it was (45,000 tasks); it failed 9 runs in 15 before."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        futs, said = _submit_and_cancel(pilot, path, 15000)
        check_contract(futs, said, path)


def _submit_while(pilot, path: str, per_thread: int, stop_after: int, action, threads: int = 3):
    """``threads`` threads submit ``mark`` tasks until the pilot refuses; once
    ``stop_after`` futures exist, ``action()`` runs (shutdown, close) on another thread."""
    futs: list = []
    lock = threading.Lock()
    refused: list = []
    acted = threading.Event()

    def submitter(k: int) -> None:
        for i in range(k * 1_000_000, k * 1_000_000 + per_thread):
            try:
                f = pilot.submit(mark, path, i)
            except (RuntimeError, shoal.PilotClosed) as exc:  # submit after shutdown
                refused.append(exc)
                return
            f.arg = i
            with lock:
                futs.append(f)
                if len(futs) == stop_after:
                    acted.set()

    ts = [threading.Thread(target=submitter, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    acted.wait(120)
    action()
    for t in ts:
        t.join(120)
    return futs, refused


def check_settled(futs: list, path: str) -> None:
    """Every future settled; a cancelled one never ran; one that ran has its own result
    (or, closed under it, PilotClosed: then it did not run either)."""
    done, not_done = cf.wait(futs, timeout=120)
    assert not not_done, f"{len(not_done)} futures never settled"
    runs = ran(path)
    assert all(n == 1 for n in runs.values()), "a task ran twice"
    bad = [f.arg for f in futs if f.cancelled() and f.arg in runs]
    assert not bad, f"cancelled but ran: {len(bad)} tasks, e.g. {bad[:5]}"
    for f in futs:
        if f.cancelled():
            continue
        if f.exception() is None:
            assert f.result() == f.arg and f.arg in runs
        else:
            assert isinstance(f.exception(), shoal.PilotClosed), f.exception()
            assert f.arg not in runs


@pytest.mark.parametrize("how", ["shutdown", "close"])
def test_shutdown_or_close_cancelling_under_concurrent_submitters(tmp_path, how):
    """``shutdown(cancel_futures=True)`` / ``close(cancel_pending=True)`` while three
    threads submit: the cancelled tasks never ran, the rest ran once (or, submitted
    as the pilot closed, failed with PilotClosed without running), nothing hangs."""
    path = str(tmp_path / "marks")
    pilot = shoal.Pilot(2)
    if how == "shutdown":
        def action():
            pilot.shutdown(wait=True, cancel_futures=True)
    else:
        def action():
            pilot.close(cancel_pending=True)
    try:
        futs, refused = _submit_while(pilot, path, 4000, 3000, action)
    finally:
        pilot.close()
    assert refused, "submit() after shutdown should have been refused"
    # (whether any task was still pending when the pilot closed depends on the machine's
    # speed: on an idle one all 12,000 may have run; the contract is checked either way)
    check_settled(futs, path)


def test_force_cancel_under_concurrent_submitters(tmp_path):
    """``pilot.cancel(fut, force=True)`` now and then, plain cancel() for half the rest,
    while three threads submit: a plain True still means never ran; forced ones are
    cancelled (their worker killed if it ran them) and every other future settles with
    its result: no task nobody cancelled dies with a forced kill (``mark`` tasks never
    nest, so a killed worker ran only the forced one; before, one that started just
    after the forced one ended could get ``WorkerLost``)."""
    path = str(tmp_path / "marks")
    with shoal.Pilot(2) as pilot:
        q: queue.SimpleQueue = queue.SimpleQueue()
        futs: list = []
        lock = threading.Lock()
        plain: dict = {}
        forced: dict = {}

        def submitter(k: int) -> None:
            for i in range(k * 1_000_000, k * 1_000_000 + 3000):
                f = pilot.submit(mark, path, i)
                f.arg = i
                q.put(f)
                with lock:
                    futs.append(f)

        def canceller() -> None:
            rng = random.Random(7)
            for n in range(9000):
                f = q.get()
                if n % 1500 == 700:
                    forced[f] = pilot.cancel(f, force=True)
                elif rng.random() < 0.5:
                    plain[f] = f.cancel()

        ts = [threading.Thread(target=submitter, args=(k,)) for k in range(3)]
        ts.append(threading.Thread(target=canceller))
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        done, not_done = cf.wait(futs, timeout=120)
        assert not not_done, f"{len(not_done)} futures never settled"
        runs = ran(path)
        assert all(n == 1 for n in runs.values()), "a task ran twice"
        bad = [f.arg for f, said in plain.items() if said and f.arg in runs]
        assert not bad, f"plain cancel() said True but the task ran: {bad[:5]}"
        assert all(f.cancelled() for f, said in forced.items() if said)
        for f in futs:
            if f.cancelled():
                continue
            if f.exception() is None:
                assert f.result() == f.arg and f.arg in runs
            else:
                assert isinstance(f.exception(), shoal.WorkerLost), f.exception()
        lost = [f.arg for f in futs if not f.cancelled() and f.exception() is not None]
        assert not lost, f"tasks nobody cancelled died with a forced kill: {lost[:5]}"
        # the pilot still works after its workers were replaced
        assert pilot.submit(mark, path, -5).result(60) == -5


def test_a_workers_cancelled_ids_forget_the_oldest_never_a_fresh_one():
    """Workers remember cancelled ids of queued tasks (CANCEL / CANCEL_IF_QUEUED) until the
    task comes up; entries for tasks that never come up pile up (a cancel goes to every
    worker).  The set was cleared whole past 100,000 entries, forgetting the cancels just
    made: those tasks then ran although cancel() had said True."""
    from shoal.runtime.loans import LoanBook

    book = LoanBook(1, [2])
    last = 100_005  # past the bound (100,000)
    for tid in range(1, last + 1):
        book.cancel([tid], {})
    assert last in book.cancelled and last - 1000 in book.cancelled
    assert 1 not in book.cancelled and len(book.cancelled) == 100_000


def test_two_threads_cancelling_one_future_both_get_true_and_nothing_raises(monkeypatch):
    """Two threads cancel the same pending future: the stdlib's cancel() lets both past
    (CANCELLED), and the loser's notify then met CANCELLED_AND_NOTIFIED and raised
    RuntimeError('Future in unexpected state'), with the backend told twice.  Forced
    interleaving: thread A stops between the state change and the notification."""
    import concurrent.futures as cf
    import threading

    from shoal.runtime.future import Future

    told = []
    fut = Future()
    fut._canceller = told.append
    original = cf.Future.cancel
    a_past_cancel, b_done = threading.Event(), threading.Event()

    def paused_cancel(self):
        answer = original(self)
        if threading.current_thread().name == "A":
            a_past_cancel.set()
            b_done.wait(10)
        return answer

    monkeypatch.setattr(cf.Future, "cancel", paused_cancel)
    answers = {}

    def a():
        try:
            answers["A"] = fut.cancel()
        except BaseException as exc:  # noqa: BLE001 - the bug under test
            answers["A"] = exc

    t = threading.Thread(target=a, name="A")
    t.start()
    assert a_past_cancel.wait(10)
    answers["B"] = fut.cancel()
    b_done.set()
    t.join(10)
    assert answers == {"A": True, "B": True}
    assert fut.cancelled() and told == [fut]
