"""``shoal.backends.dask.claims.Claims``: the node side of the cancel handshake, as pure
policy, with real ``concurrent.futures.Future`` objects standing for the node runtime's
futures (their ``cancel()`` is the stdlib's: True while pending, False once running)."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from shoal.backends.dask.claims import Claims, Fate, Verdict


def test_tombstone_refuses_a_later_start():
    c = Claims()
    assert c.cancel(["k"]) == {"k": Verdict.TAKEN}
    assert c.start("k", lambda: cf.Future()) is None  # never submitted
    c.finish("k")
    assert c.cancel(["k"]) == {"k": Verdict.TAKEN}  # a retry is refused too


def test_queued_is_taken_back_running_is_not():
    c = Claims()
    queued, running = cf.Future(), cf.Future()
    running.set_running_or_notify_cancel()
    assert c.start("q", lambda: queued) is queued and c.start("r", lambda: running) is running
    assert c.started(["q", "r"]) == ["r"]
    assert c.cancel(["q", "r"]) == {"q": Verdict.TAKEN, "r": Verdict.STARTED}
    assert queued.cancelled() and not running.cancelled()


def test_done_and_batches_answer_started():
    c = Claims()
    c.start("b", lambda: Fate.STARTED)
    assert c.cancel(["b"]) == {"b": Verdict.STARTED}
    f = cf.Future()
    c.start("d", lambda: f)
    f.set_running_or_notify_cancel()
    f.set_result(1)
    c.finish("d")
    assert c.cancel(["d"]) == {"d": Verdict.STARTED} and c.started(["d"]) == ["d"]


def test_pruned_done_answers_from_dask_state():
    c = Claims()
    c.start("d", cf.Future)
    c.finish("d")
    c.prune(lambda key: False)  # dask released it
    assert "d" not in c.entries
    assert c.cancel(["d"], state=lambda key: "memory") == {"d": Verdict.STARTED}


def test_prune_is_oldest_first_and_stops_at_a_held_key():
    c = Claims()
    for k in "abc":
        c.start(k, cf.Future)
        c.finish(k)
    c.prune(lambda key: key == "b")
    assert set(c.entries) == {"b", "c"}
    c.prune(lambda key: False)
    assert c.entries == {}


def test_forget_lifts_only_tombstones():
    c = Claims()
    c.cancel(["t"])
    c.start("s", lambda: Fate.STARTED)
    c.forget(["t", "s"])
    assert "t" not in c.entries and c.entries["s"] is Fate.STARTED
    assert c.start("t", lambda: Fate.STARTED) is Fate.STARTED  # runs after all


def test_start_and_cancel_race_one_winner():
    """Threads start and cancel the same keys: every key is either taken (never
    submitted, or its future cancelled) or reported started, never both."""
    for _ in range(20):
        _race_once([f"k{i}" for i in range(200)])


def _race_once(keys):
    c = Claims()
    submitted, verdicts = {}, {}

    def starter():
        for k in keys:
            f = c.start(k, cf.Future)
            if f is not None:
                submitted[k] = f
                f.set_running_or_notify_cancel()  # a worker takes it at once

    def canceller():
        for k in keys:
            verdicts.update(c.cancel([k]))

    threads = [threading.Thread(target=starter), threading.Thread(target=canceller)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    for k in keys:
        ran = k in submitted and not submitted[k].cancelled()
        assert ran == (verdicts[k] is Verdict.STARTED), k


def test_a_round_the_driver_gave_up_on_takes_nothing():
    """A stopped worker answers a claim round after the driver said False: the round must
    take nothing (the task then runs; before, its late tombstone refused it and the future
    ended cancelled).  The give-up may arrive before or after the round itself."""
    c = Claims()
    queued = cf.Future()
    c.start("q", lambda: queued)
    c.give_up(7, ["q", "t"])  # the give-up overtook the round
    assert c.cancel(["q", "t"], round_id=7) == {"q": Verdict.STARTED, "t": Verdict.STARTED}
    assert not queued.cancelled() and "t" not in c.entries
    assert c.cancel(["t"], round_id=8) == {"t": Verdict.TAKEN}  # the round came first
    c.give_up(8, ["t"])
    assert "t" not in c.entries  # its tombstone is lifted: a start is not refused
    assert c.start("t", lambda: cf.Future()) is not None


@pytest.mark.parametrize("verdict", [True, False])
def test_a_taken_task_without_a_verdict_asks_the_scheduler_once_its_wait_is_over(verdict):
    """``settle_taken`` is bounded: neither a ``give_up`` nor dask's release came by the
    round's deadline plus ``VERDICT_WAIT_S`` -- the scheduler decides (True: the rounds are
    void, the task is revived and runs; False: a round confirmed, it stays cancelled).  A
    scheduler that cannot be reached is asked again later."""
    c = Claims()
    queued = cf.Future()
    c.start("q", lambda: queued)
    assert c.cancel(["q"], round_id=3, until=0.0) == {"q": Verdict.TAKEN}
    asked, answers = [], [RuntimeError("no scheduler"), verdict]

    def arbitrate(key, rids):
        asked.append((key, rids))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    import shoal.backends.dask.claims as claims_mod

    real = claims_mod.VERDICT_WAIT_S
    claims_mod.VERDICT_WAIT_S = 0.0
    try:
        got = c.settle_taken("q", lambda: True, arbitrate, poll_s=0.001)
    finally:
        claims_mod.VERDICT_WAIT_S = real
    assert got is verdict and asked == [("q", [3]), ("q", [3])] and "q" not in c.taken
    assert c.cancel(["q"], round_id=3) == {"q": Verdict.STARTED if verdict else Verdict.TAKEN}


def test_a_round_past_its_deadline_takes_nothing():
    from shoal.backends.dask import node

    token = "deadline-test"
    try:
        assert node.cancel_keys(token, ["k"], 1, deadline=0.0) == {"k": Verdict.STARTED.value}
        assert "k" not in node.claims_of(token).entries
        assert node.cancel_keys(token, ["k"], 2, deadline=None) == {"k": Verdict.TAKEN.value}
    finally:
        with node._lock:
            node._claims.pop(token, None)


def test_the_scheduler_function_travels_by_value(tmp_path):
    """``locate`` runs on the scheduler, which need not have shoal installed: it is pickled
    by value (an interpreter where importing shoal fails loads and calls it) and imports
    nothing of shoal.  The probe runs this test's own interpreter (``sys.executable``: the
    cloudpickle that pickled it is there) with shoal blocked in ``sys.modules``, since CI
    installs shoal into that interpreter and its absence cannot be assumed."""
    import os
    import subprocess
    import sys

    import cloudpickle

    from shoal.backends.dask import cancel, on_scheduler

    assert cancel.on_scheduler is on_scheduler
    blob = cloudpickle.dumps(on_scheduler.locate)
    probe = ("import pickle, sys, types\n"
             "sys.modules['shoal'] = None  # any import of shoal fails (CI installs it)\n"
             "locate = pickle.loads(sys.stdin.buffer.read())\n"
             "assert not [m for m in sys.modules if m.startswith('shoal.')], 'shoal imported'\n"
             "sched = types.SimpleNamespace(tasks={}, workers={})\n"
             "print(locate(['k'], {}, 'c', dask_scheduler=sched)['k'])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", probe], input=blob, capture_output=True,
                         cwd=tmp_path, env=env, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == 'missing'
