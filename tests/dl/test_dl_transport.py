"""``dl.Transport.FUTURES`` (tasks exchange arrays as results: the path a pilot with workers
on other hosts takes) against the shared arena and the in-process run, on real local pilots:
bitwise the same parameters, a SIGKILLed worker retried bitwise, checkpoints, bad input.
The same on real hosts: tests/multihost/test_multihost_workloads.py (-m multihost)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from dl_models import KillOnce, digits, mlp, same

import shoal
from shoal.workloads import dl

Xtr, Xte, ytr, yte = digits(400)
FUTURES = dl.Transport.FUTURES


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def fit(plan, pilot=None, transport=None, model=None, opt=None, epochs=2, **kw):
    trainer = dl.Trainer(model or mlp(), optimizer=opt or dl.SGD(lr=0.1, momentum=0.9,
                                                                 weight_decay=1e-3),
                         plan=plan, pilot=pilot, transport=transport)
    trainer.fit(Xtr, ytr, epochs=epochs, batch_size=32, shuffle=True, seed=4, **kw)
    return trainer


PLANS = {
    "data-1": dl.Plan(),
    "data-3-tree": dl.Plan(replicas=3, micro_batches=2),
    "hybrid-1f1b": dl.Plan(replicas=2, stages=2, micro_batches=4),
    "hybrid-gpipe": dl.Plan(replicas=2, stages=3, micro_batches=3, schedule="gpipe"),
    "data-5-tree": dl.Plan(replicas=5, stages=2, micro_batches=1),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_futures_give_the_arena_bits(pilot2, name):
    plan = PLANS[name]
    serial = fit(plan)
    arena = fit(plan, pilot2)
    futures = fit(plan, pilot2, FUTURES)
    inline = fit(plan, None, FUTURES)
    assert arena._transport() is dl.Transport.ARENA  # (a local pilot: the arena by default)
    for other in (arena, futures, inline):
        assert same(serial.parameters(), other.parameters())
        assert [r["loss"] for r in other.history] == [r["loss"] for r in serial.history]
    assert np.array_equal(futures.predict(Xte), arena.predict(Xte))


def test_adam_and_dropout_across_transports(pilot2):
    def model():
        return dl.Sequential([dl.Linear(64, 32), dl.ReLU(), dl.Dropout(0.3), dl.Linear(32, 10)],
                             seed=2)

    plan = dl.Plan(replicas=3, stages=2, micro_batches=2)
    arena = fit(plan, pilot2, model=model(), opt=dl.Adam(lr=0.01))
    futures = fit(plan, pilot2, FUTURES, model=model(), opt=dl.Adam(lr=0.01))
    assert same(arena.parameters(), futures.parameters())


def test_predict_is_bitwise_on_any_pilot_size(pilot2):
    """Predict tasks get a fixed number of rows: before, chunks sized by the worker count
    gave outputs that differed in the last bit between a 1- and a 2-worker pilot."""
    trainer = fit(dl.Plan(stages=2))
    X = digits()[1]  # 450 rows: 113-row chunks on 1 worker, 64 on 2 before
    with shoal.Pilot(workers=1) as one:
        trainer.pilot = one
        on1 = trainer.predict(X)
    trainer.pilot = pilot2
    assert np.array_equal(on1, trainer.predict(X))


def test_a_sigkilled_worker_is_retried_bitwise(tmp_path):
    marker = str(tmp_path / "killed")

    def model():
        return dl.Sequential([dl.Linear(64, 32), dl.ReLU(), KillOnce(marker, after=5),
                              dl.Linear(32, 10)], seed=0)

    plan = dl.Plan(replicas=3, stages=2, micro_batches=2)
    undisturbed = fit(plan, model=model())
    with shoal.Pilot(workers=2) as pilot:
        disturbed = fit(plan, pilot, FUTURES, model=model())
        deaths = pilot.stats()["driver"]["worker_deaths"]
    assert os.path.exists(marker), "the worker was never killed"
    assert same(undisturbed.parameters(), disturbed.parameters())
    assert deaths == 1


def test_checkpoint_resume_with_futures(tmp_path, pilot2):
    path = str(tmp_path / "fit.npz")
    plan = dl.Plan(replicas=2, stages=2, micro_batches=2)
    whole = fit(plan, epochs=3, opt=dl.Adam(lr=0.01))
    first = fit(plan, pilot2, FUTURES, epochs=1, opt=dl.Adam(lr=0.01), checkpoint=path)
    again = dl.Trainer(mlp(), optimizer=dl.Adam(lr=0.01), plan=plan, pilot=pilot2,
                       transport=FUTURES)
    again.fit(Xtr, ytr, epochs=2, batch_size=32, shuffle=True, seed=4, checkpoint=path,
              resume=True)
    assert first.step < again.step == whole.step
    assert same(whole.parameters(), again.parameters())


def test_a_bad_transport_is_named():
    with pytest.raises(TypeError, match=r"transport must be None .*dl\.Transport\.FUTURES.*'futures'"):
        dl.Trainer(mlp(), transport="futures")


class Slow(dl.Layer):
    """An identity layer that sleeps in training forwards on a worker."""

    def forward(self, params, x, ctx):
        import time

        if ctx.train and shoal.current_worker() is not None:
            time.sleep(2)
        return x

    def __repr__(self):
        return "Slow()"


def test_a_step_that_never_returns_fails_the_fit_instead_of_hanging(pilot2, monkeypatch):
    from shoal.workloads.dl.across_hosts import HostEpoch

    monkeypatch.setattr(HostEpoch, "STEP_LIMIT_S", 0.5)
    model = dl.Sequential([dl.Linear(64, 10), Slow()], seed=0)
    trainer = dl.Trainer(model, plan=dl.Plan(replicas=2), pilot=pilot2, transport=FUTURES)
    with pytest.raises(TimeoutError, match=r"step 0 \(epoch rows 0\.\.32\) did not finish within 0.5 s"):
        trainer.fit(Xtr, ytr, epochs=1, batch_size=32)
    assert trainer.step == 0 and not trainer.history


def test_torch_module_with_futures_gives_the_arena_bits(pilot2):
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install "
                                                "'shoal[torch]' (the CPU wheel, docs/dl.md)")

    def model():
        torch.manual_seed(0)
        return dl.TorchModule(torch.nn.Sequential(
            torch.nn.Linear(64, 32), torch.nn.ReLU(inplace=True), torch.nn.Linear(32, 10)
        ).to(torch.float64))

    plan = dl.Plan(replicas=3, stages=2, micro_batches=2)
    arena = fit(plan, pilot2, model=model())
    futures = fit(plan, pilot2, FUTURES, model=model())
    assert same(arena.parameters(), futures.parameters())
    assert np.array_equal(arena.predict(Xte), futures.predict(Xte))
