"""Run a ledger stream with a checkpoint; print each committed batch; dump the result at the end.

    python txs_ckpt_script.py CHECKPOINT_DIR RESULT_FILE [SCHEDULER]

SCHEDULER ``hosts`` is "adaptive" with ``across_hosts=True`` (hosts.py's runner).

The test SIGKILLs this process between (or inside) batches and runs it again.
"""

from __future__ import annotations

import pickle
import sys

import shoal
from shoal.workloads import txstream as ts
from shoal.workloads.txstream.apps import sl

N, KEYS, PUNCT = 1500, 64, 100


def main():
    ckpt, out = sys.argv[1], sys.argv[2]
    sched = sys.argv[3] if len(sys.argv) > 3 else "adaptive"
    across = sched == "hosts"
    sched = "adaptive" if across else sched
    evs = sl.events(N, KEYS, theta=0.8, abort=0.2, complexity=100, seed=7)
    store = ts.Store(sl.tables(KEYS))

    def tick(stats):
        print(f"batch {stats.batch}", flush=True)

    with shoal.Pilot(2) as pilot:
        rep = ts.Engine(store, pilot=pilot, scheduler=sched, punctuation=PUNCT, checkpoint=ckpt,
                        on_batch=tick, across_hosts=across).run(iter(evs))
    with open(out, "wb") as f:
        pickle.dump({"snap": store.snapshot(), "aborted": rep.aborted,
                     "outputs": dict(rep.outputs), "resumed_events": rep.events}, f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
