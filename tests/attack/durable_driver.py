"""A driver of one checkpointed workload, for tests/attack/test_durable_files.py.

    python durable_driver.py dl|txstream|search CHECKPOINT

Environment: ``EPOCHS`` (dl), ``VICTIM`` (plant a link to this file at every temporary name
a save of this pid can use, as somebody who can write the checkpoint folder would),
``HOLD`` (after the first epoch or batch print ``holding`` and wait until this file exists).
Prints ``result <json>`` at the end.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import numpy as np

import shoal

PLANTED = "ab" * 8  # the random part of the first temporary name each save picks


def plant(kind: str, ck: str, victim: str) -> None:
    folder = ck if kind == "txstream" else os.path.dirname(ck)
    pid, host = os.getpid(), socket.gethostname()
    if kind == "txstream":
        bases = ["state.npz"] + [f"out-{b:08d}.npz" for b in range(64)]
        names = [f"{b}.tmp" for b in bases]  # the fixed names of the older writer
    else:
        bases = [os.path.basename(ck)]
        names = [f"{bases[0]}.tmp{pid}", f".{bases[0]}.{host}.{pid}.tmp"]  # pid-derived names
    names += [f".{b}.{host}.{pid}.{PLANTED}.tmp" for b in bases]  # this writer's names
    for name in names:
        os.symlink(victim, os.path.join(folder, name))
    import secrets

    real, calls = secrets.token_hex, [0]

    def token_hex(n=None):  # every other name is one the attacker planted a link at
        calls[0] += 1
        return PLANTED if calls[0] % 2 else real(n)

    secrets.token_hex = token_hex


def hold() -> None:
    path = os.environ.get("HOLD")
    if path and not os.path.exists(path):
        print("holding", flush=True)
        while not os.path.exists(path):
            time.sleep(0.02)


def run_dl(ck: str):
    from shoal.workloads import dl

    rng = np.random.default_rng(0)
    X = rng.normal(size=(96, 16))
    y = rng.integers(0, 3, 96)
    model = dl.Sequential([dl.Linear(16, 8), dl.ReLU(), dl.Linear(8, 3)], seed=0)
    trainer = dl.Trainer(model, optimizer=dl.Adam(lr=0.01), plan=dl.Plan())
    trainer.fit(X, y, epochs=int(os.environ.get("EPOCHS", "3")), batch_size=32, checkpoint=ck,
                callback=lambda record: hold())
    return {"epochs": len(trainer.history), "sum": float(sum(p.sum() for p in trainer.parameters()))}


def run_txstream(ck: str):
    from shoal.workloads import txstream as ts
    from shoal.workloads.txstream.apps import sl

    evs = sl.events(600, 64, theta=0.8, abort=0.2, complexity=10, seed=7)
    with ts.Store(sl.tables(64)) as store:
        rep = ts.Engine(store, scheduler="serial", punctuation=100, checkpoint=ck,
                        on_batch=lambda stats: hold()).run(iter(evs))
        return {"events": rep.events, "snap": {k: v.tolist() for k, v in store.snapshot().items()}}


def kids(node):
    return [node + 1, node + 1] if node < 15 else []


def run_search(ck: str):
    from shoal.patterns import backtracking

    with shoal.Pilot(workers=1) as pilot:
        return {"count": backtracking.count(pilot, 0, kids, checkpoint=ck, checkpoint_interval=0.001)}


def main() -> None:
    kind, ck = sys.argv[1], sys.argv[2]
    if os.environ.get("VICTIM"):
        plant(kind, ck, os.environ["VICTIM"])
    result = {"dl": run_dl, "txstream": run_txstream, "search": run_search}[kind](ck)
    print("result", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
