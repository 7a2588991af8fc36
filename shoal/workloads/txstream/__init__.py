"""Transactional stream processing on a pilot: MorphStream's task precedence graph.

::

    from shoal.workloads import txstream as ts
    store = ts.Store({"accounts": np.full(N, 10_000, np.int64)})
    report = ts.Engine(store, pilot=pilot, scheduler="adaptive", punctuation=10_240).run(events)

See docs/txstream.md.  Modules: store (shared tables), txn (events, recorder,
semantics), tpg (the graph of a batch), policy (the three decisions and the
adaptive choice), tpgrun (running a TPG on a worker), locking (2pl and
partitioned baselines), serial (the oracle), area (shared batch state and
partition claims), engine (the driver), hosts (the runner for pilots whose
workers are on other hosts: key groups in waves), checkpoint (durability),
source (event files), apps (SL, GS, TP, OB).
"""

from .engine import BatchStats, Engine, Report, Scheduler
from .policy import TPG, AbortHandling, Exploration, Granularity
from .source import read_events, write_events
from .store import Store
from .txn import Event, OnError, Txn, TxnError, spin

__all__ = ["Store", "Engine", "Event", "Report", "BatchStats", "Scheduler", "TPG", "Granularity",
           "Exploration", "AbortHandling", "OnError", "Txn", "TxnError", "read_events",
           "write_events", "spin"]
