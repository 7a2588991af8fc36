"""What runs inside the tasks: one ``Program`` per training run, one ``Op`` per task kind and stage.

The trainer submits ``Op`` objects as task functions.  An ``Op`` holds the run's
``Program`` (model description, stage cut, arena handle, loss, optimizer), so a worker
receives and unpickles it once per run (shoal caches task functions per worker) and
then each task carries only integers and the small results of the tasks it depends on.
``Op.__name__`` names the task in traces (``dl.forward[s1]``): the pipeline bubble is
measured from those spans.

Every op is deterministic in its inputs and idempotent (it writes only buffers that no
task reads before it finishes; arena.py), so where a task runs, and whether it ran
twice after a worker died, cannot change a bit of the result.

BLAS threads: each op limits the BLAS pools of its process to ``blas_threads`` (the
pilot's cores divided by its workers) once per process, with threadpoolctl, so two
workers never oversubscribe the cores (the 38x slowdown reported with Ray).  OpenBLAS
splits a matrix product over rows and columns, never over the summed dimension, so its
results do not depend on the thread count (tests compare 1, 2 and 16 workers bitwise);
torch's CPU kernels do (measured: 1 and 2 threads differ in the last bit), so the torch
engine runs every task on one torch thread (torch_module.py).
"""

from __future__ import annotations

import math

import numpy as np

from .layers import Ctx
from .losses import Loss, value_and_grad
from .plan import splits
from .schedules import OpKind

_limited: list = [None]


def limit_blas(threads: int) -> None:
    """Limit this process's BLAS pools to ``threads`` (once per process and value)."""
    if _limited[0] == threads:
        return
    if threads is not None:
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=threads)
        except Exception:  # pragma: no cover - threadpoolctl missing or a pool it cannot set
            pass
    _limited[0] = threads


class NumpyEngine:
    """Stage math with the dl layers: forwards store each layer's input for the backward."""

    def __init__(self, model, stage_layers):
        self.layers = model.layers
        self.seed = model.seed
        self.stage_layers = stage_layers

    def forward(self, s, params, x, ctx, live):
        saved = []
        for i, p in zip(self.stage_layers[s], params, strict=True):
            saved.append(x)
            x = self.layers[i].forward(p, x, _at(ctx, i))
        return x, saved

    def storable(self, saved):
        return saved

    def backward(self, s, params, saved, dy, ctx, need_dx):
        grads = []
        idx = self.stage_layers[s]
        for k in range(len(idx) - 1, -1, -1):
            i = idx[k]
            dy, g = self.layers[i].backward(params[k], saved[k], dy, _at(ctx, i), need_dx or k > 0)
            grads.append(g)
        return dy, [g for per_layer in reversed(grads) for g in per_layer]


def _at(ctx: Ctx, layer: int) -> Ctx:
    return Ctx(ctx.train, ctx.seed, ctx.step, layer, ctx.row0, ctx.batch_rows)


