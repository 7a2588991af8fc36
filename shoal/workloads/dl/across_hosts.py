"""Training on workers of other hosts: the arrays a task needs travel as task results.

The shared arena (arena.py) is memory of the driver's machine: a worker of another host
cannot map it.  With ``Transport.FUTURES`` no memory is shared between processes; a step is::

    driver ── R replica tasks: the step, its shard's rows (X and y), the parameters (from
    │          the previous step's update result, held by the driver);
    │          each runs ITS replica's whole schedule — every stage's forwards and backwards
    │          over its micro-batches, in the step graph's order — in its own process's
    │          arena (PrivateArena: the same region names, so the same code and bits) and
    │          returns (loss stats, the gradient of each stage)
    ├─ the plan's reduction tree: one task per tree node, the sum of its two operands
    └─ one update task: the optimizer on every stage from the tree root's one or two
       operands; returns the new parameters and optimizer state
    driver: takes the update's result, then submits the next step

Transport: the pilot's own.  A future among a task's arguments is resolved where the task
runs (on dask: the dask worker fetches the result from the worker holding it, over
dask's comm), so a gradient goes from its replica's host to its tree node's host, never
through the driver on that way; the parameters go out with each step's replica tasks.
The tree is ``plan.reduction_tree`` (fixed by R) and every sum is the arena path's, so
which workers or hosts ran what never enters the arithmetic: the parameters are bitwise
those of the arena path and of the in-process run.  Every task is a pure function of
its arguments, so a task re-run after its worker or host died (the trainer's retries; a
finished result lost with its host is recomputed by dask from the same arguments) gives
the same bytes; a step that never returns fails the fit after ``STEP_LIMIT_S``.

Rejected: chaining the steps by futures (update k's future as the parameters of step
k + 1, no wait in the driver): in the multi-host crash test a crash lost finished
results of that chain, the backend's gather rescheduled them and the fit hung (a lost
result then needs its inputs, back along the chain, recomputed too); a shared arena per host (the pilot cannot aim a task at a host — dask picks the
worker — so a replica's stages and micro-batches, which must meet in one memory, would
land on different hosts; one task per replica step keeps them together with no aiming);
torch.distributed/gloo (a second transport with its own rendezvous, process groups and
failure handling beside dask's, where a collective fails as a whole and a task is
retried alone); a parameter server task (pins a worker, cannot be retried); sending the
data set to every host once (a shard's rows, sent with its task, add up to the data set
once per epoch whatever the host count).
Costs: the pilot returns every result to the driver too (the dask backend settles each
future with its value), so the driver receives R gradients and one parameter set per
step; pipeline stages do not spread over hosts (a replica's stages run one after the
other in its task).
"""

from __future__ import annotations

import enum
import socket
from dataclasses import dataclass

import numpy as np

from .arena import PrivateArena
from .plan import micro_batches, reduction_tree
from .program import limit_blas
from .schedules import OpKind


class Transport(enum.Enum):
    """How the tasks of a training run exchange arrays."""

    ARENA = "arena"  # one shared-memory arena on the driver's machine (arena.py)
    FUTURES = "futures"  # task arguments and results: workers on any host (this module)


class HostOp(enum.Enum):
    """The task kinds of a run across hosts (names of its task functions)."""

    REPLICA_STEP = "replica_step"
    REDUCE = "reduce"
    UPDATE = "update"
    PREDICT = "predict"


@dataclass
class ReplicaResult:
    """What a replica task returns: the loss stats of its last-stage forwards (in the step
    graph's order) and the gradient of each stage (flat, summed over its micro-batches)."""

    stats: list
    grads: list


def workers_elsewhere(pilot) -> bool:
    """Whether some of ``pilot``'s workers run on another host than this driver (a dask
    pilot whose dask workers' host names are not all this host's; none connected yet:
    True, the path that works wherever they start)."""
    import shoal

    if getattr(pilot, "backend", None) is not shoal.BackendKind.DASK:  # (None: in this process)
        return False
    client = getattr(pilot.shared, "client", None)
    if client is None:  # pragma: no cover - a dask factory without a client
        return True
    hosts = [h for h in client.run(socket.gethostname, on_error="ignore").values()
             if isinstance(h, str)]
    here = socket.gethostname()
    return not hosts or any(h != here for h in hosts)


def _grads(operand) -> list:
    return operand.grads if isinstance(operand, ReplicaResult) else operand


