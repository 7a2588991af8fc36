"""Training runs: a single-process plan against a plain numpy loop, every plan against the
single-process result, bitwise reproducibility across worker counts, and the failures a
user meets (bad input, NaN loss, a worker SIGKILLed mid-epoch, the driver SIGKILLed).

Real worker processes and real shared memory throughout; the small runs here keep the
default suite light, the 15-epoch digits runs are in test_dl_digits.py (marker dl_slow).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from dl_models import KillOnce, digits, maxdiff, mlp, reference_fit, same

import shoal
from shoal.workloads import dl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
Xtr, Xte, ytr, yte = digits(400)  # 300 training rows, 100 test rows
HYBRID = dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="1f1b")


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


@pytest.fixture(scope="module")
def pilot1():
    with shoal.Pilot(workers=1) as p:
        yield p


def fit(plan=None, pilot=None, model=None, epochs=2, batch_size=32, opt=None, **kw):
    model = model or mlp()
    opt = opt or dl.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3)
    trainer = dl.Trainer(model, optimizer=opt, plan=plan, pilot=pilot)
    trainer.fit(Xtr, ytr, epochs=epochs, batch_size=batch_size, **kw)
    return trainer


# -- references ----------------------------------------------------------------------
@pytest.mark.parametrize("opt, ref", [
    (dl.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3), {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
    (dl.SGD(lr=0.2), {"kind": "sgd", "lr": 0.2, "momentum": 0.0, "weight_decay": 0.0}),
    (dl.Adam(lr=0.01, weight_decay=1e-4), {"kind": "adam", "lr": 0.01, "weight_decay": 1e-4}),
], ids=["sgd-momentum", "sgd", "adam"])
def test_single_process_plan_matches_a_plain_numpy_loop(opt, ref):
    start = mlp().parameters()
    trainer = fit(dl.Plan(), opt=opt, epochs=3, batch_size=48)  # 300 rows: the last batch is short
    expected = reference_fit(start, Xtr, ytr, 3, 48, ref)
    assert maxdiff(trainer.parameters(), expected) < 1e-8
    assert trainer.step == 3 * 7


def test_one_data_parallel_step_is_the_whole_batch_gradient():
    one = fit(dl.Plan(), epochs=1, batch_size=300, opt=dl.SGD(lr=1.0))
    four = fit(dl.Plan(replicas=4, micro_batches=3), epochs=1, batch_size=300, opt=dl.SGD(lr=1.0))
    assert maxdiff(one.parameters(), four.parameters()) < 1e-14


@pytest.mark.parametrize("plan", [
    dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="1f1b"),
    dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="gpipe"),
    dl.Plan(replicas=3, stages=3, micro_batches=2),  # M < S
    dl.Plan(stages=5, micro_batches=1),  # M = 1, every layer a stage
    dl.Plan(replicas=5, micro_batches=3),  # 5 x 3 micro-batches of a 32-row batch: some hold 2 rows
], ids=["1f1b", "gpipe", "M<S", "M=1", "R=5"])
def test_every_plan_matches_the_single_process_plan(plan):
    single = fit(dl.Plan())
    other = fit(plan)
    assert maxdiff(single.parameters(), other.parameters()) < 1e-10


def test_empty_micro_batches_are_harmless():
    # the last batch has 300 % 64 = 44 rows over 8 x 8 = 64 micro-batches: many are empty
    single = fit(dl.Plan(), batch_size=64)
    wide = fit(dl.Plan(replicas=8, stages=2, micro_batches=8), batch_size=64)
    assert maxdiff(single.parameters(), wide.parameters()) < 1e-10


def test_schedule_and_cut_do_not_change_a_bit():
    base = fit(dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="1f1b")).parameters()
    for plan in (dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="gpipe"),
                 dl.Plan(replicas=2, micro_batches=4, shards=[[0], [1, 2, 3, 4]]),
                 dl.Plan(replicas=2, micro_batches=4, shards=[[0, 1, 2], [3], [4]])):
        assert same(base, fit(plan).parameters()), plan


# -- on worker processes ---------------------------------------------------------------
def test_bitwise_equal_on_1_and_2_workers_and_in_process(pilot1, pilot2):
    inline = fit(HYBRID, model=mlp(), shuffle=True, seed=4)
    one = fit(HYBRID, pilot1, model=mlp(), shuffle=True, seed=4)
    two = fit(HYBRID, pilot2, model=mlp(), shuffle=True, seed=4)
    assert same(inline.parameters(), one.parameters())
    assert same(inline.parameters(), two.parameters())
    assert inline.history[-1]["loss"] == two.history[-1]["loss"]


def test_dropout_is_seeded_and_reproducible(pilot2):
    def model():
        return dl.Sequential([dl.Linear(64, 32), dl.ReLU(), dl.Dropout(0.3), dl.Linear(32, 10)], seed=1)

    a = fit(HYBRID, pilot2, model=model(), epochs=1)
    b = fit(dl.Plan(), None, model=model(), epochs=1)  # masks do not depend on the plan's split
    assert maxdiff(a.parameters(), b.parameters()) < 1e-10
    c = fit(HYBRID, pilot2, model=dl.Sequential([dl.Linear(64, 32), dl.ReLU(), dl.Dropout(0.3),
                                                 dl.Linear(32, 10)], seed=2), epochs=1)
    assert maxdiff(a.parameters(), c.parameters()) > 1e-3


def test_predict_and_evaluate_on_the_pilot(pilot2):
    trainer = fit(HYBRID, pilot2, epochs=3)
    z = trainer.predict(Xte)
    assert np.allclose(z, trainer.model.forward(Xte), rtol=0, atol=1e-12)
    acc = trainer.evaluate(Xte, yte)
    assert acc == float((z.argmax(1) == yte).mean()) and acc > 0.5


def test_float32_parameters_stay_float32(pilot2):
    model = mlp()
    model.set_parameters([p.astype(np.float32) for p in model.parameters()])
    trainer = fit(HYBRID, pilot2, model=model, epochs=1)
    assert all(p.dtype == np.float32 for p in trainer.parameters())
    ref = mlp()
    ref.set_parameters([p.astype(np.float32) for p in ref.parameters()])
    assert same(trainer.parameters(), fit(HYBRID, None, model=ref, epochs=1).parameters())


def test_cnn_on_the_pilot_matches_in_process(pilot2):
    from dl_models import cnn

    Xi, _, yi, _ = digits(160, image=True)
    runs = []
    for pilot in (None, pilot2):
        trainer = dl.Trainer(cnn(), optimizer=dl.Adam(lr=0.01), pilot=pilot,
                             plan=dl.Plan(replicas=2, stages=2, micro_batches=2))
        trainer.fit(Xi, yi, epochs=1, batch_size=40)
        runs.append(trainer.parameters())
    assert same(*runs)
    single = dl.Trainer(cnn(), optimizer=dl.Adam(lr=0.01))
    single.fit(Xi, yi, epochs=1, batch_size=40)
    assert maxdiff(single.parameters(), runs[0]) < 1e-10


def test_mse_loss(pilot2):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((96, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3
    model = dl.Sequential([dl.Linear(3, 1)], seed=0)
    trainer = dl.Trainer(model, loss="mse", optimizer=dl.SGD(lr=0.1), pilot=pilot2,
                         plan=dl.Plan(replicas=2, micro_batches=2))
    trainer.fit(X, y, epochs=30, batch_size=16)
    W, b = trainer.parameters()
    assert np.allclose(W.ravel(), [1.0, -2.0, 0.5], atol=1e-3) and abs(b[0] - 0.3) < 1e-3
    assert trainer.evaluate(X, y) < 1e-5


def test_history_and_callback():
    seen = []
    trainer = dl.Trainer(mlp(), optimizer=dl.SGD(lr=0.1, momentum=0.9))
    history = trainer.fit(Xtr, ytr, epochs=3, batch_size=32, callback=seen.append)
    assert history is trainer.history and [r["epoch"] for r in history] == [0, 1, 2]
    assert seen == history
    for r in history:
        assert {"epoch", "step", "loss", "accuracy", "samples", "seconds", "samples_per_s"} <= set(r)
        assert r["samples"] == len(Xtr) and 0 <= r["accuracy"] <= 1
    assert history[-1]["loss"] < history[0]["loss"]
    trainer.fit(Xtr, ytr, epochs=1, batch_size=32)  # fit again: goes on from here
    assert len(trainer.history) == 4 and trainer.history[-1]["step"] == 4 * 10
    assert trainer.history[-1]["epoch"] == 3  # numbered over all fits


# -- bad input -----------------------------------------------------------------------
def test_bad_inputs_are_named():
    trainer = dl.Trainer(mlp())
    with pytest.raises(ValueError, match=r"label y\[3\] = 12 is out of range: the last layer "
                                         r"layer 4 \(Linear\(32, 10\)\) has 10 outputs"):
        y = ytr.copy()
        y[3] = 12
        trainer.fit(Xtr, y)
    with pytest.raises(ValueError, match=r"label y\[0\] = -1"):
        trainer.fit(Xtr, np.r_[-1, ytr[1:]])
    with pytest.raises(dl.ShapeError, match=r"layer 0 \(Linear\(64, 32\)\).*from the input X"):
        trainer.fit(Xtr[:, :60], ytr)
    with pytest.raises(ValueError, match="y must be shaped"):
        trainer.fit(Xtr, ytr[:-1])
    with pytest.raises(ValueError, match="X holds NaN or inf .first at row 2"):
        X = Xtr.copy()
        X[2, 5] = np.nan
        trainer.fit(X, ytr)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        trainer.fit(Xtr, ytr, batch_size=0)
    with pytest.raises(ValueError, match="unknown loss='hinge'"):
        dl.Trainer(mlp(), loss="hinge")
    with pytest.raises(TypeError, match="optimizer must be dl.SGD or dl.Adam"):
        dl.Trainer(mlp(), optimizer="sgd")
    with pytest.raises(ValueError, match="SGD lr must be"):
        dl.SGD(lr=-1)


@pytest.mark.parametrize("where", ["in-process", "pilot"])
def test_nan_loss_is_a_clear_error(where, pilot2):
    model = dl.Sequential([dl.Linear(64, 32), dl.ReLU(), dl.Linear(32, 10)], seed=0)
    trainer = dl.Trainer(model, optimizer=dl.SGD(lr=0.1), plan=HYBRID,
                         pilot=pilot2 if where == "pilot" else None, retries=0)
    X = Xtr.copy()
    X[40] = 1e307  # finite, but the activations overflow: the parameters become NaN
    with np.errstate(all="ignore"), pytest.raises(
            FloatingPointError, match=r"the loss is (nan|inf) at step \d \(replica \d, micro-batch \d, epoch rows \d+\.\.\d+\)"):
        trainer.fit(X, ytr, epochs=3, batch_size=32)


# -- faults ------------------------------------------------------------------------------
def test_worker_sigkilled_mid_epoch_is_retried_bitwise(tmp_path):
    marker = str(tmp_path / "killed")

    def model():
        return dl.Sequential([dl.Linear(64, 32), dl.ReLU(), KillOnce(marker, after=12), dl.Linear(32, 10)],
                             seed=0)

    undisturbed = fit(HYBRID, None, model=model(), epochs=2)
    with shoal.Pilot(workers=2) as pilot:
        disturbed = fit(HYBRID, pilot, model=model(), epochs=2)
        deaths = pilot.stats()["driver"]["worker_deaths"]
    assert os.path.exists(marker), "the worker was never killed"
    assert int(open(marker).read()) != os.getpid()
    assert same(undisturbed.parameters(), disturbed.parameters())
    assert deaths == 1


class LateDuplicates:
    """A real pilot on which every ``every``-th task runs a second time, late: once the
    first copy is done and ``lag`` more tasks were submitted (its dependents ran and
    reused its buffers).  The runtime may do this after a worker died (the dead worker's
    result was lost, or a task it held had been moved to a peer before the news of the
    move arrived), which is what made the SIGKILL test differ in the last decimals."""

    def __init__(self, pilot, every=5, lag=30):
        self.pilot, self.every, self.lag = pilot, every, lag
        self.workers = pilot.workers
        self.count = 0
        self.later: list = []  # (due count, fn, args, first copy's future)
        self.copies: list = []

    def options(self, **kw):
        self.kw = kw
        return self

    def submit(self, fn, *args):
        fut = self.pilot.options(**self.kw).submit(fn, *args)
        self.count += 1
        if self.count % self.every == 0:
            self.later.append((self.count + self.lag, fn, args, fut))
        for item in [i for i in self.later if i[0] <= self.count and i[3].done()]:
            self.later.remove(item)
            _, fn2, args2, first = item
            values = tuple(a.result() if isinstance(a, shoal.Future) else a for a in args2)
            self.copies.append((first, self.pilot.submit(fn2, *values)))
        return fut


def test_a_late_second_copy_of_a_task_changes_no_bit(pilot2):
    undisturbed = fit(HYBRID, None, opt=dl.Adam(lr=0.01), epochs=2)
    late = LateDuplicates(pilot2)
    disturbed = fit(HYBRID, late, opt=dl.Adam(lr=0.01), epochs=2)
    cf.wait([copy for _, copy in late.copies], timeout=60)
    assert len(late.copies) >= 20
    assert same(undisturbed.parameters(), disturbed.parameters()), maxdiff(
        undisturbed.parameters(), disturbed.parameters())
    assert [r["loss"] for r in undisturbed.history] == [r["loss"] for r in disturbed.history]
    # a copy returns the first copy's (stored) result, or None when a later step has run the
    # same task since; one that ran after the fit may fail (the run's lock table is gone)
    answered = [(first, copy) for first, copy in late.copies if copy.done() and not copy.exception()]
    assert answered and all(copy.result() in (first.result(), None) for first, copy in answered)


def test_checkpoint_resumes_after_the_last_finished_epoch(tmp_path):
    path = str(tmp_path / "ckpt.npz")
    whole = fit(HYBRID, epochs=4, opt=dl.Adam(lr=0.01), shuffle=True, seed=1)

    class Stop(Exception):
        pass

    def stop_after_1(record):
        if record["epoch"] == 1:
            raise Stop

    with pytest.raises(Stop):
        fit(HYBRID, epochs=4, opt=dl.Adam(lr=0.01), shuffle=True, seed=1, checkpoint=path,
            callback=stop_after_1)
    resumed = fit(HYBRID, epochs=4, opt=dl.Adam(lr=0.01), shuffle=True, seed=1, checkpoint=path)
    assert same(whole.parameters(), resumed.parameters())
    assert [r["epoch"] for r in resumed.history] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="different run: plan"):
        fit(dl.Plan(), epochs=5, opt=dl.Adam(lr=0.01), shuffle=True, seed=1, checkpoint=path)


DRIVER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {here!r})
    import shoal
    from shoal.workloads import dl
    from dl_models import digits, mlp
    Xtr, _, ytr, _ = digits(400)
    def cb(record):
        if record["epoch"] == 1 and os.environ.get("KILL"):
            os.kill(os.getpid(), signal.SIGKILL)   # the driver dies after epoch 1's checkpoint
    if __name__ == "__main__":
        with shoal.Pilot(workers=2) as pilot:
            trainer = dl.Trainer(mlp(), optimizer=dl.SGD(lr=0.1, momentum=0.9), pilot=pilot,
                                 plan=dl.Plan(replicas=2, stages=2, micro_batches=4))
            trainer.fit(Xtr, ytr, epochs=3, batch_size=32, shuffle=True, checkpoint={ckpt!r}, callback=cb)
            np.savez({out!r}, *trainer.parameters())
""")


