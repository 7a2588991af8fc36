"""Every layer's and loss's gradients against central finite differences (float64), and the
errors a user gets for layers that do not fit together."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.workloads import dl
from shoal.workloads.dl.layers import Ctx
from shoal.workloads.dl.losses import Loss, value_and_grad

CTX = Ctx(train=True, seed=3, step=5, layer=1, row0=2, batch_rows=9)


def numeric_grad(f, a, eps=1e-6):
    g = np.zeros_like(a)
    it = np.nditer(a, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = a[i]
        a[i] = old + eps
        hi = f()
        a[i] = old - eps
        lo = f()
        a[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


CASES = [
    (dl.Linear(5, 3), (4, 5)),
    (dl.Linear(5, 3, bias=False), (4, 5)),
    (dl.ReLU(), (4, 6)),
    (dl.Tanh(), (4, 6)),
    (dl.Flatten(), (3, 2, 3, 2)),
    (dl.Dropout(0.4), (4, 7)),
    (dl.Conv2d(2, 3, 3), (2, 2, 5, 6)),
    (dl.Conv2d(2, 3, (2, 3), stride=2, padding=1), (2, 2, 5, 6)),
    (dl.MaxPool2d(2), (2, 3, 6, 4)),
    (dl.MaxPool2d(3, stride=1), (2, 2, 5, 5)),  # overlapping windows
]


@pytest.mark.parametrize("layer, shape", CASES, ids=[repr(c[0]) for c in CASES])
def test_layer_gradients_match_finite_differences(layer, shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    if isinstance(layer, dl.ReLU):
        x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink
    params = layer.init(rng, np.float64)
    out_shape = layer.out_shape(shape[1:])
    y = layer.forward(params, x, CTX)
    assert y.shape == (shape[0],) + tuple(out_shape)
    w = rng.standard_normal(y.shape)  # loss = sum(w * y)

    def loss():
        return float((w * layer.forward(params, x, CTX)).sum())

    dx, grads = layer.backward(params, x, w, CTX, True)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-7)
    assert len(grads) == len(params) == len(layer.param_shapes())
    for p, g in zip(params, grads, strict=True):
        assert g.shape == p.shape
        np.testing.assert_allclose(g, numeric_grad(loss, p), rtol=1e-6, atol=1e-7)


def test_dropout_masks_do_not_depend_on_the_split():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 5))
    layer = dl.Dropout(0.5)
    whole = layer.forward([], x, Ctx(True, 3, 5, 1, 0, 9))
    parts = [layer.forward([], x[a:b], Ctx(True, 3, 5, 1, a, 9)) for a, b in ((0, 4), (4, 9))]
    assert np.array_equal(whole, np.concatenate(parts))
    assert 0 < (whole == 0).mean() < 1
    assert np.array_equal(layer.forward([], x, Ctx(train=False)), x)


@pytest.mark.parametrize("loss", list(Loss))
def test_loss_gradients_match_finite_differences(loss):
    rng = np.random.default_rng(2)
    z = rng.standard_normal((5, 4))
    y = rng.integers(0, 4, 5) if loss is Loss.CROSS_ENTROPY else rng.standard_normal((5, 4))
    batch = 8  # these rows are part of a batch of 8: the gradient is of the batch mean

    def f():
        return value_and_grad(loss, z, y, batch)[0] / batch

    value, grad, _ = value_and_grad(loss, z, y, batch)
    np.testing.assert_allclose(grad, numeric_grad(f, z), rtol=1e-6, atol=1e-8)


def test_cross_entropy_matches_scipy():
    from scipy.special import log_softmax

    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 3)) * 30  # large logits: the stable form must hold
    y = rng.integers(0, 3, 6)
    value, _, _ = value_and_grad(Loss.CROSS_ENTROPY, z, y, 6)
    assert value == pytest.approx(-log_softmax(z, axis=1)[np.arange(6), y].sum(), rel=1e-12)


def test_shape_errors_name_the_layer():
    model = dl.Sequential([dl.Linear(64, 128), dl.ReLU(), dl.Linear(100, 10)])
    with pytest.raises(dl.ShapeError, match=r"layer 2 \(Linear\(100, 10\)\).*128.*from layer 1 \(ReLU\(\)\)"):
        model.shapes((64,))
    with pytest.raises(dl.ShapeError, match=r"layer 0 \(Linear\(64, 128\)\).*from the input X"):
        model.shapes((63,))
    cnn = dl.Sequential([dl.Conv2d(1, 4, 3), dl.MaxPool2d(2), dl.Flatten(), dl.Linear(36, 10)])
    assert cnn.shapes((1, 8, 8))[-1] == (10,)
    with pytest.raises(dl.ShapeError, match=r"layer 0 \(Conv2d\(1, 4, 3\)\).*channels=1"):
        cnn.shapes((3, 8, 8))
    with pytest.raises(dl.ShapeError, match=r"layer 3 \(Linear\(36, 10\)\).*from layer 2 \(Flatten\(\)\)"):
        cnn.shapes((1, 10, 10))


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="Linear: out_features must be an int >= 1"):
        dl.Linear(3, 0)
    with pytest.raises(ValueError, match=r"Dropout: p must be a float in \[0, 1\)"):
        dl.Dropout(1.0)
    with pytest.raises(TypeError, match="item 1 is ufunc"):
        dl.Sequential([dl.Linear(2, 2), np.tanh])
    with pytest.raises(ValueError, match="Conv2d: padding"):
        dl.Conv2d(1, 1, 3, padding=-1)


def test_set_parameters_order_shapes_and_dtype():
    model = dl.Sequential([dl.Linear(4, 3), dl.ReLU(), dl.Linear(3, 2)], seed=0)
    shapes = [p.shape for p in model.parameters()]
    assert shapes == [(4, 3), (3,), (3, 2), (2,)]  # W1, b1, W2, b2; weights (in, out)
    new = [np.full(s, i, dtype=np.float32) for i, s in enumerate(shapes)]
    model.set_parameters(new)
    assert all(p.dtype == np.float32 for p in model.parameters())
    assert model.forward(np.ones((1, 4))).dtype == np.float32
    x = np.ones((1, 4), dtype=np.float32)
    assert np.array_equal(model.forward(x), np.maximum(x @ new[0] + new[1], 0) @ new[2] + new[3])
    with pytest.raises(ValueError, match=r"W of layer 2 \(Linear\(3, 2\)\) must have shape \(3, 2\)"):
        model.set_parameters([new[0], new[1], new[2].T, new[3]])
    with pytest.raises(ValueError, match="has 4 parameter arrays"):
        model.set_parameters(new[:3])
    with pytest.raises(ValueError, match="one dtype"):
        model.set_parameters([new[0].astype(np.float64)] + new[1:])


def test_initial_parameters_follow_the_seed():
    a = dl.Sequential([dl.Linear(8, 4)], seed=1).parameters()
    b = dl.Sequential([dl.Linear(8, 4)], seed=1).parameters()
    c = dl.Sequential([dl.Linear(8, 4)], seed=2).parameters()
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    assert np.abs(a[0]).max() <= 1 / np.sqrt(8)