class HostProgram:
    """The worker side of a run across hosts: a ``Program`` over a ``PrivateArena``."""

    def __init__(self, program, graph, replicas: int):
        if not isinstance(program.arena, PrivateArena):
            raise TypeError("HostProgram needs a Program over a PrivateArena")
        self.program = program
        self.graph = [n for n in graph if n.kind in (OpKind.FORWARD, OpKind.BACKWARD,
                                                     OpKind.FORWARD_BACKWARD)]
        self.replicas = replicas

    def call(self, kind: HostOp, stage: int, args: tuple):
        limit_blas(self.program.blas_threads)
        if kind is HostOp.REPLICA_STEP:
            return self.replica_step(*args)
        if kind is HostOp.REDUCE:
            a, b = args
            return [np.add(x, y) for x, y in zip(_grads(a), _grads(b), strict=True)]
        if kind is HostOp.UPDATE:
            return self.update(*args)
        return self.predict(*args)

    def _load(self, params, v) -> None:
        for s, flat in enumerate(params):
            self.program.arena.view(("param", s, v))[...] = flat

    def replica_step(self, step, r, lo, bn, first, X, Y, params) -> ReplicaResult:
        """Replica ``r``'s share of step ``step`` (batch rows ``lo .. lo + bn``; ``X``, ``Y``
        its shard's rows, from ``first``), with ``params`` the stages' parameters."""
        p, v = self.program, step % 2
        self._load(params, v)
        rows = micro_batches(lo, lo + bn, self.replicas, p.micro)[r]
        p.rows = (first, X, Y)
        stats = []
        try:
            for node in self.graph:
                if node.replica != r:
                    continue
                a, b = rows[node.index]
                out = p.compute(node.kind, node.stage, (step, r, node.index, a, b, lo, bn))
                if node.stage == p.stages - 1 and node.kind is not OpKind.BACKWARD:
                    stats.append(out)
        finally:
            p.rows = None
        last = (p.micro - 1) % 2
        return ReplicaResult(stats, [p.arena.view(("acc", r, s, last)).copy()
                                     for s in range(p.stages)])

    def update(self, step, current, *roots) -> list:
        """The optimizer on every stage: ``current`` per stage is ``(parameters, state)``;
        the gradient is the tree root's one or two operands summed (the arena path's
        ``Program._update``, on whole stages: the optimizer is elementwise)."""
        opt, out = self.program.optimizer, []
        for s, (param, state) in enumerate(current):
            g = _grads(roots[0])[s]
            if len(roots) == 2:
                g = np.add(g, _grads(roots[1])[s])
            param_out = np.empty_like(param)
            state_out = [np.empty_like(param) for _ in range(opt.slots)]
            opt.update(param, g, list(state), param_out, state_out, step + 1)
            out.append((param_out, state_out))
        return out

    def predict(self, params, X) -> np.ndarray:
        """``X`` through every stage with these parameters (no dropout)."""
        from .layers import Ctx

        p = self.program
        self._load(params, 0)
        # (an array that arrived over dask's comm may be read-only; torch warns on those)
        ctx, x = Ctx(False, p.seed), X if X.flags.writeable else X.copy()
        for s in range(p.stages):
            x, _ = p.engine.forward(s, p.params(s, 0), x, ctx, False)
        return np.asarray(x)

    def release(self) -> None:
        self.program.arena.close()


class HostEpoch:
    """The driver side: submits an epoch's steps as replica, tree and update tasks."""

    # the longest a step may take when the trainer has no task timeout: a result that never
    # arrives (a host that vanished in a way nothing reports) fails the fit, never hangs it
    STEP_LIMIT_S = 900.0

    def __init__(self, trainer, ops, graph, submit, wait):
        self.trainer = trainer
        self.submit, self.wait = submit, wait  # the trainer's: with its retries and timeout
        self.ops = ops  # HostOp -> task function
        plan = trainer.plan
        self.R, self.S, self.M = plan.replicas, plan.stages, plan.micro_batches
        self.tree, self.root = reduction_tree(self.R)
        # (replica, index among that replica's stats) of each loss, in the step graph's
        # order: the arena path sums the losses in that order
        seen = [0] * self.R
        self.losses = []
        for node in graph:
            if node.stage == self.S - 1 and node.kind in (OpKind.FORWARD, OpKind.FORWARD_BACKWARD):
                self.losses.append((node.replica, seen[node.replica]))
                seen[node.replica] += 1

    def _limit(self, tasks: int) -> float:
        """Seconds a step of ``tasks`` tasks may take: each may run ``retries + 1`` times,
        one after another at worst, within the trainer's task timeout."""
        t = self.trainer
        if t.timeout is None:
            return self.STEP_LIMIT_S
        return max(self.STEP_LIMIT_S, t.timeout * tasks * (t.retries + 1))

    def run(self, pilot, X, Y, perm, n, batch_size, current):
        """One epoch from ``current`` (per stage: (parameters, state) arrays); returns the
        loss stats in the arena path's order and the final (parameters, state) per stage.

        A step's tasks depend only on each other and on values the driver sends (its
        rows, the parameters): the driver takes each update's result before it submits
        the next step, so the oldest task a lost result can need again is of the same step,
        whose futures the driver still holds (dask recomputes it from its arguments; a
        chain of update futures made the fit hang after a host crash: module docstring)."""
        t = self.trainer
        stats = []
        for lo in range(0, n, batch_size):
            hi = min(lo + batch_size, n)
            rows = micro_batches(lo, hi, self.R, self.M)
            futs, params = [], [param for param, _ in current]  # (the state: update only)
            try:
                for r in range(self.R):
                    a, b = rows[r][0][0], rows[r][-1][1]
                    idx = perm[a:b]
                    futs.append(self.submit(pilot, self.ops[HostOp.REPLICA_STEP], t.step, r, lo,
                                            hi - lo, a, X[idx], Y[idx], params))
                ref = {("leaf", r): f for r, f in enumerate(futs)}
                for k, (a, b) in enumerate(self.tree):
                    ref[("node", k)] = f = self.submit(pilot, self.ops[HostOp.REDUCE], ref[a], ref[b])
                    futs.append(f)
                futs.append(self.submit(pilot, self.ops[HostOp.UPDATE], t.step, current,
                                        *(ref[o] for o in self.root)))
                self.wait(futs, self._limit(len(futs)), f"step {t.step} (epoch rows {lo}..{hi})")
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
            results = [f.result() for f in futs[:self.R]]
            stats.extend(results[r].stats[i] for r, i in self.losses)
            current = futs[-1].result()
            t.step += 1
        return stats, current
