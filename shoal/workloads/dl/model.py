"""``dl.Sequential``: an ordered list of layers and its parameters (W1, b1, W2, b2, ...).

The model keeps its parameters as numpy arrays between runs; a ``Trainer`` copies them
into shared memory for training and back afterwards.  ``forward`` runs the model in this
process (inference; the reference the tests compare with).
"""

from __future__ import annotations

import numpy as np

from .layers import Ctx, Layer, ShapeError


def layer_name(i: int, layer) -> str:
    return f"layer {i} ({layer!r})"


class Sequential:
    """Layers applied in order; ``seed`` fixes the initial parameters, ``dtype`` their type."""

    kind = "numpy"

    def __init__(self, layers, seed: int = 0, dtype="float64"):
        layers = list(layers)
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"Sequential: item {i} is {type(layer).__name__} {layer!r}, not a "
                                "dl layer (dl.Linear, dl.ReLU, ...)")
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise ValueError(f"Sequential: dtype must be a float type, got {dtype}")
        self.layers = layers
        self.seed = int(seed)
        self.dtype = dtype
        rng = np.random.default_rng(self.seed)
        self._params = [p for layer in layers for p in layer.init(rng, dtype)]

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self) -> list[list[tuple]]:
        """Per layer, the shapes of its parameters."""
        return [layer.param_shapes() for layer in self.layers]

    def _param_names(self) -> list[str]:
        names = []
        for i, layer in enumerate(self.layers):
            for k, _ in enumerate(layer.param_shapes()):
                names.append(f"{'W' if k == 0 else 'b'} of {layer_name(i, layer)}")
        return names

    def parameters(self) -> list[np.ndarray]:
        """Copies of the parameters, in order W1, b1, W2, b2, ..."""
        return [p.copy() for p in self._params]

    def set_parameters(self, arrays) -> None:
        """Replace the parameters (order W1, b1, ...; Linear weights ``(in, out)``); dtype kept."""
        arrays = [np.asarray(a) for a in arrays]
        names = self._param_names()
        shapes = [s for shapes in self.param_shapes() for s in shapes]
        if len(arrays) != len(shapes):
            raise ValueError(f"set_parameters: the model has {len(shapes)} parameter arrays "
                             f"(W1, b1, ...), got {len(arrays)}")
        dtypes = {a.dtype for a in arrays}
        for a, shape, name in zip(arrays, shapes, names, strict=True):
            if a.shape != tuple(shape):
                raise ValueError(f"set_parameters: {name} must have shape {tuple(shape)}, "
                                 f"got {a.shape}")
            if a.dtype.kind != "f":
                raise ValueError(f"set_parameters: {name} has dtype {a.dtype}, not a float type")
        if len(dtypes) > 1:
            raise ValueError(f"set_parameters: all arrays need one dtype, got {sorted(map(str, dtypes))}")
        if dtypes:
            self.dtype = dtypes.pop()
        self._params = [a.copy() for a in arrays]

    # -- shapes ------------------------------------------------------------------------
    def shapes(self, in_shape) -> list[tuple]:
        """Per-sample shapes: the input, then each layer's output; ``ShapeError`` names the layer."""
        shapes = [tuple(int(n) for n in in_shape)]
        for i, layer in enumerate(self.layers):
            try:
                shapes.append(tuple(layer.out_shape(shapes[-1])))
            except ShapeError as exc:
                src = "the input X" if i == 0 else layer_name(i - 1, self.layers[i - 1])
                raise ShapeError(f"{layer_name(i, layer)}: {exc} (from {src})") from None
        return shapes

    # -- inference in this process -----------------------------------------------------
    def forward(self, X) -> np.ndarray:
        """The model's output for ``X`` (no dropout), computed here."""
        x = np.asarray(X, dtype=self.dtype)
        self.shapes(x.shape[1:])
        k = 0
        for i, layer in enumerate(self.layers):
            n = len(layer.param_shapes())
            x = layer.forward(self._params[k:k + n], x, Ctx(train=False, seed=self.seed, layer=i))
            k += n
        return x

    def __repr__(self):
        inner = ", ".join(repr(layer) for layer in self.layers)
        return f"Sequential([{inner}], seed={self.seed}, dtype={self.dtype})"

    # -- what the trainer needs --------------------------------------------------------
    def engine(self, stage_layers):
        from .program import NumpyEngine

        return NumpyEngine(self, stage_layers)

    def saved_layers(self, stage: list[int]) -> list[int]:
        """Layers whose inputs a forward task stores for the backward: all of the stage."""
        return list(stage)

    def layer_costs(self, shapes, rows: int) -> list[float]:
        """Seconds of one forward + backward of each layer on ``rows`` random rows (best of 3)."""
        import time

        rng = np.random.default_rng(0)
        costs, k = [], 0
        for i, layer in enumerate(self.layers):
            n = len(layer.param_shapes())
            params = self._params[k:k + n]
            k += n
            x = rng.standard_normal((rows,) + shapes[i]).astype(self.dtype)
            dy = rng.standard_normal((rows,) + shapes[i + 1]).astype(self.dtype)
            ctx = Ctx(train=True, seed=self.seed, layer=i, batch_rows=rows)
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                layer.forward(params, x, ctx)
                layer.backward(params, x, dy, ctx, True)
                best = min(best, time.perf_counter() - t0)
            costs.append(best)
        return costs
