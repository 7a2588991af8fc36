"""Helpers of the dl tests: data, a plain numpy training loop (the reference), a layer that
SIGKILLs its worker once."""

from __future__ import annotations

import os
import signal

import numpy as np

from shoal.workloads import dl


def digits(n: int | None = None, image: bool = False):
    """scikit-learn's bundled digits (1797 8x8 images, no download), scaled to [0, 1];
    a stratified 75/25 split: (Xtr, Xte, ytr, yte)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    if n is not None:
        X, y = X[:n], y[:n]
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0,
                                          stratify=y if n is None else None)
    if image:
        Xtr, Xte = Xtr.reshape(-1, 1, 8, 8), Xte.reshape(-1, 1, 8, 8)
    return Xtr, Xte, ytr, yte


def mlp(seed=0, hidden=32):
    return dl.Sequential([dl.Linear(64, hidden), dl.ReLU(), dl.Linear(hidden, hidden), dl.Tanh(),
                          dl.Linear(hidden, 10)], seed=seed)


def cnn(seed=0):
    return dl.Sequential([dl.Conv2d(1, 8, 3, padding=1), dl.ReLU(), dl.MaxPool2d(2), dl.Flatten(),
                          dl.Linear(128, 10)], seed=seed)


def reference_fit(params, X, y, epochs, batch_size, opt):
    """Linear-ReLU-Linear-Tanh-Linear, mean softmax cross-entropy, torch's SGD or Adam,
    batches in order: written out by hand, independent of shoal's layers."""
    W1, b1, W2, b2, W3, b3 = [p.copy() for p in params]
    ps = [W1, b1, W2, b2, W3, b3]
    state = [[np.zeros_like(p) for p in ps] for _ in range(2)]
    t = 0
    for _ in range(epochs):
        for lo in range(0, len(X), batch_size):
            xb, yb = X[lo:lo + batch_size], y[lo:lo + batch_size]
            B = len(xb)
            h1 = xb @ W1 + b1
            a1 = np.maximum(h1, 0)
            h2 = a1 @ W2 + b2
            a2 = np.tanh(h2)
            z = a2 @ W3 + b3
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
            dz = p.copy()
            dz[np.arange(B), yb] -= 1
            dz /= B
            gW3, gb3 = a2.T @ dz, dz.sum(0)
            dh2 = (dz @ W3.T) * (1 - a2 ** 2)
            gW2, gb2 = a1.T @ dh2, dh2.sum(0)
            dh1 = (dh2 @ W2.T) * (h1 > 0)
            gW1, gb1 = xb.T @ dh1, dh1.sum(0)
            grads = [gW1, gb1, gW2, gb2, gW3, gb3]
            t += 1
            for i, (param, g) in enumerate(zip(ps, grads, strict=True)):
                g = g + opt["weight_decay"] * param
                if opt["kind"] == "sgd":
                    if opt["momentum"]:
                        buf = g if t == 1 else opt["momentum"] * state[0][i] + g
                        state[0][i] = buf
                        g = buf
                    param -= opt["lr"] * g
                else:
                    b1_, b2_ = 0.9, 0.999
                    state[0][i] = b1_ * state[0][i] + (1 - b1_) * g
                    state[1][i] = b2_ * state[1][i] + (1 - b2_) * g * g
                    mhat = state[0][i] / (1 - b1_ ** t)
                    vhat = state[1][i] / (1 - b2_ ** t)
                    param -= opt["lr"] * mhat / (np.sqrt(vhat) + 1e-8)
    return ps


class KillOnce(dl.Layer):
    """An identity layer whose forward SIGKILLs its own worker process, the first time only
    (the marker file says it happened); in the driver (pilot=None) it never kills."""

    def __init__(self, marker: str, after: int = 0):
        self.marker = marker
        self.after = after  # the optimizer step at which to kill

    def forward(self, params, x, ctx):
        import shoal

        if ctx.train and ctx.step >= self.after and shoal.current_worker() is not None:
            try:  # O_EXCL: of two replicas here at once, only one kills its worker
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return x
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    def __repr__(self):
        return "KillOnce()"


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def maxdiff(a, b) -> float:
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b, strict=True))
