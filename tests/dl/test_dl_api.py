"""The issue's Public API block is a contract: names and signatures; examples/dl_digits.py
runs (dl_slow).  docs/dl.md's programs run in tests/test_docs.py (the one doc-snippet runner)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

from shoal.workloads import dl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_contract_names():
    for name in ("Sequential", "Linear", "ReLU", "Tanh", "Conv2d", "MaxPool2d", "Flatten", "Dropout",
                 "SGD", "Adam", "Plan", "Trainer", "TorchModule"):
        assert name in dl.__all__ and hasattr(dl, name), name
    fit = inspect.signature(dl.Trainer.fit).parameters
    assert list(fit)[:5] == ["self", "X", "y", "epochs", "batch_size"]
    assert {"shuffle", "seed", "checkpoint", "callback"} <= set(fit)
    assert {"loss", "optimizer", "plan", "pilot"} <= set(inspect.signature(dl.Trainer).parameters)
    for method in ("fit", "evaluate", "parameters", "predict"):
        assert callable(getattr(dl.Trainer, method))
    plan = inspect.signature(dl.Plan).parameters
    assert list(plan) == ["replicas", "stages", "micro_batches", "schedule", "shards"]
    assert dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="1f1b").schedule is dl.Schedule.ONE_F_ONE_B


@pytest.mark.dl_slow
def test_example_runs():
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "dl_digits.py"), "--epochs", "2"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "test accuracy" in out.stdout and "speed-up" in out.stdout
    assert "bitwise equal parameters: True" in out.stdout
