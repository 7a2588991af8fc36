"""What runs inside the tasks: one ``Program`` per training run, one task function per op kind and stage.

The trainer submits, per run, one plain function per (op kind, stage) made by
``task_function``: a closure over a ``ProgramRef`` (the run's id and its ``Program``
pickled *once*, in the driver, when the run starts).  The runtime sends a plain
function to each worker once (a DEFINE) and names it by id in every later task, so a
task carries only integers and the small results of the tasks it depends on; the
worker unpickles the program on its first task of the run and keeps it in a
per-process table of the last ``LIVE`` runs (``_LIVE``; an older one is released:
its arena unmapped, rebuilt from the kept bytes if one of its tasks ever comes back).
Rejected: submitting a callable ``Op`` object (what the first version did) — the
runtime treats a callable object as state that may change and pickles it with every
task, so each task re-pickled the program in the driver's pump (and, for a
``TorchModule``, the whole torch model: 27 ms of driver CPU per step) and each worker
re-unpickled it.  ``__name__`` of a task function names the task in traces
(``dl.forward[s1]``): the pipeline bubble is measured from those spans.

Every op is deterministic in its inputs and idempotent (it writes only buffers that no
task reads before it finishes; arena.py), so where a task runs, and whether it ran
twice after a worker died, cannot change a bit of the result.  A re-run is harmless
only while nothing has reused the buffers it reads or writes, so each op first checks
the run's *done table* in the arena (``Program.done``): a copy of a task that already
finished (a duplicate the runtime may start after a worker died: the task's result was
lost, or the task had been moved to another worker) returns the stored result without
touching any buffer — by then the first copy's dependents may be overwriting them.

BLAS threads: each op limits the BLAS pools of its process once per process, with
threadpoolctl, to the pilot's cores divided by its workers **and at most the CPUs the
process may run on**: a shoal worker is pinned to one CPU, and two OpenBLAS threads
on one CPU spin against each other (a matrix product several times slower, a 1-worker
pilot a small fraction of one process's speed: docs/benchmarks.md, "Measurements behind
design choices").  OpenBLAS splits a matrix product over rows
and columns, never over the summed dimension, so its results do not depend on the
thread count (tests compare 1, 2 and 16 workers bitwise); torch's CPU kernels do
(measured: 1 and 2 threads differ in the last bit), so the torch engine runs every
task on one torch thread (torch_module.py).
"""

from __future__ import annotations

import fcntl
import math
import os
import pickle
import socket
import uuid
from collections import OrderedDict

import numpy as np

from .layers import Ctx
from .losses import Loss, value_and_grad
from .plan import splits
from .schedules import OpKind

_limited: list = [None]


