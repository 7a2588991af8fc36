"""all_pairs attacked (r-break): Ctrl-C in the driver stops the abandoned run's tiles."""

from __future__ import annotations

import functools
import os
import time

import ap_tasks as t
import numpy as np
import pytest

import shoal
from shoal.patterns import all_pairs
from shoal.runtime.progress import BOARD


def test_ctrl_c_in_the_driver_stops_the_tiles_of_the_abandoned_matrix(tmp_path):
    # Before: KeyboardInterrupt left the root tile running; every spawned tile went on
    # computing the abandoned matrix (all 20,100 pairs), and the next call on the pilot
    # queued behind it.  The interrupt is raised at the driver's first progress tick (a
    # board subscriber: deterministic), when the first tiles (items 0..7) are done, so the
    # workers hold every array of the run, and the other tiles wait on a gate file.
    gate, log = str(tmp_path / "gate"), str(tmp_path / "calls")
    compare = functools.partial(t.gated_euclidean, gate, log)
    items = list(enumerate(np.random.default_rng(0).normal(size=(200, 3))))

    def interrupt(topic, record):
        if topic == "all_pairs" and record.get("state") == "running" and record.get("pairs"):
            raise KeyboardInterrupt

    with shoal.Pilot(1) as pilot:  # one worker: it holds every array of the run by then
        unsubscribe = BOARD.subscribe(interrupt)
        try:
            with pytest.raises(KeyboardInterrupt):
                all_pairs.compute(pilot, items, compare, tile=4)
        finally:
            unsubscribe()
        open(gate, "w").close()
        deadline = time.monotonic() + 60
        while pilot.stats()["driver"]["outstanding"] and time.monotonic() < deadline:
            time.sleep(0.05)
        calls = os.path.getsize(log) if os.path.exists(log) else 0
        assert calls < 200 * 201 // 4, f"{calls} of {200 * 201 // 2} pairs computed after Ctrl-C"
        again = all_pairs.compute(pilot, [v for _, v in items[:5]], t.euclidean)
        assert again.shape == (5, 5)
