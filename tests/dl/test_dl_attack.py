"""Hostile inputs to shoal.workloads.dl, each a bug found by attacking it: every
test failed before its fix.  In-process trainers (pilot=None): the same code path decides."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.workloads import dl


def _data(n=20, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)), rng.integers(0, 3, n)


def _trainer(**kw):
    return dl.Trainer(dl.Sequential([dl.Linear(5, 7), dl.ReLU(), dl.Linear(7, 3)], seed=1), **kw)


def test_complex_inputs_are_refused_not_truncated():
    # Before: np.asarray(X, float64) dropped the imaginary part with a ComplexWarning and
    # the model trained on the real part as if nothing happened.
    X, y = _data()
    with pytest.raises(ValueError, match="X must hold real numbers, got dtype complex128"):
        _trainer().fit(X + 1j, y, epochs=1, batch_size=4)
    with pytest.raises(ValueError, match="X must hold real numbers"):
        _trainer().predict(X.astype(np.complex64))


def test_no_rows_is_named_and_predict_of_no_rows_is_empty():
    # Before: "cannot reshape array of size 0 into shape (0,newaxis)" from the NaN check,
    # for fit, evaluate and predict alike.
    X, y = _data()
    with pytest.raises(ValueError, match="fit: X has no rows"):
        _trainer().fit(X[:0], y[:0], epochs=1, batch_size=4)
    with pytest.raises(ValueError, match="evaluate: X has no rows"):
        _trainer().evaluate(X[:0], y[:0])
    out = _trainer().predict(X[:0])  # what the model's own forward gives for no rows
    assert out.shape == (0, 3) and out.dtype == np.float64


def test_a_batch_larger_than_the_data_is_the_whole_data():
    # Before: the arena's micro-batch buffers were sized by batch_size, not by the rows that
    # exist: batch_size=10**12 on 20 rows raised OSError ENOMEM (and 10**8 took GBs).
    X, y = _data()
    huge, whole = _trainer(), _trainer()
    huge.fit(X, y, epochs=2, batch_size=10**12)
    whole.fit(X, y, epochs=2, batch_size=len(X))
    assert all(np.array_equal(a, b) for a, b in zip(huge.parameters(), whole.parameters(),
                                                     strict=True))


@pytest.mark.parametrize("make", [
    lambda: dl.SGD(lr=float("nan")), lambda: dl.SGD(lr=float("inf")),
    lambda: dl.SGD(lr=0.1, weight_decay=float("nan")), lambda: dl.Adam(eps=float("nan")),
    lambda: dl.Adam(lr=float("nan")),
], ids=["sgd-lr-nan", "sgd-lr-inf", "sgd-wd-nan", "adam-eps-nan", "adam-lr-nan"])
def test_nan_and_inf_hyperparameters_are_refused_up_front(make):
    # Before: NaN passed every range check (NaN < 0 is False); the first step then failed
    # with "the loss is nan", blaming the learning rate or the inputs.
    with pytest.raises(ValueError, match="must be in"):
        make()


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed: pip install 'shoal[torch]' "
                               "(the CPU wheel torch==2.13.0)")


@pytest.mark.parametrize("norm", ["BatchNorm1d", "InstanceNorm1d-tracking"])
def test_torch_batch_statistics_are_refused_naming_the_layer(norm):
    # Before: accepted.  On a pilot the BatchNorm's running statistics stayed in the workers'
    # copies (the driver's module still had running_mean 0 and num_batches_tracked 0 after
    # fit, so predict() normalised wrongly), and a plan with R=2, M=2 moved the parameters
    # 0.018 away from one process on the whole batch (each micro-batch its own statistics).
    torch = _torch()
    layer = (torch.nn.BatchNorm1d(8) if norm == "BatchNorm1d"
             else torch.nn.Sequential(torch.nn.Unflatten(1, (1, 8)),
                                      torch.nn.InstanceNorm1d(1, track_running_stats=True),
                                      torch.nn.Flatten()))
    module = torch.nn.Sequential(torch.nn.Linear(5, 8), layer, torch.nn.ReLU(),
                                 torch.nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"layer 1 \((BatchNorm1d|InstanceNorm1d)\) normalises by "
                                         "batch statistics"):
        dl.TorchModule(module)
    dl.TorchModule(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.LayerNorm(8),
                                       torch.nn.Linear(8, 3)))  # per sample: fine


def test_torch_tied_weights_are_refused():
    # Before: each layer's copy of the shared weight was trained on its own and the last one
    # written back won: not what torch does with a tied parameter.
    torch = _torch()
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    b.weight = a.weight
    with pytest.raises(ValueError, match="layers 0 and 2 share a parameter"):
        dl.TorchModule(torch.nn.Sequential(a, torch.nn.ReLU(), b))


def test_torch_in_place_layer_at_a_stage_start_trains_like_any_cut():
    # Before: a stage starting with LeakyReLU(inplace=True) failed the whole fit with torch's
    # "a leaf Variable that requires grad is being used in an in-place operation" (the
    # backward recomputes the stage from its input as a leaf); in-place layers elsewhere
    # worked, so a cut by measured cost could break a model that trained on one stage.
    torch = _torch()
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(64, 6)).astype(np.float32), rng.integers(0, 3, 64)

    def module():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LeakyReLU(0.1, inplace=True),
                                   torch.nn.Linear(8, 3))

    params = []
    for plan in (dl.Plan(), dl.Plan(stages=2, shards=[[0], [1, 2]], micro_batches=2),
                 dl.Plan(stages=1, micro_batches=2)):
        trainer = dl.Trainer(dl.TorchModule(module()), optimizer=dl.SGD(lr=0.1), plan=plan)
        trainer.fit(X, y, epochs=2, batch_size=32)
        params.append(trainer.parameters())
    assert all(np.array_equal(a, b) for a, b in zip(params[1], params[2], strict=True))
    assert max(float(np.abs(a - b).max()) for a, b in zip(params[0], params[1], strict=True)) < 1e-6


def test_fits_of_one_trainer_from_two_threads_run_one_after_the_other():
    # Before: both fits stepped the same optimizer state at once; the history said 4 epochs
    # and the parameters equalled no serial run.
    import threading

    X, y = _data(400)
    shared, serial = _trainer(optimizer=dl.SGD(lr=0.05, momentum=0.9)), \
        _trainer(optimizer=dl.SGD(lr=0.05, momentum=0.9))
    gate = threading.Barrier(2)

    def fit():
        gate.wait()
        shared.fit(X, y, epochs=2, batch_size=8)

    threads = [threading.Thread(target=fit) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    serial.fit(X, y, epochs=4, batch_size=8)
    assert [r["epoch"] for r in shared.history] == [0, 1, 2, 3]
    assert all(np.array_equal(a, b) for a, b in zip(shared.parameters(), serial.parameters(),
                                                     strict=True))


def test_a_torch_layer_that_does_not_pickle_is_named():
    # Before: fit on a pilot raised pickle's bare "cannot pickle '_thread.lock' object",
    # naming neither the model nor the layer.
    import threading

    import shoal

    torch = _torch()

    class Locked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(5, 3)
            self.lock = threading.Lock()

        def forward(self, x):
            return self.lin(x)

    X, y = _data()
    with shoal.Pilot(1) as pilot:
        trainer = dl.Trainer(dl.TorchModule(torch.nn.Sequential(torch.nn.ReLU(), Locked())),
                             pilot=pilot)
        with pytest.raises(TypeError, match=r"cannot be sent to the workers .* layer 1 \(Locked\)"):
            trainer.fit(X.astype(np.float32), y, epochs=1, batch_size=4)
        assert pilot.submit(int, 3).result(timeout=30) == 3


def test_a_directory_as_checkpoint_is_named_without_advising_to_remove_it(tmp_path):
    # Before: "checkpoint '<dir>' cannot be read (Is a directory); remove it to start afresh":
    # advice to delete whatever directory was passed by mistake.
    X, y = _data()
    with pytest.raises(ValueError, match="is a directory; give a file path") as info:
        _trainer().fit(X, y, epochs=1, batch_size=4, checkpoint=str(tmp_path))
    assert "remove" not in str(info.value)