def limit_blas(threads: int) -> None:
    """Limit this process's BLAS pools to ``threads``, but never to more threads than the
    CPUs this process may run on (once per process and value)."""
    if _limited[0] == threads:
        return
    if threads is not None:
        usable = threads
        if hasattr(os, "sched_getaffinity"):
            usable = max(1, min(threads, len(os.sched_getaffinity(0))))
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=usable)
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
    """Everything a task of one training run needs; unpickled once per worker (``ProgramRef``)."""

    def __init__(self, engine, arena, stage_param_shapes, loss: Loss, optimizer, plan_stages: int,
                 micro: int, slots: list[int], blas_threads: int, seed: int, replicas: int = 1,
                 tree_nodes: int = 0, guard: Guard | None = None):
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
        self.replicas = replicas
        self.tree_nodes = tree_nodes  # reduction tree nodes per stage
        self.guard = guard  # None: in this process, where no task runs twice
        self.fused = replicas <= 2  # the update rides on each stage's last backward (_arrive)
        self.rows = None  # across hosts: (first row, X rows, y rows) of the task (across_hosts.py)

    @staticmethod
    def task_count(replicas: int, stages: int, micro: int, tree_nodes: int) -> int:
        """Rows of the done table: one per task of a step (``_identity``)."""
        return 3 * stages * replicas * micro + stages * tree_nodes + stages * replicas

    def _arrive(self, step: int, r: int, s: int) -> None:
        """Replica ``r`` finished its gradient of stage ``s`` (fused updates): the last
        replica to get here applies the update, once per step.

        Under the stage's lock (arrivals are read-modify-write; a copy of a killed task
        may arrive again): mark the arrival; if every replica has arrived and the step's
        update is not applied yet, apply it (reads version v, writes 1 - v: a re-run
        after a kill recomputes the same bytes from intact inputs) and record it.  The
        next step's ops depend on every replica's last op, so they start after it."""
        arrived, updated = self.arena.view(("arrived", s)), self.arena.view(("updated", s))
        rows = self.task_count(self.replicas, self.stages, self.micro, self.tree_nodes)
        with (self.guard.hold(rows + s) if self.guard is not None else _NoLock()):
            arrived[r] = max(arrived[r], step + 1)
            if updated[0] > step or (arrived <= step).any():
                return
            roots = tuple(("leaf", i) for i in range(self.replicas))
            self._update(s, (step, roots, 0, 1))
            updated[0] = step + 1

    def _identity(self, kind: OpKind, s: int, args: tuple) -> tuple[int, int]:
        """(row of the done table, step) of a task: which task of which step it is."""
        R, S, M = self.replicas, self.stages, self.micro
        if kind is OpKind.REDUCE:
            step, k = args[:2]
            return 3 * S * R * M + s * self.tree_nodes + k, step
        if kind is OpKind.UPDATE:
            step, _, chunk = args[:3]
            return 3 * S * R * M + S * self.tree_nodes + s * R + chunk, step
        step, r, m = args[:3]
        code = (OpKind.FORWARD, OpKind.BACKWARD, OpKind.FORWARD_BACKWARD).index(kind)
        return ((code * S + s) * R + r) * M + m, step

    def release(self) -> None:
        """Unmap this run's memory in this process (a later task maps it again)."""
        self.arena.close()
        if self.guard is not None:
            self.guard.close()

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
        if self.rows is not None:  # the rows came with the task
            first, X, _ = self.rows
            x[...] = X[lo - first:hi - first]
            return x
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
        if self.rows is not None:
            first, _, Y = self.rows
            y = Y[lo - first:hi - first]
        else:
            y = self.arena.view(("Y",))[self.arena.view(("perm",))[lo:hi]]
        value, grad, correct = value_and_grad(self.loss, z, y, batch_rows)
        if not math.isfinite(value):
            raise FloatingPointError(
                f"the loss is {value} at step {step} (replica {r}, micro-batch {m}, epoch rows "
                f"{lo}..{hi}): lower the learning rate or check the inputs for NaN/inf")
        return value, grad, correct

    # -- ops -----------------------------------------------------------------------
    def run(self, kind: OpKind, s: int, args: tuple):
        """Run a task once: a copy of a task that finished already only returns its result.

        The runtime may start a task twice (after a worker died: the task's result was
        lost, or it had been moved to another worker).  The second copy may run after
        the first copy's dependents went on and reused the buffers the task reads and
        writes, so it must not touch them.  Copies of one task run one at a time under
        a lock of their own (``Guard``; a killed holder's lock is released by the
        kernel): the one that finds the task done returns the stored result; the one
        that does not knows no dependent has started, so its inputs are intact.  A copy of a
        step that a later step has already re-run returns None: the runtime delivered its
        first copy's result long before (the next step waited for it)."""
        limit_blas(self.blas_threads)
        if self.guard is None:
            return self._run(kind, s, args)
        row, step = self._identity(kind, s, args)
        done, results = self.arena.view(("done",)), self.arena.view(("result",))
        with self.guard.hold(row):
            if done[row] > step + 1:  # stale: its first copy's result was delivered long ago
                return None
            if done[row] == step + 1:  # (a lost result's retry gets here: the stored one is its)
                r = results[row]
                return None if r[2] < 0 else (float(r[0]), int(r[1]), int(r[2]))
            out = self._run(kind, s, args)
            results[row] = (-1.0, -1.0, -1.0) if out is None else out
            done[row] = step + 1
        return out

    def _run(self, kind: OpKind, s: int, args: tuple):
        if kind is OpKind.REDUCE:
            _, k, a, b = args[:4]
            np.add(self._operand(s, a), self._operand(s, b), out=self.arena.view(("node", s, k)))
            return None
        if kind is OpKind.UPDATE:
            self._update(s, args)
            return None
        out = self.compute(kind, s, args)
        step, r, m = args[:3]
        if self.fused and m == self.micro - 1 and kind is not OpKind.FORWARD:
            self._arrive(step, r, s)
        return out

    def _update(self, s: int, args: tuple) -> None:
        """The optimizer on one slice of stage ``s``'s parameters: version v -> 1 - v."""
        step, operands, chunk, chunks = args[:4]
        a, b = splits(0, self.arena.view(("param", s, 0)).size, chunks)[chunk]
        g = self._operand(s, operands[0])[a:b]
        if len(operands) == 2:  # into this process's scratch: a fresh 5 MB array page-faults
            g = np.add(g, self._operand(s, operands[1])[a:b], out=self._scratch(b - a, g.dtype))
        v = step % 2
        opt = self.optimizer
        state = [self.arena.view(("state", s, j, v))[a:b] for j in range(opt.slots)]
        state_out = [self.arena.view(("state", s, j, 1 - v))[a:b] for j in range(opt.slots)]
        opt.update(self.arena.view(("param", s, v))[a:b], g, state,
                   self.arena.view(("param", s, 1 - v))[a:b], state_out, step + 1)

    def _scratch(self, n: int, dtype) -> np.ndarray:
        """A private array of this process (not shared: a re-run elsewhere has its own)."""
        cache = self.__dict__.setdefault("_scratch_arrays", {})
        key = (n, np.dtype(dtype).str)
        if key not in cache:
            cache[key] = np.empty(n, dtype)
        return cache[key]

    def compute(self, kind: OpKind, s: int, args: tuple):
        """A forward, backward or fused forward-backward of one micro-batch."""
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

    def call(self, kind, stage: int, args: tuple):
        """What a task function of this run runs (``task_function``)."""
        if kind == "predict":
            return self.predict(*args[:3])
        return self.run(kind, stage, args)

    def predict(self, lo, hi, v):
        """Rows ``lo..hi`` of ``X`` through every stage (no dropout) into the ``out`` region."""
        limit_blas(self.blas_threads)
        x = self.arena.view(("X",))[lo:hi]
        ctx = Ctx(False, self.seed)
        for s in range(self.stages):
            x, _ = self.engine.forward(s, self.params(s, v), x, ctx, False)
        self.arena.view(("out",))[lo:hi] = np.asarray(x)
        return None


