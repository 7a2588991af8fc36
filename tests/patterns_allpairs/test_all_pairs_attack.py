"""all_pairs attacked: Ctrl-C in the driver stops the abandoned run's tiles."""

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


def test_a_result_larger_than_the_machine_is_refused_before_anything_runs(tmp_path):
    # Before: the result's shared memory (or .npy memmap) is sparse, so a 32 TB result was
    # allocated without a word and the workers found out page by page (here only because
    # a strip's temporary block raised MemoryError first; on a result a little larger than
    # RAM the OOM killer or SIGBUS), where squareform(pdist(X)) raises MemoryError at once.
    n = 2_000_000
    with shoal.Pilot(1) as pilot:
        with pytest.raises(MemoryError, match=r"the 2000000 x 2000000 result needs 29802.3 GiB"):
            all_pairs.compute(pilot, list(range(n)), t.euclidean)
        with pytest.raises(MemoryError, match="condensed result of 2000000 items needs"):
            all_pairs.compute(pilot, np.zeros((n, 1)), block=t.block_euclidean, condensed=True)
        with pytest.raises(OSError, match="needs 29802.3 GiB, but its file system has"):
            all_pairs.compute(pilot, list(range(n)), t.euclidean, out=str(tmp_path / "d.npy"))
        with pytest.raises(MemoryError, match=r"top_k=1000000000000 for 5 rows"):
            all_pairs.compute(pilot, list(range(5)), t.euclidean, top_k=10**12)
        assert pilot.stats()["workers"][0].get("tasks_run", 0) == 0
        assert not (tmp_path / "d.npy").exists()


@pytest.mark.parametrize("option", ["tile", "cache_bytes", "top_k"])
def test_true_is_not_a_size(option):
    # Before: True passed the int checks (bool is an int) and meant 1: tile=True made one
    # task per pair, cache_bytes=True a 1-byte cache, top_k=True the single best column.
    with shoal.Pilot(1) as pilot:
        with pytest.raises(ValueError, match=f"{option} must be a positive int"):
            all_pairs.compute(pilot, [1.0, 2.0], t.euclidean, **{option: True})


@pytest.mark.timeout(180)
@pytest.mark.parametrize("out", ["array", "callback"])
def test_a_tile_run_again_after_its_thief_was_killed_counts_once(tmp_path, out):
    """A worker that stole the far end of the matrix is SIGKILLed after it finished at
    least one leaf tile; the stolen subtree runs again elsewhere (the loan comes home).
    The matrix was right, but before, ``stats.pairs`` counted the re-run tiles twice
    (86,252 for 80,200 pairs): it must be the pairs of the result, each once."""
    import signal
    import threading

    n = 64
    folder = str(tmp_path)
    compare = functools.partial(t.killable_compare, folder)
    thief = os.path.join(folder, "thief")
    killed = []

    def kill_the_thief():
        deadline = time.monotonic() + 90
        while not os.path.exists(thief) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the pid is written right after the file is made
        if os.path.exists(thief):
            with open(thief) as f:
                pid = int(f.read())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    tiles = {}
    with shoal.Pilot(2) as pilot:
        killer = threading.Thread(target=kill_the_thief)
        killer.start()
        try:
            if out == "array":
                got = all_pairs.compute(pilot, list(range(n)), compare, tile=8)
            else:
                got = all_pairs.compute(pilot, list(range(n)), compare, tile=8,
                                        out=lambda i0, j0, tile: tiles.__setitem__((i0, j0), tile))
        finally:
            killer.join()
    assert killed, "no worker stole work from the blocked root task"
    want = np.add.outer(np.arange(n) * 1000, np.arange(n)).astype(float)
    want = np.triu(want) + np.triu(want, 1).T  # symmetric: (i, j) = compare(i, j) for i <= j
    if out == "array":
        np.testing.assert_array_equal(got, want)
    else:
        assert len(tiles) == 64
        for (i0, j0), tile in tiles.items():
            np.testing.assert_array_equal(tile, want[i0:i0 + 8, j0:j0 + 8])
    assert got.stats.pairs == n * (n + 1) // 2
    assert got.stats.tiles == 36  # 8 x 8 tiles of a 64-item triangle: 8 + 28
    assert sum(w["pairs"] for w in got.stats.per_worker) > got.stats.pairs  # the work redone
