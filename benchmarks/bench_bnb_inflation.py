"""Work inflation of branch and bound: nodes of a parallel run / nodes of the sequential run.

    python benchmarks/bench_bnb_inflation.py [--workers 2] [--repeat 6] [--graphs C125.9,keller4]

Max clique (examples/search_maxclique.py) on DIMACS graphs: the sequential run
(``coordination="sequential"``, one task) is the reference; each parallel run
(default stack stealing) must find the same clique number, and its
``stats.work_inflation`` is printed with the mean.  Node counts do not depend
on the machine's speed, only on timing (when an incumbent reaches the other
tasks), so the numbers are meaningful on a loaded machine; the load is printed.

Target (branch_and_bound's "Pruning rule": strict pruning against the global
incumbent explores ties with other tasks' incumbents): mean inflation <= 1.1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # before any worker starts: they inherit sys.path

import search_maxclique as mc  # noqa: E402

import shoal  # noqa: E402

DIMACS = ROOT / "examples" / "data" / "dimacs"
TARGET = 1.1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--graphs", default="C125.9,keller4")
    args = ap.parse_args()
    print(f"load (uptime): {os.getloadavg()}", flush=True)
    ok = True
    with shoal.Pilot(args.workers) as pilot:
        for name in args.graphs.split(","):
            g = mc.read_dimacs(DIMACS / f"{name}.clq")
            seq = mc.max_clique(pilot, g, coordination="sequential")
            infl = []
            for _ in range(args.repeat):
                r = mc.max_clique(pilot, g, reference_nodes=seq.stats.nodes)
                if r.value != seq.value:
                    print(f"{name}: WRONG clique number {r.value} != {seq.value}")
                    return 1
                infl.append(r.stats.work_inflation)
            mean = sum(infl) / len(infl)
            ok &= mean <= TARGET
            print(f"max clique {name}: omega {seq.value}, sequential {seq.stats.nodes} nodes; "
                  f"{args.workers} workers: inflation {' '.join(f'{x:.3f}' for x in infl)}; "
                  f"mean {mean:.3f} (target <= {TARGET}: {'ok' if mean <= TARGET else 'MISSED'})",
                  flush=True)
    print(f"load (uptime): {os.getloadavg()}")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