class _NoLock:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


class Guard:
    """One lock per task of a step: POSIX byte-range locks on a memfd the driver made.

    Workers open it as ``/proc/<driver pid>/fd/<fd>`` (the way ``shoal.SharedArray``
    maps its memory), so it works where the arena does: on the driver's machine.  The
    kernel drops a dead process's locks, so a SIGKILLed holder never blocks a re-run.
    POSIX locks belong to a process, not a thread: this relies on a shoal worker running
    one task at a time (dl tasks never wait inside a task, so none nests another)."""

    def __init__(self):
        self.name = f"shoal-dl-{uuid.uuid4().hex}"
        self.pid = os.getpid()
        self.origin = os.memfd_create(self.name, os.MFD_CLOEXEC)
        self.fd = self.origin

    def __getstate__(self):
        return {"name": self.name, "pid": self.pid, "origin": self.origin}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.fd = None  # opened on first use

    def _open(self) -> int:
        if self.fd is None:
            if self.pid == os.getpid():
                raise RuntimeError("the training run's lock table was closed: a task outlived its fit")
            path = f"/proc/{self.pid}/fd/{self.origin}"
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise OSError(f"cannot open the training run's lock table {path}: {exc}; dl tasks "
                              "run only on the driver's machine (docs/dl.md)") from exc
            if self.name not in os.readlink(f"/proc/self/fd/{fd}"):
                os.close(fd)
                raise RuntimeError("the training run's lock table was closed: a task outlived its fit")
            self.fd = fd
        return self.fd

    def hold(self, row: int):
        return _Held(self._open(), row)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Held:
    __slots__ = ("fd", "row")

    def __init__(self, fd, row):
        self.fd, self.row = fd, row

    def __enter__(self):
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, self.row)

    def __exit__(self, *exc):
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self.row)


