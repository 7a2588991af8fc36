"""scikit-learn's cost per call on the joblib backend "shoal" with no pilot open, vs loky.

Usage::

    python benchmarks/bench_joblib_sklearn.py [--repeat 5] [--n-jobs 2]

Each backend runs in a fresh interpreter (so the first call pays what a script's first
call pays: worker start and imports); in it each scikit-learn call runs ``--repeat``
times: ``cross_val_score`` and ``cross_validate`` (LogisticRegression, iris, 5 folds),
``GridSearchCV`` (a decision tree, 3 depths x 3 folds) and ``RandomForestClassifier(50
trees).fit``, all with ``n_jobs``.  Printed per call: the first run and the median of
the others (seconds), with the machine's load average and the 2-process ceiling (the
speed-up of a pure-Python spin in 2 processes over 1, measured in the same run: what
this machine can give two processes right now).  Results are checked equal to loky's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, sys, time
import joblib
import numpy as np
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, cross_val_score, cross_validate
from sklearn.tree import DecisionTreeClassifier
backend, repeat, n_jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if backend == "shoal":
    import shoal.integrations.joblib  # noqa: F401
X, y = load_iris(return_X_y=True)
calls = {
    "cross_val_score": lambda: list(cross_val_score(LogisticRegression(max_iter=500), X, y, cv=5, n_jobs=n_jobs)),
    "cross_validate": lambda: list(cross_validate(LogisticRegression(max_iter=500), X, y, cv=5, n_jobs=n_jobs)["test_score"]),
    "GridSearchCV": lambda: GridSearchCV(DecisionTreeClassifier(random_state=0), {"max_depth": [1, 2, None]}, cv=3, n_jobs=n_jobs).fit(X, y).best_params_,
    "RandomForest.fit": lambda: float(RandomForestClassifier(50, random_state=0, n_jobs=n_jobs).fit(X, y).score(X, y)),
}
out = {}
with joblib.parallel_config(backend=backend):
    for name, call in calls.items():
        times, result = [], None
        for _ in range(repeat):
            t = time.perf_counter()
            result = call()
            times.append(time.perf_counter() - t)
        out[name] = {"times": times, "result": result}
print(json.dumps(out))
"""


def spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def two_process_ceiling(n: int = 3_000_000) -> float:
    """Speed-up of the same spin in 2 forked processes over 1 (2.0 on 2 idle cores)."""
    t = time.perf_counter()
    spin(n)
    spin(n)
    one = time.perf_counter() - t
    t = time.perf_counter()
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            spin(n)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return one / (time.perf_counter() - t)


def run(backend: str, repeat: int, n_jobs: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("SHOAL_ROOT", ROOT),
                                                   env.get("PYTHONPATH")] if p)
    res = subprocess.run([sys.executable, "-c", _CHILD, backend, str(repeat), str(n_jobs)],
                         capture_output=True, text=True, env=env, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"{backend} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--n-jobs", type=int, default=2)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, 2-process ceiling "
          f"{two_process_ceiling():.2f}x; n_jobs={args.n_jobs}, {args.repeat} runs per call; "
          f"shoal from {os.environ.get('SHOAL_ROOT', ROOT)}", flush=True)
    results = {b: run(b, args.repeat, args.n_jobs) for b in ("loky", "shoal")}
    print("| call | loky first | loky median | shoal first | shoal median | same result |")
    print("|---|---|---|---|---|---|")
    for name, ref in results["loky"].items():
        mine = results["shoal"][name]
        same = mine["result"] == ref["result"]
        lt, st = ref["times"], mine["times"]
        print(f"| {name} | {lt[0]:.3f} | {statistics.median(lt[1:] or lt):.3f} | {st[0]:.3f} | "
              f"{statistics.median(st[1:] or st):.3f} | {same} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}, 2-process ceiling {two_process_ceiling():.2f}x")


if __name__ == "__main__":
    main()
