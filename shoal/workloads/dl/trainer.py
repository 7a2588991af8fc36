"""``dl.Trainer``: turns each training step into a task graph on a pilot and runs it.

Data flow of one ``fit``::

    driver: validate X, y; cut the model into stages; lay out one shared arena
            (data, parameters, optimizer state, accumulators, activation slabs)
      per epoch: write the epoch's permutation; per step submit the nodes of
                 ``schedules.step_graph`` (forward/backward per replica, stage and
                 micro-batch; with R > 2 replicas the reduction tree and R update
                 tasks per stage, with R <= 2 the update rides on each stage's last
                 backward), each a task whose arguments are the futures it depends on
                 (at most WINDOW steps ahead); wait for the epoch;
                 write the checkpoint; append a history record; call ``callback``
    end:    copy parameters and optimizer state out of the arena, close it

With workers on other hosts (``Transport.FUTURES``, across_hosts.py) there is no shared
arena: per step one task per replica (its rows and the parameters as arguments), the
reduction tree's tasks and one update task, whose result the driver passes to the next
step; the arithmetic is the same code, so the bits are the same.

Invariants: futures carry only small values (a loss sum, None); the arrays stay in the
arena.  The arithmetic is fixed by the plan (``plan.py``), so the workers' number and
the backend do not change a bit.  Every task is idempotent, so tasks are submitted with
``retries``: a worker killed mid-step costs a re-run, not a different result.

``pilot=None`` runs the same tasks one after another in this process (the serial
reference; no worker processes).  Rejected: a persistent parameter server task (a
long-running task would pin a worker and could not be retried by the runtime).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import threading
import time

import numpy as np

import shoal

from .across_hosts import HostEpoch, HostOp, HostProgram, Transport, workers_elsewhere
from .arena import Arena, Layout, PrivateArena
from .checkpoint import FitCheckpoint, parameters_hash
from .layers import ShapeError
from .losses import Loss
from .model import layer_name
from .optim import SGD, Optimizer
from .plan import (
    Plan,
    PlanError,
    check_shards,
    max_micro_rows,
    micro_batches,
    partition,
    reduction_tree,
)
from .program import Guard, Program, ProgramRef, task_function
from .schedules import OpKind, slots, step_graph


class _Inline:
    """A serial executor with the pilot's ``submit``: runs each task at once, here."""

    workers = 1

    def submit(self, fn, /, *args):
        fut = cf.Future()
        try:
            args = tuple(a.result() if isinstance(a, cf.Future) else a for a in args)
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: B036 - the future carries it, as a pilot's would
            fut.set_exception(exc)
        return fut


