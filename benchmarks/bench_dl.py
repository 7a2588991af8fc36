"""shoal.workloads.dl: data parallelism, torch DDP and the pipeline bubble, in one run.

    python benchmarks/bench_dl.py [--quick] [--no-torch] [--epochs 2]

1. Data parallelism: synthetic 8192 x 256 float32, MLP 256-1024-1024-10, batch 256,
   SGD.  Samples/s of the last epoch (the first also pays start-up: unpickling the
   program, mapping the arena) for: the in-process serial plan (no pilot, numpy with all
   BLAS threads), 1 replica on a 1-worker pilot (one BLAS thread: a shoal worker is
   pinned to one CPU), 1 replica on a 2-worker pilot (one BLAS thread each, the other
   worker idle), and 2 replicas on the 2-worker pilot, with the shared arena and with
   ``dl.Transport.FUTURES`` (arrays as task results: what a pilot across hosts runs, here
   on one host, so the ratio is the transport's cost).  Target: 2 replicas >= 1.6x
   1 replica.
2. torch: the engine's own cost (a ``dl.TorchModule`` serial plan in this process against a
   hand-written torch loop, both on one thread), then the same model as a
   ``dl.TorchModule`` with 2 replicas on 2 workers against
   torch DistributedDataParallel (gloo, 2 processes, 128 rows each, one torch thread
   each, torch.optim.SGD).  Target: >= 0.8x DDP's samples/s.  Reproducibility: the
   TorchModule run's parameters on 1 and on 2 workers (bitwise?), DDP's on 1 and 2
   processes (bitwise?).
3. Pipeline: MLP 1536-1024-1024-10 cut into two halves of equal work, 8 micro-batches of a
   512-row batch, 1 replica on 2 workers, traced; the bubble is 1 - busy / (stages x span)
   per step, from the trace's forward/backward spans, against the ideal (S-1)/(M+S-1).

Prints ``uptime``'s load before and after (the machine may be shared), the
threadpoolctl report of a worker, a markdown table of rates, and the TARGETS table:
each target ratio, measured in this run, and whether it is met.

``--profile`` instead prints where a data-parallel step's time goes: per task kind the
CPU time in this process against the bare matrix products, and from a trace of 1 and
2 replicas on 2 workers the step = longest task + hop (the driver's turn-around).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import shoal
from shoal.workloads import dl


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def data(n=8192, d=256, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    teacher = rng.standard_normal((d, classes)).astype(np.float32)
    y = (X @ teacher).argmax(axis=1)
    return X, y


def mlp(d=256, h=1024, classes=10):
    model = dl.Sequential([dl.Linear(d, h), dl.ReLU(), dl.Linear(h, h), dl.ReLU(), dl.Linear(h, classes)],
                          seed=0)
    model.set_parameters([p.astype(np.float32) for p in model.parameters()])
    return model


def rate(model, plan, pilot, X, y, epochs, batch=256, transport=None):
    trainer = dl.Trainer(model, optimizer=dl.SGD(lr=0.01, momentum=0.9), plan=plan, pilot=pilot,
                         transport=transport)
    history = trainer.fit(X, y, epochs=epochs, batch_size=batch)
    return history[-1]["samples_per_s"], trainer


def blas_report(pilot):
    def info():
        from threadpoolctl import threadpool_info

        from shoal.workloads.dl.program import limit_blas

        limit_blas(max(1, len(os.sched_getaffinity(0)) // 2))
        return [{k: p.get(k) for k in ("internal_api", "num_threads", "version")}
                for p in threadpool_info()]

    return pilot.submit(info).result()


def torch_module():
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    return dl.TorchModule(net)


DDP = textwrap.dedent("""
    import os, sys, time, numpy as np, torch, torch.distributed as dist
    rank, world, port, out, epochs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8192, 256)).astype(np.float32)
    teacher = rng.standard_normal((256, 10)).astype(np.float32)
    y = (X @ teacher).argmax(axis=1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    per = 256 // world
    for epoch in range(epochs):
        dist.barrier()
        t0 = time.perf_counter()
        for lo in range(0, 8192, 256):
            xb = Xt[lo + rank * per: lo + (rank + 1) * per]
            yb = yt[lo + rank * per: lo + (rank + 1) * per]
            opt.zero_grad()
            lossf(model(xb), yb).backward()
            opt.step()
        dist.barrier()
        seconds = time.perf_counter() - t0
    if rank == 0:
        np.savez(out, seconds=seconds, *[p.detach().numpy() for p in net.parameters()])
    dist.destroy_process_group()
""")


def plain_torch(X, y, epochs):
    """The same model and SGD as a hand-written torch loop in this process, one thread."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                              torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    for _ in range(epochs):
        t0 = time.perf_counter()
        for lo in range(0, len(X), 256):
            opt.zero_grad()
            lossf(net(Xt[lo:lo + 256]), yt[lo:lo + 256]).backward()
            opt.step()
        seconds = time.perf_counter() - t0
    return len(X) / seconds


def ddp(world, epochs):
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "ddp.py")
        with open(script, "w") as f:
            f.write(DDP)
        out = os.path.join(tmp, "out.npz")
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen([sys.executable, script, str(r), str(world), str(port), out, str(epochs)])
                 for r in range(world)]
        for p in procs:
            if p.wait(600) != 0:
                raise RuntimeError("a DDP process failed")
        with np.load(out) as d:
            return 8192 / float(d["seconds"]), [d[f"arr_{i}"] for i in range(len(d.files) - 1)]


