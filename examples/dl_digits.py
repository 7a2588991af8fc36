"""Train an MLP on scikit-learn's digits with a hybrid plan: 2 data-parallel replicas, each a
2-stage pipeline of 4 micro-batches (1F1B), on a pilot; then the same plan in this process.

    python examples/dl_digits.py [--epochs 15] [--workers 2]

Prints the test accuracy, the time of each run and the speed-up, and checks that the
pilot's parameters are bitwise those of the in-process run (the plan fixes the arithmetic).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import shoal
from shoal.workloads import dl


def model():
    return dl.Sequential([dl.Linear(64, 128), dl.ReLU(), dl.Linear(128, 64), dl.Tanh(),
                          dl.Linear(64, 10)], seed=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    X, y = load_digits(return_X_y=True)  # 1797 8x8 images, bundled with scikit-learn
    Xtr, Xte, ytr, yte = train_test_split(X / 16.0, y, test_size=0.25, random_state=0, stratify=y)
    plan = dl.Plan(replicas=2, stages=2, micro_batches=4, schedule="1f1b")

    def train(pilot):
        trainer = dl.Trainer(model(), loss="cross_entropy", optimizer=dl.SGD(lr=0.1, momentum=0.9),
                             plan=plan, pilot=pilot)
        t0 = time.perf_counter()
        trainer.fit(Xtr, ytr, epochs=args.epochs, batch_size=32, shuffle=True, seed=0,
                    callback=lambda r: print(f"  epoch {r['epoch']:2d}  loss {r['loss']:.4f}  "
                                             f"train accuracy {r['accuracy']:.3f}"))
        return trainer, time.perf_counter() - t0

    with shoal.Pilot(workers=args.workers) as pilot:
        print(f"hybrid plan on {pilot.workers} workers: {plan}")
        on_pilot, t_pilot = train(pilot)
        accuracy = on_pilot.evaluate(Xte, yte)
    print("the same plan in this process:")
    here, t_here = train(None)
    same = all(np.array_equal(a, b) for a, b in zip(on_pilot.parameters(), here.parameters(), strict=True))
    print(f"test accuracy {accuracy:.3f}; stages {on_pilot.stage_layers}")
    print(f"pilot {t_pilot:.2f} s, in-process {t_here:.2f} s: speed-up {t_here / t_pilot:.2f}x "
          f"(a model this small is dominated by task overhead; see docs/dl.md)")
    print(f"bitwise equal parameters: {same}")


if __name__ == "__main__":
    main()
