"""Optimizers: elementwise updates of one stage's flat parameter buffer (torch's conventions).

``SGD``: ``g += weight_decay * p; v = momentum * v + g (v = g at the first step); p -= lr * v``
(dampening 0, no Nesterov: torch.optim.SGD's defaults).  ``Adam``: torch.optim.Adam
(``m``, ``v`` with bias correction, ``eps`` added after the square root).

An update reads version ``t`` of the parameters and state and writes version ``t+1`` into
the other half of a double buffer (``trainer.py``): a step retried after its worker
was killed recomputes from untouched inputs, so a retry is bitwise the first attempt.
Every operation is elementwise, so updating a stage's flat buffer at once equals
updating each tensor, and the result does not depend on how the model is cut.
"""

from __future__ import annotations

import math

import numpy as np


class Optimizer:
    slots = 0  # state arrays the size of the parameters

    def update(self, p, g, state, p_out, state_out, step: int) -> None:
        raise NotImplementedError

    def config(self) -> dict:
        return {"kind": type(self).__name__, **self.__dict__}


def _check(name, value, low=0.0, high=None, *, open_low=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    # NaN compares False with everything: without isfinite, lr=nan or eps=nan passed and the
    # first step failed with "the loss is nan" (torch.optim refuses them up front too)
    if not math.isfinite(value) or value < low or (open_low and value == low) or (high is not None and value >= high):
        rng = f"({low}, ...)" if open_low else f"[{low}, {high if high is not None else '...'})"
        raise ValueError(f"{name} must be in {rng}, got {value!r}")
    return value


class SGD(Optimizer):
    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0):
        self.lr = _check("SGD lr", lr, open_low=True)
        self.momentum = _check("SGD momentum", momentum, 0.0, 1.0)
        self.weight_decay = _check("SGD weight_decay", weight_decay)
        self.slots = 1 if self.momentum else 0

    def update(self, p, g, state, p_out, state_out, step):
        dt = p.dtype.type
        if self.weight_decay:
            g = g + dt(self.weight_decay) * p
        if self.momentum:
            if step == 1:
                v = state_out[0]
                v[...] = g
            else:
                v = state_out[0]
                np.multiply(state[0], dt(self.momentum), out=v)
                v += g
            g = v
        np.multiply(g, dt(self.lr), out=p_out)  # p - lr*g with no temporary array: same bits
        np.subtract(p, p_out, out=p_out)

    def __repr__(self):
        return f"SGD(lr={self.lr}, momentum={self.momentum}, weight_decay={self.weight_decay})"


class Adam(Optimizer):
    slots = 2

    def __init__(self, lr: float = 0.001, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.lr = _check("Adam lr", lr, open_low=True)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Adam betas must be a pair, got {betas!r}")
        self.betas = (_check("Adam betas[0]", betas[0], 0.0, 1.0),
                      _check("Adam betas[1]", betas[1], 0.0, 1.0))
        self.eps = _check("Adam eps", eps)
        self.weight_decay = _check("Adam weight_decay", weight_decay)

    def update(self, p, g, state, p_out, state_out, step):
        dt = p.dtype.type
        b1, b2 = self.betas
        if self.weight_decay:
            g = g + dt(self.weight_decay) * p
        m, v = state_out
        if step == 1:
            np.multiply(g, dt(1 - b1), out=m)
            np.multiply(g * g, dt(1 - b2), out=v)
        else:
            np.multiply(state[0], dt(b1), out=m)
            m += dt(1 - b1) * g
            np.multiply(state[1], dt(b2), out=v)
            v += dt(1 - b2) * (g * g)
        bc1 = 1 - b1 ** step
        bc2 = 1 - b2 ** step
        denom = np.sqrt(v) / dt(np.sqrt(bc2)) + dt(self.eps)
        np.subtract(p, dt(self.lr / bc1) * (m / denom), out=p_out)

    def __repr__(self):
        return f"Adam(lr={self.lr}, betas={self.betas}, eps={self.eps}, weight_decay={self.weight_decay})"
