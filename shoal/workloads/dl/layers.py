"""Layers of a ``dl.Sequential`` model: shapes, initial parameters, forward and backward in numpy.

A layer holds no parameters and no activations: parameters live in shared memory
(one flat buffer per pipeline stage, ``trainer.py``), activations in per-micro-batch
slabs.  A layer is a pure description with four methods:

* ``param_shapes()`` -> the shapes of its parameters, in ``set_parameters`` order;
* ``out_shape(in_shape)`` -> the per-sample output shape, or ``ShapeError`` naming the layer;
* ``forward(params, x, ctx)`` -> ``y``;
* ``backward(params, x, dy, ctx, need_dx)`` -> ``(dx, grads)`` from the layer's *input* ``x``
  (what the forward pass stored), recomputing masks/argmaxes instead of keeping them.

So a task that runs a backward pass needs only the stage's stored layer inputs, on
whatever worker it lands.  Every operation is a deterministic numpy call on arrays whose
shapes depend only on the plan, never on which worker runs it (bitwise reproducibility).

Conventions follow torch where users will compare: Conv2d weights are
``(out_channels, in_channels, kh, kw)``, inputs NCHW, Dropout scales by ``1/(1-p)`` while
training; but ``Linear``'s weight is ``(in, out)`` (``y = x @ W + b``), as the API says.
Initial values: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for weights and biases (torch's default).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ShapeError(ValueError):
    """Layers that do not fit together (raised with the layer named)."""


@dataclass(frozen=True)
class Ctx:
    """What a layer may need beyond its input: training flag, and where these rows sit in the batch."""

    train: bool = False
    seed: int = 0  # the model's seed (Dropout masks)
    step: int = 0  # global optimizer step (Dropout masks)
    layer: int = 0  # index of the layer in the model (Dropout masks)
    row0: int = 0  # first row of this micro-batch within the batch
    batch_rows: int = 0  # rows of the whole batch


class Layer:
    """Base class: a parameter-free identity; subclasses override what they need."""

    def param_shapes(self) -> list[tuple]:
        return []

    def init(self, rng: np.random.Generator, dtype) -> list[np.ndarray]:
        return []

    def out_shape(self, in_shape: tuple) -> tuple:
        return tuple(in_shape)

    def forward(self, params, x, ctx: Ctx):
        return x

    def backward(self, params, x, dy, ctx: Ctx, need_dx: bool = True):
        return dy, []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _positive_int(layer: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{layer}: {name} must be an int >= 1, got {value!r}")
    return int(value)


def _uniform(rng, shape, fan_in, dtype):
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


class Linear(Layer):
    """``y = x @ W + b`` with ``W`` shaped ``(in_features, out_features)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        self.in_features = _positive_int("Linear", "in_features", in_features)
        self.out_features = _positive_int("Linear", "out_features", out_features)
        self.bias = bool(bias)

    def param_shapes(self):
        shapes = [(self.in_features, self.out_features)]
        return shapes + [(self.out_features,)] if self.bias else shapes

    def init(self, rng, dtype):
        return [_uniform(rng, s, self.in_features, dtype) for s in self.param_shapes()]

    def out_shape(self, in_shape):
        if len(in_shape) != 1 or in_shape[0] != self.in_features:
            raise ShapeError(f"expects input of {self.in_features} features per sample, got "
                             f"shape {tuple(in_shape)}")
        return (self.out_features,)

    def forward(self, params, x, ctx):
        y = x @ params[0]
        if self.bias:
            y += params[1]
        return y

    def backward(self, params, x, dy, ctx, need_dx=True):
        grads = [x.T @ dy]
        if self.bias:
            grads.append(dy.sum(axis=0))
        return (dy @ params[0].T if need_dx else None), grads

    def __repr__(self):
        extra = "" if self.bias else ", bias=False"
        return f"Linear({self.in_features}, {self.out_features}{extra})"


class ReLU(Layer):
    def forward(self, params, x, ctx):
        return np.maximum(x, 0)

    def backward(self, params, x, dy, ctx, need_dx=True):
        return (dy * (x > 0) if need_dx else None), []


class Tanh(Layer):
    def forward(self, params, x, ctx):
        return np.tanh(x)

    def backward(self, params, x, dy, ctx, need_dx=True):
        if not need_dx:
            return None, []
        t = np.tanh(x)
        return dy * (1 - t * t), []


class Flatten(Layer):
    def out_shape(self, in_shape):
        return (int(np.prod(in_shape, dtype=np.int64)),)

    def forward(self, params, x, ctx):
        return x.reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))

    def backward(self, params, x, dy, ctx, need_dx=True):
        return (dy.reshape(x.shape) if need_dx else None), []


class Dropout(Layer):
    """Zero each element with probability ``p`` while training, scale the rest by ``1/(1-p)``.

    The mask of a batch is drawn from ``(model seed, layer index, optimizer step)``
    for the whole batch and sliced to the micro-batch's rows, so it does not depend
    on how the plan splits the batch (nor on which worker draws it)."""

    def __init__(self, p: float = 0.5):
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be a float in [0, 1), got {p!r}")
        self.p = float(p)

    def _mask(self, x, ctx):
        rng = np.random.default_rng([ctx.seed, ctx.layer, ctx.step])
        full = rng.random((ctx.batch_rows,) + x.shape[1:])
        keep = full[ctx.row0:ctx.row0 + x.shape[0]] >= self.p
        return keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.p))

    def forward(self, params, x, ctx):
        if not ctx.train or self.p == 0:
            return x
        return x * self._mask(x, ctx)

    def backward(self, params, x, dy, ctx, need_dx=True):
        if not need_dx:
            return None, []
        if not ctx.train or self.p == 0:
            return dy, []
        return dy * self._mask(x, ctx), []

    def __repr__(self):
        return f"Dropout(p={self.p})"