class Program:
    """Everything a task of one training run needs; pickled once per worker."""

    def __init__(self, engine, arena, stage_param_shapes, loss: Loss, optimizer, plan_stages: int,
                 micro: int, slots: list[int], blas_threads: int, seed: int):
        self.engine = engine
        self.arena = arena
        self.shapes = stage_param_shapes  # [stage][layer in stage] -> list of shapes
        self.loss = loss
        self.optimizer = optimizer
        self.stages = plan_stages
        self.micro = micro
        self.slots = slots  # activation buffers per stage (schedules.slots)
        self.blas_threads = blas_threads
        self.seed = seed

    # -- views ---------------------------------------------------------------------
    def params(self, s, v):
        """Per layer of stage ``s``: views of its parameters in version ``v``."""
        flat = self.arena.view(("param", s, v))
        out, o = [], 0
        for shapes in self.shapes[s]:
            layer = []
            for shape in shapes:
                n = math.prod(shape)
                layer.append(flat[o:o + n].reshape(shape))
                o += n
            out.append(layer)
        return out

    def _accumulate(self, r, s, m, grads) -> None:
        dst = self.arena.view(("acc", r, s, m % 2))
        src = None if m == 0 else self.arena.view(("acc", r, s, (m - 1) % 2))
        o = 0
        for g in grads:
            n = g.size
            if src is None:
                dst[o:o + n] = g.ravel()
            else:
                np.add(src[o:o + n], g.ravel(), out=dst[o:o + n])
            o += n
        if src is None and o < dst.size:  # pragma: no cover - every parameter gets a gradient
            dst[o:] = 0

    def _input(self, r, s, m, lo, hi):
        """The stage's input rows: gathered from the data (stage 0) or the previous stage's output."""
        n = hi - lo
        if s > 0:
            return self.arena.view(("out", r, s - 1, m % self.slots[s - 1]))[:n]
        x = self.arena.view(("act", r, 0, m % self.slots[0], 0))[:n]
        np.take(self.arena.view(("X",)), self.arena.view(("perm",))[lo:hi], axis=0, out=x)
        return x

    def _store(self, r, s, m, saved, n) -> None:
        for k, a in enumerate(saved):
            if k:  # the input (k = 0) is in its buffer already
                self.arena.view(("act", r, s, m % self.slots[s], k))[:n] = a

    def _saved(self, r, s, m, lo, hi):
        """What the forward of (r, s, m) stored: the stage input, then each later layer's input."""
        n, j = hi - lo, m % self.slots[s]
        first = (self.arena.view(("out", r, s - 1, m % self.slots[s - 1])) if s > 0
                 else self.arena.view(("act", r, 0, j, 0)))[:n]
        return [first] + [self.arena.view(("act", r, s, j, k))[:n] for k in range(1, self._nslots(s))]

    def _dout(self, r, s, m, n):
        """The gradient of the loss w.r.t. the output of stage ``s`` for micro-batch ``m``."""
        return self.arena.view(("dout", r, s, m % self.slots[s]))[:n]

    def _loss(self, step, r, m, lo, hi, z, batch_rows):
        y = self.arena.view(("Y",))[self.arena.view(("perm",))[lo:hi]]
        value, grad, correct = value_and_grad(self.loss, z, y, batch_rows)
        if not math.isfinite(value):
            raise FloatingPointError(
                f"the loss is {value} at step {step} (replica {r}, micro-batch {m}, epoch rows "
                f"{lo}..{hi}): lower the learning rate or check the inputs for NaN/inf")
        return value, grad, correct

    # -- ops -----------------------------------------------------------------------
    def run(self, kind: OpKind, s: int, args: tuple):
        limit_blas(self.blas_threads)
        if kind is OpKind.REDUCE:
            k, a, b = args[:3]
            np.add(self._operand(s, a), self._operand(s, b), out=self.arena.view(("node", s, k)))
            return None
        if kind is OpKind.UPDATE:
            step, operands, chunk, chunks = args[:4]
            a, b = splits(0, self.arena.view(("param", s, 0)).size, chunks)[chunk]
            g = self._operand(s, operands[0])[a:b]
            if len(operands) == 2:
                g = g + self._operand(s, operands[1])[a:b]
            v = step % 2
            opt = self.optimizer
            state = [self.arena.view(("state", s, j, v))[a:b] for j in range(opt.slots)]
            state_out = [self.arena.view(("state", s, j, 1 - v))[a:b] for j in range(opt.slots)]
            opt.update(self.arena.view(("param", s, v))[a:b], g, state,
                       self.arena.view(("param", s, 1 - v))[a:b], state_out, step + 1)
            return None
        step, r, m, lo, hi, b0, bn = args[:7]
        n = hi - lo
        params = self.params(s, step % 2)
        ctx = Ctx(True, self.seed, step, 0, lo - b0, bn)
        last = s == self.stages - 1
        if kind is OpKind.BACKWARD:
            dx, grads = self.engine.backward(s, params, self._saved(r, s, m, lo, hi),
                                             self._dout(r, s, m, n), ctx, s > 0)
            self._accumulate(r, s, m, grads)
            if s > 0:
                self._dout(r, s - 1, m, n)[...] = dx
            return None
        x = self._input(r, s, m, lo, hi)
        live = kind is OpKind.FORWARD_BACKWARD
        z, saved = self.engine.forward(s, params, x, ctx, live)
        if not last:
            self.arena.view(("out", r, s, m % self.slots[s]))[:n] = z
            self._store(r, s, m, self.engine.storable(saved), n)
            return None
        value, dz, correct = self._loss(step, r, m, lo, hi, np.asarray(z), bn)
        if not live:
            self._store(r, s, m, self.engine.storable(saved), n)
            self._dout(r, s, m, n)[...] = dz
            return (value, correct, n)
        dx, grads = self.engine.backward(s, params, saved, dz.astype(x.dtype, copy=False), ctx, s > 0)
        self._accumulate(r, s, m, grads)
        if s > 0:
            self._dout(r, s - 1, m, n)[...] = dx
        return (value, correct, n)

    def _nslots(self, s):
        """How many layer inputs a forward of stage ``s`` stores, its input included."""
        n = 1
        while ("act", 0, s, 0, n) in self.arena.layout.regions:
            n += 1
        return n

    def _operand(self, s, operand):
        kind, i = operand
        if kind == "leaf":
            return self.arena.view(("acc", i, s, (self.micro - 1) % 2))
        return self.arena.view(("node", s, i))

    def predict(self, lo, hi, v):
        """Rows ``lo..hi`` of ``X`` through every stage (no dropout) into the ``out`` region."""
        limit_blas(self.blas_threads)
        x = self.arena.view(("X",))[lo:hi]
        ctx = Ctx(False, self.seed)
        for s in range(self.stages):
            x, _ = self.engine.forward(s, self.params(s, v), x, ctx, False)
        self.arena.view(("out",))[lo:hi] = np.asarray(x)
        return None


class Op:
    """A task function: one kind of op of one stage of one run (``__name__`` shows in traces)."""

    def __init__(self, program: Program, kind: OpKind | str, stage: int):
        self.program = program
        self.kind = kind
        self.stage = stage
        label = kind.value if isinstance(kind, OpKind) else kind
        self.__name__ = f"dl.{label}[s{stage}]"
        self.__qualname__ = self.__name__

    def __call__(self, *args):
        if self.kind == "predict":
            return self.program.predict(*args[:3])
        return self.program.run(self.kind, self.stage, args)
