"""``dl.TorchModule``: the same plans with torch doing the layer math (extra ``shoal[torch]``).

Wrap an ``torch.nn.Sequential``: its children are the layers the plan cuts into stages.
Parameters are those of ``module.parameters()`` in order, with torch's own shapes (a
``torch.nn.Linear`` weight is ``(out, in)``) and dtype (usually float32).

Data flow inside a task (``TorchEngine``): the stage's parameters are bound, without a
copy, to the arena's shared memory (``param.data = torch.from_numpy(view)``); a forward
task runs the stage under ``no_grad`` and stores only the stage input; a backward task
re-runs the stage's forward under autograd from that input and calls
``torch.autograd.grad`` with the incoming gradient (GPipe's re-materialisation: an
autograd graph cannot cross processes, and a backward may run on another worker).  On
the last stage of a 1F1B schedule forward and backward are one task and nothing is
recomputed.  Each task runs on one torch thread (``_OneThread``): torch's kernels
give other last bits on other thread counts.  The loss and the optimizer stay the numpy ones, so a TorchModule and a
Sequential with equal parameters follow the same optimizer arithmetic.

``torch.nn.Dropout`` draws from torch's generator, seeded per (seed, step, layer, rows)
before the layer runs and again before its recomputation, so the mask is reproducible
across workers and stage cuts (but, unlike ``dl.Dropout``, depends on the plan's
micro-batch split).  Keying it by the stage instead made the first run on a new pilot
differ: the cut is balanced by measured cost and moved the Dropout to the other stage.

Installing torch: the CPU wheel (``pip install torch==2.13.0 --index-url
https://download.pytorch.org/whl/cpu``, or the wheel this machine has); a plain ``torch``
requirement pulls several GB of CUDA libraries on Linux.
"""

from __future__ import annotations

import copy

import numpy as np

from .layers import ShapeError


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from ..._errors import install_hint

        raise ImportError("dl.TorchModule needs torch: "
                          f"{install_hint('torch', 'torch==2.13.0 threadpoolctl')}; on Linux the CPU "
                          "wheel: --index-url https://download.pytorch.org/whl/cpu (docs/dl.md)") from exc
    return torch


def _refuse_what_a_plan_would_change(torch, layers) -> None:
    """ValueError naming the layer, for modules whose training a plan would silently change.

    * Batch statistics (``BatchNorm*``; ``InstanceNorm`` with running stats): each
      micro-batch would be normalised by its own rows, so a step is no longer the whole
      batch's gradient (R=2, M=2 moved parameters by 0.018 after 2 epochs), and the
      running statistics, updated in the workers' copies, never came back to the driver
      (``predict`` normalised with the initial ones).  LayerNorm/GroupNorm are per sample.
    * A parameter shared by two layers (tied weights): each layer's copy would be trained
      apart and the last one written back would win."""
    norms = tuple(getattr(torch.nn, n) for n in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
                                                 "SyncBatchNorm") if hasattr(torch.nn, n))
    owner: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for sub in layer.modules():
            if isinstance(sub, norms) or (
                    isinstance(sub, (torch.nn.InstanceNorm1d, torch.nn.InstanceNorm2d,
                                     torch.nn.InstanceNorm3d)) and sub.track_running_stats):
                raise ValueError(
                    f"TorchModule: layer {i} ({type(sub).__name__}) normalises by batch "
                    "statistics: a plan's micro-batches and replicas would each use their own "
                    "rows, and its running statistics would stay in the workers; use LayerNorm "
                    "or GroupNorm (per sample)")
        for p in layer.parameters():
            if owner.setdefault(id(p), i) != i:
                raise ValueError(f"TorchModule: layers {owner[id(p)]} and {i} share a parameter "
                                 f"of shape {tuple(p.shape)} (tied weights): each stage would "
                                 "train its own copy; untie them")


