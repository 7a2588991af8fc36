"""Losses: the batch mean, computed per micro-batch so that the sum over micro-batches is it.

``value_and_grad(z, y, batch_rows)`` returns the *sum* of the per-sample losses of these
rows and ``d(mean loss of the whole batch)/dz`` for them (the per-sample gradient
divided by the batch's rows).  Summing the micro-batches' parameter gradients then gives
the gradient of the batch mean, whatever the plan's replicas and micro-batches: a
data-parallel step computes the same gradient as one process on the whole batch.
"""

from __future__ import annotations

import enum

import numpy as np


class Loss(enum.Enum):
    CROSS_ENTROPY = "cross_entropy"  # softmax + negative log-likelihood, integer labels
    MSE = "mse"  # mean over all elements (torch's MSELoss), float targets

    @classmethod
    def parse(cls, value) -> Loss:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(k.value) for k in cls)
            raise ValueError(f"unknown loss={value!r}; choose one of {choices}") from None


def log_softmax(z):
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def value_and_grad(loss: Loss, z, y, batch_rows: int):
    """(sum of per-sample losses, gradient of the batch-mean loss w.r.t. ``z``, correct count)."""
    if loss is Loss.CROSS_ENTROPY:
        logp = log_softmax(z)
        rows = np.arange(z.shape[0])
        value = -logp[rows, y].sum()
        grad = np.exp(logp)
        grad[rows, y] -= 1
        grad /= batch_rows
        correct = int((z.argmax(axis=1) == y).sum()) if z.shape[0] else 0
        return float(value), grad, correct
    t = y.reshape(z.shape)
    diff = z - t
    per = z.shape[1] if z.ndim > 1 else 1
    value = float((diff * diff).sum()) / per  # per-sample mean over the outputs, summed over rows
    grad = diff * (2.0 / (batch_rows * per))
    return value, grad.astype(z.dtype, copy=False), 0
