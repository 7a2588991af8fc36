"""Stress and fault injection (opt-in: ``pytest -m slow``; size with SHOAL_STRESS_SCALE).

* tens of thousands of tiny nested tasks, checked against the closed-form count;
* random cancellation of running task trees while others go on;
* a worker SIGKILLed while it holds stolen work: nothing lost, results delivered once.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import rt_tasks as t

import shoal

pytestmark = pytest.mark.slow
SCALE = float(os.environ.get("SHOAL_STRESS_SCALE", "1"))


def _nodes(depth, fanout):
    return sum(fanout**d for d in range(depth + 1))


def test_tens_of_thousands_of_nested_tasks():
    depth = 7 if SCALE >= 1 else 6  # 4**7 leaves: 21,845 tasks (5,461 at small scale)
    with shoal.Pilot(workers=2) as pilot:
        for _ in range(max(1, int(3 * SCALE))):
            assert pilot.submit(t.tree_sum, depth, 4).result(300) == _nodes(depth, 4)
        stats = pilot.stats()["workers"]
        assert sum(w["tasks_run"] for w in stats) >= _nodes(depth, 4)


def test_random_cancellation():
    rng = random.Random(int(os.environ.get("SHOAL_SEED", "0")))
    with shoal.Pilot(workers=2) as pilot:
        futs = [pilot.submit(t.tree_sum, 5, 3) for _ in range(int(60 * SCALE) + 4)]
        victims = rng.sample(futs, len(futs) // 2)
        for f in victims:
            f.cancel()
            time.sleep(rng.random() * 0.01)
        for f in futs:
            if f.cancelled():
                continue
            assert f.result(120) == _nodes(5, 3)
        # the pilot is healthy afterwards
        assert pilot.submit(t.tree_sum, 4, 3).result(60) == _nodes(4, 3)


@pytest.mark.parametrize("round_", range(2))
def test_worker_killed_mid_steal(tmp_path, round_):
    pidfile = str(tmp_path / "root.pid")
    with shoal.Pilot(workers=2, seed=round_) as pilot:
        fut = pilot.submit(t.slow_tree_reporting, 4, 4, 0.002, pidfile)
        deadline = time.monotonic() + 30
        while not os.path.exists(pidfile) or not open(pidfile).read():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        root = int(open(pidfile).read().split()[0])
        thieves = [w["pid"] for w in pilot.stats()["workers"] if w["pid"] != root]
        time.sleep(0.15 + 0.1 * round_)  # let the thief take some of the tree
        os.kill(thieves[0], signal.SIGKILL)
        try:
            value = fut.result(60)
        except TimeoutError:
            pytest.fail(f"the tree never finished after the kill; workers: {pilot.stats()['workers']}")
        assert value == _nodes(4, 4)
        assert pilot.stats()["driver"]["worker_deaths"] == 1
        assert pilot.submit(t.tree_sum, 3, 3).result(60) == _nodes(3, 3)