def bubble(trace_path, stages, per_step):
    """Median over steps of 1 - busy / (stages x span) of the forward/backward spans.

    A step ends with its ``per_step``-th stage-0 backward (R x M of them; the last one
    also applies the update: the fused update of R <= 2 replicas)."""
    with open(trace_path) as f:
        spans = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ops = sorted((e for e in spans if e["name"].startswith(("dl.forward", "dl.backward"))),
                 key=lambda e: e["ts"])
    fractions, phase, backs = [], [], 0
    for e in ops:
        phase.append(e)
        if e["name"] == "dl.backward[s0]":
            backs += 1
            if backs == per_step:
                span = max(x["ts"] + x["dur"] for x in phase) - min(x["ts"] for x in phase)
                fractions.append(1 - sum(x["dur"] for x in phase) / (stages * span))
                phase, backs = [], 0
    fractions = fractions[1:] or fractions  # the first step pays start-up
    return float(np.median(fractions))


def step_profile(trace_path, replicas):
    """Where a data-parallel step's time goes, from a trace: per step (median), the wall
    time, the longest forward-backward task, the hop (the next step's first task starts
    this long after the last task of the step ended: result -> driver -> next task), and
    per task kind the median duration."""
    with open(trace_path) as f:
        spans = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("dl.")]
    spans.sort(key=lambda e: e["ts"])
    steps = [spans[i:i + replicas] for i in range(0, len(spans) - replicas + 1, replicas)]
    steps = steps[len(steps) // 4:]  # past start-up
    walls, fbs, hops = [], [], []
    for a, b in zip(steps, steps[1:], strict=False):
        end = max(e["ts"] + e["dur"] for e in a)
        walls.append(min(e["ts"] for e in b) - min(e["ts"] for e in a))
        fbs.append(max(e["dur"] for e in a))
        hops.append(min(e["ts"] for e in b) - end)
    ms = lambda v: f"{np.median(v) / 1000:.2f} ms"  # noqa: E731
    return f"step {ms(walls)} = longest task {ms(fbs)} + hop {ms(hops)} (medians over {len(walls)} steps)"


def math_profile(X, y, replicas):
    """CPU time per task kind of the serial plan in this process on one BLAS thread, and the
    bare matrix products of one forward-backward: the math, without the pilot."""
    from threadpoolctl import threadpool_limits

    from shoal.workloads.dl import program

    times: dict = {}
    real = program.Program.run

    def timed(self, kind, s, args):
        t0 = time.thread_time()
        try:
            return real(self, kind, s, args)
        finally:
            times.setdefault(kind.value, []).append(time.thread_time() - t0)

    program.Program.run = timed
    try:
        with threadpool_limits(1):
            rate(mlp(), dl.Plan(replicas=replicas), None, X[:2048], y[:2048], 1)
            rows = 256 // replicas
            x = X[:rows]
            W1, W2, W3 = (np.ones(s, np.float32) for s in ((256, 1024), (1024, 1024), (1024, 10)))
            t0 = time.thread_time()
            for _ in range(10):
                h1 = x @ W1
                h2 = h1 @ W2
                z = h2 @ W3
                _ = h2.T @ z
                d2 = z @ W3.T
                _ = h1.T @ d2
                d1 = d2 @ W2.T
                _ = x.T @ d1
            bare = (time.thread_time() - t0) / 10
    finally:
        program.Program.run = real
    parts = ", ".join(f"{k} {np.median(v) * 1000:.2f} ms" for k, v in times.items())
    return f"R={replicas}: per task (CPU, in-process): {parts}; bare products of {rows} rows {bare * 1000:.2f} ms"


def pipeline_model():
    """Two halves of equal work: [Linear(1536, 1024), ReLU] | [Linear(1024, 1024), ReLU,
    Linear(1024, 10)].  Per micro-batch of n rows, stage 0 does a forward product and a
    weight-gradient product of n x 1536 x 1024 (it needs no input gradient); stage 1 a
    forward, a weight-gradient and an input-gradient product of n x 1024 x 1024: 3 units each."""
    model = dl.Sequential([dl.Linear(1536, 1024), dl.ReLU(), dl.Linear(1024, 1024), dl.ReLU(),
                           dl.Linear(1024, 10)], seed=0)
    model.set_parameters([p.astype(np.float32) for p in model.parameters()])
    return model


def profile(X, y, epochs):
    print(f"load before: {load()}")
    for R in (1, 2):
        print(math_profile(X, y, R))
    with tempfile.TemporaryDirectory() as tmp:
        for R in (1, 2):
            path = os.path.join(tmp, f"trace{R}.json")
            with shoal.Pilot(workers=2, trace=path) as p2:
                r = rate(mlp(), dl.Plan(replicas=R), p2, X, y, epochs)[0]
            print(f"R={R} on 2 workers: {r:,.0f} samples/s; {step_profile(path, R)}")
    print(f"load after: {load()}")


def best(samples: dict, key, value) -> None:
    samples[key] = max(samples.get(key, 0.0), value)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a quarter of the data")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--epochs", type=int, default=2, help="per run; the last epoch is timed")
    ap.add_argument("--repeat", type=int, default=2, help="rounds; each configuration keeps its best")
    ap.add_argument("--profile", action="store_true",
                    help="only the data-parallel step profile (trace and in-process CPU times)")
    args = ap.parse_args()
    X, y = data()
    if args.quick:
        X, y = X[:2048], y[:2048]
    E = args.epochs
    if args.profile:
        profile(X, y, E)
        return
    rate_of: dict = {}
    loads = [f"start {load()}"]
    print(f"load before: {load()}  (cpus {len(os.sched_getaffinity(0))})", flush=True)
    # 1. data parallelism: every configuration once per round, interleaved, best kept
    with shoal.Pilot(workers=1) as p1, shoal.Pilot(workers=2) as p2:
        report = blas_report(p2)
        for _ in range(args.repeat):
            best(rate_of, "serial", rate(mlp(), dl.Plan(), None, X, y, E)[0])
            best(rate_of, "r1w1", rate(mlp(), dl.Plan(), p1, X, y, E)[0])
            best(rate_of, "r1w2", rate(mlp(), dl.Plan(), p2, X, y, E)[0])
            best(rate_of, "r2w2", rate(mlp(), dl.Plan(replicas=2), p2, X, y, E)[0])
            best(rate_of, "r2w2f", rate(mlp(), dl.Plan(replicas=2), p2, X, y, E,
                                        transport=dl.Transport.FUTURES)[0])
    loads.append(f"after data parallel {load()}")
    print(loads[-1], flush=True)

    # 2. torch
    have_torch = False
    if not args.no_torch:
        try:
            import torch  # noqa: F401

            have_torch = True
        except ImportError:
            print("torch not installed: skipping the DDP comparison")
    if have_torch:
        with shoal.Pilot(workers=2) as p2:
            for _ in range(args.repeat):
                best(rate_of, "torch_plain", plain_torch(X, y, E))
                best(rate_of, "torch_serial", rate(torch_module(), dl.Plan(), None, X, y, E)[0])
                r, ddp_params2 = ddp(2, E)
                best(rate_of, "ddp2", r)
                r, trainer = rate(torch_module(), dl.Plan(replicas=2), p2, X, y, E)
                best(rate_of, "torch_r2w2", r)
            ours2 = trainer.parameters()
        with shoal.Pilot(workers=1) as p1:
            ours1 = rate(torch_module(), dl.Plan(replicas=2), p1, X, y, E)[1].parameters()
        _, ddp_params1 = ddp(1, E)
        bitwise_ours = all(np.array_equal(a, b) for a, b in zip(ours1, ours2, strict=True))
        bitwise_ddp = all(np.array_equal(a, b) for a, b in zip(ddp_params1, ddp_params2, strict=True))
        loads.append(f"after torch {load()}")
        print(loads[-1], flush=True)

    # 3. the pipeline bubble, from a trace
    Xp, yp = data(len(X) // 2, 1536)
    plan = dl.Plan(micro_batches=8, shards=[[0, 1], [2, 3, 4]])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        with shoal.Pilot(workers=2, trace=path) as p2:
            for _ in range(args.repeat):
                best(rate_of, "pipe", rate(pipeline_model(), plan, p2, Xp, yp, 1, batch=512)[0])
        measured = bubble(path, 2, 8)
    ideal = dl.ideal_bubble(2, 8)
    loads.append(f"after pipeline {load()}")
    print(loads[-1], flush=True)

    print("\nthreadpoolctl report of a worker of a 2-worker pilot (after the dl limit):")
    for entry in report:
        print(f"  {entry}")
    serial = rate_of["serial"]
    print(f"\nbest of {args.repeat} rounds, {len(X)} x 256 float32, MLP 256-1024-1024-10, batch 256; "
          f"load (1/5/15 min): {'; '.join(loads)}")
    print("\n| run | samples/s | ratio |\n|---|---:|---:|")
    for key, name in (("serial", "serial plan, in-process numpy (all BLAS threads)"),
                      ("r1w1", "1 replica, 1-worker pilot (1 BLAS thread: pinned to one CPU)"),
                      ("r1w2", "1 replica, 2-worker pilot (1 BLAS thread each)"),
                      ("r2w2", "2 replicas, 2-worker pilot"),
                      ("r2w2f", "2 replicas, 2-worker pilot, Transport.FUTURES (the path across hosts)")):
        print(f"| {name} | {rate_of[key]:,.0f} | {rate_of[key] / serial:.2f}x serial |")
    if have_torch:
        print(f"| plain torch loop, this process, 1 thread | {rate_of['torch_plain']:,.0f} | "
              "1.00x plain |")
        print(f"| dl.TorchModule serial plan, this process, 1 thread | {rate_of['torch_serial']:,.0f} | "
              f"{rate_of['torch_serial'] / rate_of['torch_plain']:.2f}x plain |")
        print(f"| torch DDP, gloo, 2 processes (1 thread each) | {rate_of['ddp2']:,.0f} | 1.00x DDP |")
        print(f"| dl.TorchModule, 2 replicas, 2 workers | {rate_of['torch_r2w2']:,.0f} | "
              f"{rate_of['torch_r2w2'] / rate_of['ddp2']:.2f}x DDP |")
    dp_ratio = rate_of["r2w2"] / rate_of["r1w2"]
    print(f"\nTARGETS (issue 16; ratios of this run; load: {'; '.join(loads)})")
    print("\n| target | measured | met |\n|---|---:|---|")
    print(f"| 2 replicas / 1 replica (2-worker pilot) >= 1.6 | {dp_ratio:.2f} | {dp_ratio >= 1.6} |")
    if have_torch:
        ratio = rate_of["torch_r2w2"] / rate_of["ddp2"]
        print(f"| TorchModule / DDP >= 0.8 | {ratio:.2f} | {ratio >= 0.8} |")
        print(f"| TorchModule bitwise on 1 and 2 workers | {bitwise_ours} | {bitwise_ours} |")
        print(f"| DDP bitwise on 1 and 2 processes | {bitwise_ddp} | (DDP does not promise it) |")
    print(f"| pipeline bubble S=2 M=8 within 0.1 of ideal {ideal:.3f} | {measured:.3f} | "
          f"{abs(measured - ideal) <= 0.1} |")
    print(f"| (not a target) 2 replicas on the pilot / serial in-process, all BLAS threads | "
          f"{rate_of['r2w2'] / serial:.2f} | - |")
    print(f"| (not a target) 1-worker pilot / serial in-process | {rate_of['r1w1'] / serial:.2f} | - |")
    print(f"| (not a target) 2 replicas, Transport.FUTURES / the shared arena | "
          f"{rate_of['r2w2f'] / rate_of['r2w2']:.2f} | - |")
    print(f"\n(pipeline run: {rate_of['pipe']:,.0f} samples/s, 1536 features, batch 512)")


if __name__ == "__main__":
    main()