class Trainer:
    """Trains ``model`` with ``optimizer`` under ``plan`` on ``pilot`` (None: in this process)."""

    WINDOW = 4  # steps submitted ahead of the oldest unfinished one (each depends on the last)
    # rows per predict task, whatever the pilot: a matrix product's bits depend on its row
    # count (OpenBLAS), so chunks sized by worker count gave predictions that differed in the
    # last bit between pilots
    PREDICT_ROWS = 256

    def __init__(self, model, loss="cross_entropy", optimizer: Optimizer | None = None,
                 plan: Plan | None = None, pilot=None, *, retries: int = 2,
                 timeout: float | None = None, transport: Transport | None = None):
        if not hasattr(model, "layers") or not hasattr(model, "parameters"):
            raise TypeError(f"Trainer needs a dl.Sequential or dl.TorchModule, got {type(model).__name__}")
        self.model = model
        self.loss = Loss.parse(loss)
        self.optimizer = SGD(lr=0.01) if optimizer is None else optimizer
        if not isinstance(self.optimizer, Optimizer):
            raise TypeError(f"optimizer must be dl.SGD or dl.Adam, got {type(optimizer).__name__}")
        self.plan = Plan() if plan is None else plan
        if not isinstance(self.plan, Plan):
            raise TypeError(f"plan must be a dl.Plan, got {type(plan).__name__}")
        if self.plan.stages > len(model.layers):
            raise PlanError(f"Plan.stages={self.plan.stages} but the model has only "
                            f"{len(model.layers)} layers (every stage needs at least one)")
        if self.plan.shards is not None:
            check_shards(self.plan.shards, len(model.layers))
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or timeout <= 0):
            raise ValueError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
        if transport is not None and not isinstance(transport, Transport):
            choices = ", ".join(f"dl.Transport.{t.name}" for t in Transport)
            raise TypeError(f"transport must be None (chosen from the pilot), {choices}; "
                            f"got {transport!r}")
        self.transport = transport  # None: FUTURES when the pilot has workers on other hosts
        self.pilot = pilot
        self.retries = retries
        self.timeout = timeout  # seconds one task may run (a hung layer fails instead of hanging)
        self.step = 0  # optimizer steps taken
        self.history: list[dict] = []  # one record per finished epoch (a dashboard reads it)
        self.stage_layers: list[list[int]] | None = None
        self._state: list[list[np.ndarray]] | None = None  # optimizer state: per slot, per parameter array
        # one fit at a time: two threads' fits interleaved their steps on one optimizer state
        # (4 epochs that equalled no serial run); now the second waits (re-entrant: a
        # callback may call fit)
        self._fitting = threading.RLock()

    # -- public ------------------------------------------------------------------------
    def parameters(self) -> list[np.ndarray]:
        """The current parameters (W1, b1, ...), copies."""
        return self.model.parameters()

    def fit(self, X, y, epochs: int = 1, batch_size: int = 32, shuffle: bool = False, seed: int = 0,
            checkpoint: str | os.PathLike | None = None, callback=None, *,
            resume: bool = False) -> list[dict]:
        """Train ``epochs`` more epochs (this call's); returns the history (one dict per epoch:
        loss, accuracy, ...).

        Records number the epochs over all ``fit`` calls of this trainer (``epoch``).
        ``shuffle=True`` permutes the rows each epoch from ``(seed, epoch number)``.  With
        ``checkpoint=path`` the state is saved after every epoch; a later ``fit`` with the
        same arguments continues from it: it finishes the epochs of a call that was
        interrupted (a crash, a kill), else it trains ``epochs`` more (a loop of
        ``fit(epochs=1, checkpoint=p)`` trains one epoch per call).  A checkpoint written
        from other starting parameters than the model's is refused unless ``resume=True``
        (which takes its weights).  ``callback(record)`` is called in this process after
        each epoch (after the checkpoint is written).  Fits of one trainer from several
        threads run one after the other."""
        if not isinstance(resume, bool):
            raise TypeError(f"fit: resume must be True or False, got {resume!r}")
        with self._fitting:
            if checkpoint is None:
                return self._fit(X, y, epochs, batch_size, shuffle, seed, None, callback, resume)
            if os.path.isdir(checkpoint):  # ("remove it" would be bad advice)
                raise ValueError(f"checkpoint={os.fspath(checkpoint)!r} is a directory; give a file path "
                                 f"such as {os.path.join(os.fspath(checkpoint), 'fit.npz')!r}")
            return self._fit(X, y, epochs, batch_size, shuffle, seed, checkpoint, callback, resume)

    def _fit(self, X, y, epochs, batch_size, shuffle, seed, checkpoint, callback, resume) -> list[dict]:
        for name, v, low in (("epochs", epochs, 0), ("batch_size", batch_size, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"fit: {name} must be an int >= {low}, got {v!r}")
        X, Y, shapes = self._check_data(X, y)
        n = X.shape[0]
        fingerprint = self._fingerprint(X, Y, batch_size, shuffle, seed)
        # a batch larger than the data is the whole data: the same batches, and the arena's
        # micro-batch buffers sized by rows that exist (batch_size=10**12 asked for TBs)
        batch_size = min(int(batch_size), n)
        ck = None
        if checkpoint is not None:
            params = self.model.parameters()
            need = sum(p.nbytes for p in params) * (1 + self.optimizer.slots) + (1 << 20)
            ck = FitCheckpoint(checkpoint, fingerprint, need)
            ck.open()  # the lock, stale temporaries, a test write: before any epoch
        try:
            return self._fit_checked(X, Y, shapes, n, epochs, batch_size, shuffle, seed, ck,
                                     callback, resume)
        finally:
            if ck is not None:
                ck.close()

    def _fit_checked(self, X, Y, shapes, n, epochs, batch_size, shuffle, seed, ck, callback,
                     resume) -> list[dict]:
        done, target, origin = 0, int(epochs), None
        if ck is not None:
            params = self.model.parameters()
            saved = ck.load(params, self.optimizer.slots, resume)
            origin = parameters_hash(params)
            if saved is not None:
                self.model.set_parameters(saved.params)
                self._state = saved.state
                self.step = saved.step
                self.history[:] = saved.history  # in place: a dashboard may hold the list
                origin = saved.start
                if not saved.finished:  # an interrupted call: this one finishes it
                    done = saved.call_done
        if done >= target:
            return self.history
        stage_layers = self._stages(shapes, batch_size)
        plan = self.plan
        R, S, M = plan.replicas, plan.stages, plan.micro_batches
        mb = max_micro_rows(batch_size, R, M)
        layout, sizes = self._layout(X, Y, shapes, stage_layers, mb)
        # R <= 2: the update rides on the last backward of each stage (one hop a step);
        # more replicas: a reduction tree and R update tasks per stage share the work
        graph = step_graph(R, S, M, plan.schedule, chunks=R, fuse_update=R <= 2)
        futures = self._transport() is Transport.FUTURES
        arena = PrivateArena(layout) if futures else Arena(layout)
        guard = Guard() if self.pilot is not None and not futures else None
        ref = None
        try:
            if futures:  # (the driver's copy: no arrays are made in it)
                ref = ProgramRef(HostProgram(self._program(arena, stage_layers, None), graph, R),
                                 pickled=self.pilot is not None, anywhere=True)
                ops = {kind: task_function(ref, kind, 0) for kind in HostOp}
                host = HostEpoch(self, ops, graph, self._submit, self._wait)
                current = self._flat_state(stage_layers, sizes)
            else:
                self._fill(arena, X, Y, stage_layers, sizes)
                ref = ProgramRef(self._program(arena, stage_layers, guard), pickled=guard is not None)
                ops = {(kind, s): task_function(ref, kind, s) for kind in OpKind for s in range(S)}
            pilot = self.pilot if self.pilot is not None else _Inline()
            for epoch in range(done, target):
                t0 = time.perf_counter()
                number = len(self.history)  # epochs this trainer has finished, over all fits
                perm = (np.random.default_rng([seed, number]).permutation(n) if shuffle
                        else np.arange(n))
                step0 = self.step
                try:
                    if futures:
                        stats, current = host.run(pilot, X, Y, perm, n, batch_size, current)
                    else:
                        arena.view(("perm",))[:] = perm
                        stats = self._epoch(pilot, ops, graph, n, batch_size)
                except BaseException:
                    self.step = step0  # the model still holds the last finished epoch
                    raise
                seconds = time.perf_counter() - t0
                if futures:
                    self._set_flat_state(stage_layers, current)
                else:
                    self._pull(arena, stage_layers, sizes)
                loss_sum, correct, rows = (sum(v[i] for v in stats) for i in range(3))
                record = {"epoch": number, "step": self.step, "loss": loss_sum / rows,
                          "accuracy": (correct / rows) if self.loss is Loss.CROSS_ENTROPY else None,
                          "samples": rows, "seconds": seconds, "samples_per_s": rows / seconds}
                self.history.append(record)
                _publish("train", {**record, "replicas": R, "stages": S, "micro_batches": M,
                                   "schedule": getattr(plan.schedule, "value", str(plan.schedule))})
                if ck is not None:
                    ck.save(self.model.parameters(), self._state, self.history, self.step, origin,
                            target, epoch + 1)
                if callback is not None:
                    callback(dict(record))
        finally:
            arena.close()
            if guard is not None:
                guard.close()
            if ref is not None:  # the pilot keeps the task functions: let them not keep the model
                ref.program = None
        return self.history

    def predict(self, X) -> np.ndarray:
        """The model's outputs for ``X`` (no dropout), computed by tasks on the pilot."""
        X = self._check_x(X)
        shapes = self.model.shapes(X.shape[1:])
        if not len(X):
            return np.empty((0,) + shapes[-1], dtype=X.dtype)  # as the model's forward gives
        stage_layers = self._stages(shapes, min(len(X), 64) or 1)
        if self._transport() is Transport.FUTURES:
            return self._predict_futures(X, stage_layers)
        layout = Layout()
        layout.add(("X",), X.shape, X.dtype)
        layout.add(("out",), (len(X),) + shapes[-1], X.dtype)
        sizes = self._stage_sizes(stage_layers)
        for s, size in enumerate(sizes):
            layout.add(("param", s, 0), (size,), X.dtype)
        arena = Arena(layout)
        try:
            arena.view(("X",))[:] = X
            self._push_params(arena, stage_layers, sizes, 0)
            program = self._program(arena, stage_layers, None)
            ref = ProgramRef(program, pickled=self.pilot is not None)
            op = task_function(ref, "predict", 0)
            pilot = self.pilot if self.pilot is not None else _Inline()
            chunk = self.PREDICT_ROWS
            futs = [self._submit(pilot, op, lo, min(lo + chunk, len(X)), 0)
                    for lo in range(0, len(X), chunk)]
            self._wait(futs)
            out = arena.view(("out",)).copy()
            ref.program = None  # (as in fit)
            return out
        finally:
            arena.close()

    def _predict_futures(self, X, stage_layers) -> np.ndarray:
        """``predict`` across hosts: each task gets its rows and the parameters, returns
        its outputs."""
        sizes = self._stage_sizes(stage_layers)
        layout = Layout()
        for s, size in enumerate(sizes):
            layout.add(("param", s, 0), (size,), X.dtype)
        program = HostProgram(self._program(PrivateArena(layout), stage_layers, None), [], 1)
        ref = ProgramRef(program, pickled=self.pilot is not None, anywhere=True)
        op = task_function(ref, HostOp.PREDICT, 0)
        params = self._flat_params(stage_layers, sizes)
        pilot = self.pilot if self.pilot is not None else _Inline()
        chunk = self.PREDICT_ROWS
        futs = [self._submit(pilot, op, params, X[lo:lo + chunk]) for lo in range(0, len(X), chunk)]
        try:
            self._wait(futs)
            return np.concatenate([f.result() for f in futs]).astype(X.dtype, copy=False)
        finally:
            ref.program = None  # (as in fit)

    def _transport(self) -> Transport:
        if self.transport is not None:
            return self.transport
        return Transport.FUTURES if workers_elsewhere(self.pilot) else Transport.ARENA

    def evaluate(self, X, y) -> float:
        """Accuracy on ``(X, y)`` for cross-entropy; the mean squared error for ``loss="mse"``."""
        X = self._check_x(X)
        if not len(X):
            raise ValueError("evaluate: X has no rows")
        z = self.predict(X)
        if self.loss is Loss.CROSS_ENTROPY:
            labels = self._check_labels(y, len(X), z.shape[1])
            return float((z.argmax(axis=1) == labels).mean())
        t = np.asarray(y, dtype=z.dtype).reshape(z.shape)
        return float(((z - t) ** 2).mean())

    # -- one epoch ---------------------------------------------------------------------
    def _epoch(self, pilot, ops, graph, n, batch_size):
        """Submit the epoch's steps, at most ``WINDOW`` of them unfinished at a time."""
        plan = self.plan
        R, S, M = plan.replicas, plan.stages, plan.micro_batches
        prev = [[] for _ in range(S)]  # the previous step's update tasks of each stage
        all_futs, loss_futs, steps = [], [], []
        try:
            for lo in range(0, n, batch_size):
                hi = min(lo + batch_size, n)
                rows = micro_batches(lo, hi, R, M)
                futs = []
                for node in graph:
                    deps = [futs[d] for d in node.deps]
                    if node.after_update:
                        deps.extend(prev[node.stage])
                    if node.kind is OpKind.REDUCE:
                        args = (self.step, node.index, *node.operands)
                    elif node.kind is OpKind.UPDATE:
                        args = (self.step, node.operands, node.index, R)
                    else:
                        a, b = rows[node.replica][node.index]
                        args = (self.step, node.replica, node.index, a, b, lo, hi - lo)
                    fut = self._submit(pilot, ops[(node.kind, node.stage)], *args, *deps)
                    futs.append(fut)
                    if node.stage == S - 1 and node.kind in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD):
                        loss_futs.append(fut)
                prev = [[] for _ in range(S)]
                if R <= 2:  # fused updates: each (replica, stage)'s last op
                    last = {(node.replica, node.stage): fut for node, fut in zip(graph, futs, strict=True)}
                    for (_, s), fut in last.items():
                        prev[s].append(fut)
                else:
                    for node, fut in zip(graph, futs, strict=True):
                        if node.kind is OpKind.UPDATE:
                            prev[node.stage].append(fut)
                all_futs.extend(futs)
                steps.append(futs)
                self.step += 1
                if len(steps) > self.WINDOW:  # bounded driver memory; errors surface early
                    self._wait(steps.pop(0))
            self._wait(all_futs)
        except BaseException:
            for f in all_futs:
                f.cancel()
            raise
        return [f.result() for f in loss_futs]

    def _submit(self, pilot, fn, *args):
        if self.pilot is None:  # the in-process serial executor
            return pilot.submit(fn, *args)
        return pilot.options(retries=self.retries, timeout=self.timeout).submit(fn, *args)

    @staticmethod
    def _wait(futs, limit: float | None = None, what: str = "") -> None:
        done, pending = cf.wait(futs, timeout=limit, return_when=cf.FIRST_EXCEPTION)
        for f in futs:  # the earliest failed task in submission order is the cause
            if f.done() and not f.cancelled() and f.exception() is not None:
                for g in futs:
                    g.cancel()
                raise f.exception()
        if pending:
            for g in futs:
                g.cancel()
            raise TimeoutError(f"dl.Trainer: {what} did not finish within {limit:g} s "
                               f"({len(pending)} of its {len(futs)} tasks never returned): "
                               "check that the pilot's hosts are reachable, or pass "
                               "Trainer(timeout=seconds per task) to bound each task")

    # -- checks --------------------------------------------------------------------------
    def _check_x(self, X) -> np.ndarray:
        kind = getattr(getattr(X, "dtype", None), "kind", None)
        if kind == "c":  # the cast below would drop the imaginary part with only a warning
            raise ValueError(f"X must hold real numbers, got dtype {X.dtype}")
        try:
            X = np.asarray(X, dtype=self.model.dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"X cannot be read as {self.model.dtype} numbers: {exc}") from None
        if X.ndim < 2:
            raise ValueError(f"X must be shaped (samples, features...), got shape {X.shape}")
        bad = ~np.isfinite(X).all(axis=tuple(range(1, X.ndim)))  # (no reshape: 0 rows work)
        if bad.any():
            raise ValueError(f"X holds NaN or inf (first at row {int(np.argmax(bad))})")
        return np.ascontiguousarray(X)

    def _check_labels(self, y, n, classes) -> np.ndarray:
        y = np.asarray(y)
        if y.shape != (n,):
            raise ValueError(f"y must be shaped ({n},) (one class label per row of X), got {y.shape}")
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
                raise ValueError("y must hold integer class labels for loss='cross_entropy'")
        elif y.dtype.kind not in "iub":
            raise ValueError(f"y must hold integer class labels, got dtype {y.dtype}")
        y = y.astype(np.int64)
        bad = (y < 0) | (y >= classes)
        if bad.any():
            i = int(np.argmax(bad))
            last = len(self.model.layers) - 1
            raise ValueError(f"label y[{i}] = {y[i]} is out of range: the last layer "
                             f"{layer_name(last, self.model.layers[last])} has {classes} outputs, "
                             f"so labels must be in 0..{classes - 1}")
        return y

    def _check_data(self, X, y):
        X = self._check_x(X)
        shapes = self.model.shapes(X.shape[1:])
        n = len(X)
        if n == 0:
            raise ValueError("fit: X has no rows")
        out = shapes[-1]
        if self.loss is Loss.CROSS_ENTROPY:
            if len(out) != 1:
                raise ShapeError(f"loss='cross_entropy' needs a model output of one axis of class "
                                 f"scores, but it is shaped {out} per sample")
            Y = self._check_labels(y, n, out[0])
        else:
            Y = np.asarray(y, dtype=self.model.dtype)
            if Y.size != n * int(np.prod(out)) or len(Y) != n:
                raise ValueError(f"y must be shaped ({n}, {', '.join(map(str, out))}) for loss='mse', "
                                 f"got {Y.shape}")
            Y = Y.reshape((n,) + out)
            if not np.all(np.isfinite(Y)):
                raise ValueError("y holds NaN or inf")
        return X, np.ascontiguousarray(Y), shapes

    # -- layout --------------------------------------------------------------------------
    def _stages(self, shapes, batch_size) -> list[list[int]]:
        if self.stage_layers is None:
            if self.plan.shards is not None:
                self.stage_layers = check_shards(self.plan.shards, len(self.model.layers))
            elif self.plan.stages == 1:
                self.stage_layers = [list(range(len(self.model.layers)))]
            else:
                costs = self.model.layer_costs(shapes, max(1, min(batch_size, 64)))
                self.stage_layers = partition(costs, self.plan.stages)
        return self.stage_layers

    def _stage_shapes(self, stage_layers):
        per_layer = self.model.param_shapes()
        return [[per_layer[i] for i in stage] for stage in stage_layers]

    def _stage_sizes(self, stage_layers):
        return [sum(int(np.prod(s)) for layer in stage for s in layer)
                for stage in self._stage_shapes(stage_layers)]

    def _layout(self, X, Y, shapes, stage_layers, mb):
        plan, dtype = self.plan, self.model.dtype
        R = plan.replicas
        layout = Layout()
        layout.add(("X",), X.shape, X.dtype)
        layout.add(("Y",), Y.shape, Y.dtype)
        layout.add(("perm",), (len(X),), np.int64)
        sizes = self._stage_sizes(stage_layers)
        tree, _ = reduction_tree(R)
        for s, size in enumerate(sizes):
            for v in (0, 1):
                layout.add(("param", s, v), (size,), dtype)
                for j in range(self.optimizer.slots):
                    layout.add(("state", s, j, v), (size,), dtype)
                for r in range(R):
                    layout.add(("acc", r, s, v), (size,), dtype)
            for k in range(len(tree)):
                layout.add(("node", s, k), (size,), dtype)
        rows = Program.task_count(R, plan.stages, plan.micro_batches, len(tree))
        layout.add(("done",), (rows,), np.int64)  # the step + 1 each task last finished
        layout.add(("result",), (rows, 3), np.float64)  # and its result (program.Program.run)
        for s in range(plan.stages):  # fused updates (R <= 2): who arrived, which step is applied
            layout.add(("arrived", s), (R,), np.int64)
            layout.add(("updated", s), (1,), np.int64)
        for s in range(plan.stages):
            out_shape = (mb,) + shapes[stage_layers[s][-1] + 1]
            for r in range(R):
                for j in range(self._slots()[s]):
                    for k, i in enumerate(self.model.saved_layers(stage_layers[s])):
                        if k or s == 0:  # a later stage's input is the previous stage's "out"
                            layout.add(("act", r, s, j, k), (mb,) + shapes[i], dtype)
                    if s < plan.stages - 1:
                        layout.add(("out", r, s, j), out_shape, dtype)
                    layout.add(("dout", r, s, j), out_shape, dtype)
        return layout, sizes

    def _flatten(self, arrays, stage_layers, view) -> None:
        """Per-parameter arrays (W1, b1, ...) into each stage's flat region ``view(s)``."""
        counts = [len(s) for s in self.model.param_shapes()]
        first = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        for s, stage in enumerate(stage_layers):
            flat = view(s)
            o = 0
            for i in stage:
                for p in arrays[first[i]:first[i + 1]]:
                    flat[o:o + p.size] = np.asarray(p).ravel()
                    o += p.size

    def _unflatten(self, stage_layers, view) -> list[np.ndarray]:
        out = []
        for s, stage in enumerate(self._stage_shapes(stage_layers)):
            flat = view(s)
            o = 0
            for layer in stage:
                for shape in layer:
                    n = int(np.prod(shape))
                    out.append(flat[o:o + n].reshape(shape).copy())
                    o += n
        return out

    def _push_params(self, arena, stage_layers, sizes, v) -> None:
        self._flatten(self.model.parameters(), stage_layers, lambda s: arena.view(("param", s, v)))

    def _fill(self, arena, X, Y, stage_layers, sizes) -> None:
        arena.view(("X",))[:] = X
        arena.view(("Y",))[:] = Y
        v = self.step % 2
        self._push_params(arena, stage_layers, sizes, v)
        if self._state is not None:
            for j, arrays in enumerate(self._state):
                self._flatten(arrays, stage_layers, lambda s, j=j: arena.view(("state", s, j, v)))

    def _pull(self, arena, stage_layers, sizes) -> None:
        """Copy parameters and optimizer state of the current version out of the arena."""
        v = self.step % 2
        self.model.set_parameters(self._unflatten(stage_layers, lambda s: arena.view(("param", s, v))))
        self._state = [self._unflatten(stage_layers, lambda s, j=j: arena.view(("state", s, j, v)))
                       for j in range(self.optimizer.slots)] or None

    def _flat_params(self, stage_layers, sizes) -> list[np.ndarray]:
        """The model's parameters as one flat array per stage (fresh arrays)."""
        params = [np.empty(size, self.model.dtype) for size in sizes]
        self._flatten(self.model.parameters(), stage_layers, lambda s: params[s])
        return params

    def _flat_state(self, stage_layers, sizes) -> list[tuple]:
        """Per stage: (flat parameters, [flat optimizer state per slot]), fresh arrays."""
        params = self._flat_params(stage_layers, sizes)
        state = [[np.zeros(size, self.model.dtype) for size in sizes]
                 for _ in range(self.optimizer.slots)]
        for j, arrays in enumerate(self._state or ()):
            self._flatten(arrays, stage_layers, lambda s, j=j: state[j][s])
        return [(params[s], [state[j][s] for j in range(self.optimizer.slots)])
                for s in range(len(sizes))]

    def _set_flat_state(self, stage_layers, current) -> None:
        """The model's parameters and the optimizer state from ``_flat_state``'s form."""
        self.model.set_parameters(self._unflatten(stage_layers, lambda s: current[s][0]))
        self._state = [self._unflatten(stage_layers, lambda s, j=j: current[s][1][j])
                       for j in range(self.optimizer.slots)] or None

    def _program(self, arena, stage_layers, guard) -> Program:
        if self.pilot is None:
            blas = None
        else:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            blas = max(1, (cpus or 1) // max(1, self.pilot.workers))
        engine = self.model.engine(stage_layers)
        return Program(engine, arena, self._stage_shapes(stage_layers), self.loss, self.optimizer,
                       self.plan.stages, self.plan.micro_batches, self._slots(), blas, self.model.seed,
                       self.plan.replicas, len(reduction_tree(self.plan.replicas)[0]), guard)

    def _slots(self) -> list[int]:
        p = self.plan
        return [slots(p.schedule, p.stages, p.micro_batches, s) for s in range(p.stages)]

    # -- checkpoints -----------------------------------------------------------------------
    def _fingerprint(self, X, Y, batch_size, shuffle, seed) -> dict:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(X).view(np.uint8).data)
        digest.update(np.ascontiguousarray(Y).view(np.uint8).data)
        return {"model": repr(self.model), "plan": self.plan.describe(), "optimizer": repr(self.optimizer),
                "loss": self.loss.value, "batch_size": int(batch_size), "shuffle": bool(shuffle),
                "seed": int(seed), "data": digest.hexdigest()}


def _publish(topic: str, record: dict) -> None:
    """One record for the dashboard's progress page (``shoal.publish``); never fails a fit."""
    try:
        shoal.publish(topic, record)
    except (TypeError, ValueError):
        pass