def test_driver_sigkilled_resumes_from_checkpoint(tmp_path):
    ckpt, out = str(tmp_path / "ckpt.npz"), str(tmp_path / "out.npz")
    script = tmp_path / "train.py"
    script.write_text(DRIVER.format(here=HERE, ckpt=ckpt, out=out))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    first = subprocess.run([sys.executable, str(script)], env=dict(env, KILL="1"), timeout=120,
                           capture_output=True, text=True)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert os.path.exists(ckpt) and not os.path.exists(out)
    second = subprocess.run([sys.executable, str(script)], env=env, timeout=120,
                            capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    with np.load(out) as data:
        got = [data[f"arr_{i}"] for i in range(len(data.files))]
    whole = fit(dl.Plan(replicas=2, stages=2, micro_batches=4), None, model=mlp(),
                opt=dl.SGD(lr=0.1, momentum=0.9), epochs=3, shuffle=True)
    assert same(whole.parameters(), got)


def test_a_failed_fit_leaves_the_trainer_at_its_last_finished_epoch():
    model = dl.Sequential([dl.Linear(64, 32), dl.ReLU(), dl.Linear(32, 10)], seed=0)
    trainer = dl.Trainer(model, optimizer=dl.Adam(lr=0.01), plan=HYBRID)
    trainer.fit(Xtr, ytr, epochs=1, batch_size=32)
    bad = Xtr.copy()
    bad[200] = 1.7e308  # finite, but the first layer overflows: the loss of step 6 is NaN
    with np.errstate(all="ignore"), pytest.raises(FloatingPointError):
        trainer.fit(bad, ytr, epochs=2, batch_size=32)
    assert trainer.step == 10 and len(trainer.history) == 1
    trainer.fit(Xtr, ytr, epochs=2, batch_size=32)
    fresh = dl.Trainer(dl.Sequential([dl.Linear(64, 32), dl.ReLU(), dl.Linear(32, 10)], seed=0),
                       optimizer=dl.Adam(lr=0.01), plan=HYBRID)
    fresh.fit(Xtr, ytr, epochs=1, batch_size=32)
    fresh.fit(Xtr, ytr, epochs=2, batch_size=32)
    assert same(trainer.parameters(), fresh.parameters())


def test_a_corrupt_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "ckpt.npz"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read"):
        fit(dl.Plan(), checkpoint=str(path))


def test_a_hung_task_times_out():
    class Hang(dl.Layer):
        def forward(self, params, x, ctx):
            import time

            if ctx.step == 2:
                time.sleep(3600)
            return x

    model = dl.Sequential([dl.Linear(64, 10), Hang()], seed=0)
    with shoal.Pilot(workers=2) as pilot:  # its own: the hung worker is killed and replaced
        trainer = dl.Trainer(model, pilot=pilot, retries=0, timeout=2)
        with pytest.raises(shoal.TaskTimeout):
            trainer.fit(Xtr, ytr, epochs=1, batch_size=32)
    assert trainer.step == 0 and trainer.history == []