class TorchModule:
    """A ``torch.nn.Sequential`` trained by ``dl.Trainer`` with any ``dl.Plan``."""

    kind = "torch"

    def __init__(self, module, seed: int = 0):
        torch = _torch()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"TorchModule needs a torch.nn.Module, got {type(module).__name__}")
        children = list(module.children()) if isinstance(module, torch.nn.Sequential) else [module]
        if not children:
            raise ValueError("TorchModule: the Sequential has no layers")
        _refuse_what_a_plan_would_change(torch, children)
        self.module = module
        self.layers = children
        self.seed = int(seed)
        dtypes = {p.dtype for p in module.parameters()}
        if len(dtypes) > 1:
            raise ValueError(f"TorchModule: parameters of one dtype needed, got {sorted(map(str, dtypes))}")
        self.dtype = np.dtype(str(dtypes.pop()).replace("torch.", "")) if dtypes else np.dtype("float32")

    # -- parameters --------------------------------------------------------------------
    def param_shapes(self):
        return [[tuple(p.shape) for p in layer.parameters()] for layer in self.layers]

    def parameters(self) -> list[np.ndarray]:
        return [p.detach().cpu().numpy().copy() for layer in self.layers for p in layer.parameters()]

    def set_parameters(self, arrays) -> None:
        torch = _torch()
        params = [p for layer in self.layers for p in layer.parameters()]
        arrays = [np.asarray(a) for a in arrays]
        if len(arrays) != len(params):
            raise ValueError(f"set_parameters: the module has {len(params)} parameter arrays, got {len(arrays)}")
        for i, (p, a) in enumerate(zip(params, arrays, strict=True)):
            if tuple(p.shape) != a.shape:
                raise ValueError(f"set_parameters: array {i} must have shape {tuple(p.shape)}, got {a.shape}")
        with torch.no_grad():
            for p, a in zip(params, arrays, strict=True):
                p.data = torch.from_numpy(np.ascontiguousarray(a).copy())
        self.dtype = arrays[0].dtype if arrays else self.dtype

    # -- shapes and inference -------------------------------------------------------------
    def shapes(self, in_shape) -> list[tuple]:
        torch = _torch()
        shapes = [tuple(int(n) for n in in_shape)]
        x = torch.zeros((1,) + shapes[0], dtype=getattr(torch, self.dtype.name))
        self.module.eval()
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                try:
                    x = layer(x)
                except RuntimeError as exc:
                    src = "the input X" if i == 0 else f"layer {i - 1} ({self.layers[i - 1]!r})"
                    raise ShapeError(f"layer {i} ({layer!r}): {exc} (input shape {shapes[-1]} from {src})") from None
                shapes.append(tuple(x.shape[1:]))
        return shapes

    def forward(self, X) -> np.ndarray:
        torch = _torch()
        self.module.eval()
        with torch.no_grad():
            return self.module(torch.from_numpy(np.asarray(X, dtype=self.dtype))).numpy()

    # -- what the trainer needs ---------------------------------------------------------
    def engine(self, stage_layers):
        return TorchEngine(self, stage_layers)

    def saved_layers(self, stage):
        return [stage[0]]

    def layer_costs(self, shapes, rows: int) -> list[float]:
        import time

        torch = _torch()
        costs = []
        for i, layer in enumerate(self.layers):
            x = torch.randn((rows,) + shapes[i], dtype=getattr(torch, self.dtype.name), requires_grad=True)
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                # a clone: an in-place layer (ReLU(inplace=True)) may not write a leaf that
                # requires grad, which made the measured cut of such a model raise
                y = layer(x.clone())
                y.backward(torch.ones_like(y))
                best = min(best, time.perf_counter() - t0)
            costs.append(best)
        return costs

    def __repr__(self):
        return f"TorchModule({self.module!r}, seed={self.seed})"


class _OneThread:
    """torch's results depend on its intra-op thread count: run each task on one thread."""

    def __enter__(self):
        torch = _torch()
        self.before = torch.get_num_threads()
        if self.before != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self.before != 1:
            _torch().set_num_threads(self.before)


