"""SharedArray and BestCell: shared memory that tasks hold, with no names to leak."""

from __future__ import annotations

import numpy as np
import pytest
import rt_tasks as t  # noqa: F401  (the task module, as the other runtime tests)

import shoal


def fill_row(arr, i):
    arr.array[i, :] = i
    return float(arr.array[i].sum())


def offer_all(cell, values):
    return [cell.offer(v) for v in values]


def read(cell):
    return cell.value


def test_shared_array_written_by_workers():
    with shoal.Pilot(workers=2) as pilot, shoal.SharedArray((50, 8), "float64") as arr:
        sums = list(pilot.map(fill_row, [arr] * 50, range(50)))
        assert sums == [8.0 * i for i in range(50)]
        assert np.array_equal(arr.array, np.repeat(np.arange(50.0)[:, None], 8, axis=1))


def test_best_cell_max_and_min():
    with shoal.Pilot(workers=2) as pilot:
        best = shoal.BestCell.for_pilot(pilot, "max")
        futs = [pilot.submit(offer_all, best, [i, i * 3, -i]) for i in range(20)]
        [f.result(30) for f in futs]
        assert best.value == 57.0
        assert pilot.submit(read, best).result(30) == 57.0
        assert best.offer(100.0) is True and pilot.submit(read, best).result(30) == 100.0
        low = shoal.BestCell.for_pilot(pilot, shoal.Sense.MIN, initial=10.0)
        pilot.submit(offer_all, low, [3.0, 12.0]).result(30)
        assert low.value == 3.0
        best.close()
        low.close()


def test_bad_shapes():
    with pytest.raises(ValueError, match="shape"):
        shoal.SharedArray((-1, 2))
    with pytest.raises(ValueError):
        shoal.BestCell(3, "sideways")


def test_channel_tasks_to_driver():
    with shoal.Pilot(2) as pilot:
        chan = shoal.Channel.for_pilot(pilot, size=64)
        try:
            # one slot per worker: the second put waits for the driver to take the first
            assert pilot.submit(t.channel_put, chan, [b"one", b"two"]).result(30) == [True, False]
            assert chan.get() == [b"one"]
            assert chan.get() == []
            assert pilot.submit(t.channel_put, chan, [b"three"]).result(30) == [True]
            assert chan.get() == [b"three"]
            with pytest.raises(ValueError, match="at most 64 bytes"):
                pilot.submit(t.channel_put, chan, [b"x" * 65]).result(30)
        finally:
            chan.close()