LIVE = 2  # runs whose programs a worker keeps unpickled (two trainers interleaving their fits)
_LIVE: OrderedDict = OrderedDict()  # run id -> Program, in this process


class ProgramRef:
    """A run's program as the task functions carry it: pickled once, in the driver.

    In the driver (``program`` set) it is the program itself; in a worker it holds the
    run id and the bytes, and ``get`` returns the program unpickled at most once per
    process while the run is among the last ``LIVE`` this process ran."""

    def __init__(self, program, pickled: bool, anywhere: bool = False):
        self.run = uuid.uuid4().hex
        self.host = None if anywhere else socket.gethostname()  # None: any host may run it
        self.program = program
        self.blob = _dumps(program) if pickled else None

    def __getstate__(self):
        if self.blob is None:
            self.blob = _dumps(self.program)
        return {"run": self.run, "host": self.host, "blob": self.blob}

    def __setstate__(self, state):
        self.run, self.host, self.blob, self.program = state["run"], state["host"], state["blob"], None

    def get(self) -> Program:
        if self.program is not None:
            return self.program
        program = _LIVE.get(self.run)
        if program is None:
            if self.host is not None and socket.gethostname() != self.host:
                raise RuntimeError(
                    f"a dl.Trainer task reached a worker on host {socket.gethostname()!r}, but the "
                    f"training run's memory (its arena) is on the driver's host {self.host!r}: dl "
                    "arena tasks run only on workers of the driver's machine: leave "
                    "Trainer(transport=None) or pass dl.Transport.FUTURES (docs/dl.md, 'Across hosts')")
            program = pickle.loads(self.blob)
            _LIVE[self.run] = program
            while len(_LIVE) > LIVE:
                _LIVE.popitem(last=False)[1].release()
        else:
            _LIVE.move_to_end(self.run)
        return program

    def call(self, kind, stage, args):
        return self.get().call(kind, stage, args)


def _dumps(obj) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(obj, 5)
    except Exception as exc:  # noqa: BLE001 - named below, the layer if we can tell which
        culprit = ""
        for i, layer in enumerate(getattr(getattr(obj, "engine", None), "layers", None) or ()):
            try:
                cloudpickle.dumps(layer, 5)
            except Exception:  # noqa: BLE001
                culprit = f" layer {i} ({type(layer).__name__}) does not pickle;"
                break
        raise TypeError(f"dl.Trainer: the model cannot be sent to the workers ({exc!r}):{culprit} "
                        "every layer and its attributes must pickle (a lock, an open file or a "
                        "socket held by a torch module cannot)") from exc


def task_function(ref: ProgramRef, kind, stage: int):
    """The task function of one op kind of one stage of a run: a plain function, so the
    runtime sends it to each worker once and then names it by id.  Its ``__name__``
    (``dl.forward[s1]``) names the task in traces."""

    def op(*args):
        return ref.call(kind, stage, args)

    label = getattr(kind, "value", kind)
    op.__name__ = op.__qualname__ = f"dl.{label}[s{stage}]"
    return op