def _pair(layer, name, v) -> tuple[int, int]:
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return (_positive_int(layer, name, v[0]), _positive_int(layer, name, v[1]))
    v = _positive_int(layer, name, v)
    return (v, v)


class Conv2d(Layer):
    """2-d convolution (cross-correlation, as torch) on NCHW input, by im2col and one matmul."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True):
        self.in_channels = _positive_int("Conv2d", "in_channels", in_channels)
        self.out_channels = _positive_int("Conv2d", "out_channels", out_channels)
        self.kernel_size = _pair("Conv2d", "kernel_size", kernel_size)
        self.stride = _pair("Conv2d", "stride", stride)
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"Conv2d: padding must be an int >= 0, got {padding!r}")
        self.padding = padding
        self.bias = bool(bias)

    def _fan_in(self):
        return self.in_channels * self.kernel_size[0] * self.kernel_size[1]

    def param_shapes(self):
        shapes = [(self.out_channels, self.in_channels) + self.kernel_size]
        return shapes + [(self.out_channels,)] if self.bias else shapes

    def init(self, rng, dtype):
        return [_uniform(rng, s, self._fan_in(), dtype) for s in self.param_shapes()]

    def out_shape(self, in_shape):
        if len(in_shape) != 3 or in_shape[0] != self.in_channels:
            raise ShapeError(f"expects input shaped (channels={self.in_channels}, height, width) "
                             f"per sample, got {tuple(in_shape)}")
        (kh, kw), (sh, sw), p = self.kernel_size, self.stride, self.padding
        h, w = in_shape[1] + 2 * p, in_shape[2] + 2 * p
        if h < kh or w < kw:
            raise ShapeError(f"kernel {self.kernel_size} is larger than the padded input {h}x{w}")
        return (self.out_channels, (h - kh) // sh + 1, (w - kw) // sw + 1)

    def _cols(self, x):
        (kh, kw), (sh, sw), p = self.kernel_size, self.stride, self.padding
        if p:
            x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
        n, c, oh, ow = win.shape[:4]
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)
        return cols, oh, ow

    def forward(self, params, x, ctx):
        cols, oh, ow = self._cols(x)
        w = params[0].reshape(self.out_channels, -1)
        y = cols @ w.T
        if self.bias:
            y += params[1]
        return y.reshape(x.shape[0], oh, ow, self.out_channels).transpose(0, 3, 1, 2)

    def backward(self, params, x, dy, ctx, need_dx=True):
        cols, oh, ow = self._cols(x)
        d2 = dy.transpose(0, 2, 3, 1).reshape(-1, self.out_channels)
        w = params[0].reshape(self.out_channels, -1)
        grads = [(d2.T @ cols).reshape(params[0].shape)]
        if self.bias:
            grads.append(d2.sum(axis=0))
        if not need_dx:
            return None, grads
        (kh, kw), (sh, sw), p = self.kernel_size, self.stride, self.padding
        n, c, h, wd = x.shape
        dcols = (d2 @ w).reshape(n, oh, ow, c, kh, kw)
        dxp = np.zeros((n, c, h + 2 * p, wd + 2 * p), dtype=dy.dtype)
        for i in range(kh):  # col2im: add each kernel offset's slice (fixed order)
            for j in range(kw):
                dxp[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw] += dcols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
        return (dxp[:, :, p:p + h, p:p + wd] if p else dxp), grads

    def __repr__(self):
        k = self.kernel_size[0] if self.kernel_size[0] == self.kernel_size[1] else self.kernel_size
        s = "" if self.stride == (1, 1) else f", stride={self.stride[0]}"
        p = "" if not self.padding else f", padding={self.padding}"
        return f"Conv2d({self.in_channels}, {self.out_channels}, {k}{s}{p})"


class MaxPool2d(Layer):
    """Max over ``kernel_size`` windows (stride defaults to the kernel size), NCHW."""

    def __init__(self, kernel_size, stride=None):
        self.kernel_size = _pair("MaxPool2d", "kernel_size", kernel_size)
        self.stride = self.kernel_size if stride is None else _pair("MaxPool2d", "stride", stride)

    def out_shape(self, in_shape):
        if len(in_shape) != 3:
            raise ShapeError(f"expects input shaped (channels, height, width) per sample, got "
                             f"{tuple(in_shape)}")
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        if in_shape[1] < kh or in_shape[2] < kw:
            raise ShapeError(f"window {self.kernel_size} is larger than the input "
                             f"{in_shape[1]}x{in_shape[2]}")
        return (in_shape[0], (in_shape[1] - kh) // sh + 1, (in_shape[2] - kw) // sw + 1)

    def _windows(self, x):
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
        return win.reshape(win.shape[:4] + (kh * kw,))

    def forward(self, params, x, ctx):
        return self._windows(x).max(axis=-1)

    def backward(self, params, x, dy, ctx, need_dx=True):
        if not need_dx:
            return None, []
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        arg = self._windows(x).argmax(axis=-1)  # the first maximum, as torch
        oh, ow = arg.shape[2:]
        dx = np.zeros_like(x, dtype=dy.dtype)
        for i in range(kh):
            for j in range(kw):
                dx[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw] += dy * (arg == i * kw + j)
        return dx, []

    def __repr__(self):
        k = self.kernel_size[0] if self.kernel_size[0] == self.kernel_size[1] else self.kernel_size
        s = "" if self.stride == self.kernel_size else f", stride={self.stride}"
        return f"MaxPool2d({k}{s})"
