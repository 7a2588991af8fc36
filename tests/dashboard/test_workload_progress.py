"""Training and transactional streams publish their per-epoch / per-batch records to the
progress board (what the dashboard's progress page charts), equal to what they return."""

from __future__ import annotations

import numpy as np
import pytest

import shoal
from shoal.runtime.progress import BOARD


def test_training_publishes_one_record_per_epoch_with_its_plan():
    from shoal.workloads import dl

    rng = np.random.default_rng(0)
    X = rng.normal(size=(96, 8))
    y = (X[:, 0] > 0).astype(np.int64)
    model = dl.Sequential([dl.Linear(8, 16), dl.ReLU(), dl.Linear(16, 2)], seed=0)
    before = len(BOARD.records("train"))
    with shoal.Pilot(2) as pilot:
        trainer = dl.Trainer(model, loss="cross_entropy", optimizer=dl.SGD(lr=0.1), pilot=pilot,
                             plan=dl.Plan(replicas=1, stages=2, micro_batches=2, schedule="1f1b"))
        history = trainer.fit(X, y, epochs=3, batch_size=32)
    recs = BOARD.records("train")[before:]
    assert [r["epoch"] for r in recs] == [h["epoch"] for h in history] == [0, 1, 2]
    assert [r["loss"] for r in recs] == pytest.approx([h["loss"] for h in history])
    assert all(r["stages"] == 2 and r["micro_batches"] == 2 and r["schedule"] == "1f1b" for r in recs)


def test_a_stream_publishes_one_record_per_batch():
    from shoal.workloads import txstream as ts
    from shoal.workloads.txstream.apps import sl

    evs = sl.events(300, 24, theta=0.9, abort=0.3, seed=5)
    store = ts.Store(sl.tables(24))
    before = len(BOARD.records("txstream"))
    try:
        with shoal.Pilot(2) as pilot:
            rep = ts.Engine(store, pilot=pilot, scheduler="adaptive", punctuation=100).run(evs)
    finally:
        store.close()
    recs = BOARD.records("txstream")[before:]
    assert [r["batch"] for r in recs] == [b.batch for b in rep.batches]
    assert sum(r["events"] for r in recs) == 300
    assert sum(r["aborted"] for r in recs) == len(rep.aborted)
    assert all(r["events_per_s"] > 0 and r["latency_p99"] >= r["latency_p50"] for r in recs)