class TorchEngine:
    """Stage math with torch modules whose parameters live in the arena (see module docstring).

    Every call runs on one torch thread: torch's CPU kernels give different last bits on
    1 and 2 threads, and the plan, not the pilot's size, must fix the arithmetic."""

    def __init__(self, model: TorchModule, stage_layers):
        self.layers = model.layers
        self.seed = model.seed
        self.stage_layers = stage_layers

    def __getstate__(self):
        # Without the parameters' values: every task binds them to arena views (``_bind``),
        # so a worker's copy needs only the modules' structure (not the model's megabytes).
        torch = _torch()
        params = [p for mod in self.layers for p in mod.parameters()]
        values = [p.data for p in params]
        try:
            for p in params:
                p.data = torch.empty(0, dtype=p.dtype)
            layers = copy.deepcopy(self.layers)
        finally:
            for p, v in zip(params, values, strict=True):
                p.data = v
        return {"layers": layers, "seed": self.seed, "stage_layers": self.stage_layers}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def _bind(self, s, params):
        torch = _torch()
        mods = [self.layers[i] for i in self.stage_layers[s]]
        tensors = []
        for mod, views in zip(mods, params, strict=True):
            for p, view in zip(mod.parameters(), views, strict=True):
                p.data = torch.from_numpy(view)
                tensors.append(p)
        return mods, tensors

    def _run(self, mods, x, ctx, s):
        torch = _torch()
        if any(getattr(m, "inplace", False) is True for mod in mods for m in mod.modules()):
            # an in-place layer (ReLU(inplace=True), Dropout(inplace=True)...) must not write
            # the stage input: it is the arena's X (the training data) on stage 0 and the
            # stored input the backward recomputes from; with autograd it is a leaf, which
            # torch refuses to change in place ("a leaf Variable that requires grad ...")
            x = x.clone()
        for i, mod in zip(self.stage_layers[s], mods, strict=True):
            if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in mod.modules()):
                # keyed by the layer, not the stage: the cut (measured, so it may vary) must
                # not change a mask
                torch.manual_seed((self.seed * 1_000_003 + ctx.step * 7919 + ctx.row0 * 31 + i)
                                  % (1 << 63))
            mod.train(ctx.train)
            x = mod(x)
        return x

    def forward(self, s, params, x, ctx, live):
        with _OneThread():
            return self._forward(s, params, x, ctx, live)

    def backward(self, s, params, saved, dy, ctx, need_dx):
        with _OneThread():
            return self._backward(s, params, saved, dy, ctx, need_dx)

    def _forward(self, s, params, x, ctx, live):
        torch = _torch()
        mods, tensors = self._bind(s, params)
        xt = torch.from_numpy(x)
        if live:
            xt.requires_grad_(s > 0)
            with torch.enable_grad():
                y = self._run(mods, xt, ctx, s)
            return y.detach().numpy(), (xt, y, tensors)
        with torch.no_grad():
            y = self._run(mods, xt, ctx, s)
        return y.numpy(), [x]

    def storable(self, saved):
        if isinstance(saved, tuple):
            return [saved[0].detach().numpy()]
        return saved

    def _backward(self, s, params, saved, dy, ctx, need_dx):
        torch = _torch()
        if isinstance(saved, tuple):
            xt, y, tensors = saved
        else:
            mods, tensors = self._bind(s, params)
            xt = torch.from_numpy(np.ascontiguousarray(saved[0])).requires_grad_(need_dx)
            with torch.enable_grad():
                y = self._run(mods, xt, ctx, s)
        inputs = tensors + ([xt] if need_dx else [])
        grads = torch.autograd.grad(y, inputs, grad_outputs=torch.from_numpy(np.ascontiguousarray(dy)),
                                    allow_unused=True)
        out = [np.zeros(tuple(t.shape), dtype=dy.dtype) if g is None else g.numpy()
               for t, g in zip(tensors, grads[:len(tensors)], strict=True)]
        return (grads[-1].numpy() if need_dx else None), out
