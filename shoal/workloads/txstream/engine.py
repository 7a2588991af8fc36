"""The driver of a transactional stream: batches, schedulers, results, stats, checkpoints.

Data flow of one punctuation batch::

    source --(pull <= punctuation events, stamp arrival)--> batch
    batch  --(one pickle into Area.inbox)--> one task per worker (scheduler's task)
    tasks  --(record + plan + claim partitions + run; op_state/op_val/txn_abort)-->
    driver --(numpy over the shared arrays: committed, install last versions, outputs)-->
    Report + BatchStats (on_batch callback) + Checkpoint.commit

The driver's per-batch work is O(bytes) framing and vectorised numpy, never a
Python loop over operations; the operations, and the planning, run on the
workers.  A batch commits as a whole at its punctuation (MorphStream's model):
an event's latency is from the moment the driver pulled it to that commit.

``scheduler``: ``"serial"`` (the oracle: in this process, no pilot needed),
``"2pl"``, ``"partitioned"``, ``"adaptive"`` (TPG, decisions chosen per batch)
or a ``TPG(granularity, exploration, abort)`` (fixed decisions).

On a pilot whose workers are on other hosts (``across_hosts``: found when the
engine is built, or asked) the TPG runs through ``hosts.HostRunner`` instead:
no shared memory, key groups exchanged in waves through this driver.
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from itertools import islice

import numpy as np

import shoal

from .area import Area, Cancelled, ClaimDir, Job, owned
from .checkpoint import Checkpoint
from .hosts import HostRunner
from .locking import locking_task
from .policy import TPG, AbortHandling, Granularity
from .result import BatchResult, Outputs, install, settle
from .serial import run_serial
from .store import Store
from .tpgrun import tpg_task
from .txn import Event, OnError, TxnError, dumps_events, unpicklable


class Scheduler(enum.Enum):
    SERIAL = "serial"
    TWO_PL = "2pl"
    PARTITIONED = "partitioned"
    ADAPTIVE = "adaptive"


@dataclass
class BatchStats:
    """One punctuation batch, as a dashboard reads it (``Engine(on_batch=...)``, ``report.batches``)."""

    batch: int
    first_seq: int
    events: int
    committed: int
    aborted: int
    errors: int
    seconds: float          # from the first event pulled to the batch's commit
    events_per_s: float
    latency_p50: float      # seconds, arrival -> commit, over the batch's events
    latency_p99: float
    scheduler: str
    decisions: str          # what the TPG chose ("op/nonstructured/eager"), or the scheduler
    redo_from: int | None   # lazy abort: first sequence number re-run eagerly
    wall: float             # time.time() at commit
    waves: int = 0          # across hosts: exchanges the batch took (hosts.py); 0 on one host
    hosts: list = field(default_factory=list)  # across hosts: where its key groups ran

    def as_dict(self) -> dict:
        return asdict(self)


class _Latency:
    """A log-bucket histogram (1% wide buckets, 1 us .. 10^4 s): constant memory for any stream."""

    EDGES = np.logspace(-6, 4, 2301)

    def __init__(self):
        self.counts = np.zeros(len(self.EDGES) + 1, np.int64)

    def add(self, lat: np.ndarray) -> None:
        np.add.at(self.counts, np.searchsorted(self.EDGES, lat), 1)

    def quantile(self, q: float) -> float:
        total = self.counts.sum()
        if total == 0:
            return float("nan")
        i = int(np.searchsorted(np.cumsum(self.counts), q * total))
        return float(self.EDGES[min(i, len(self.EDGES) - 1)])


@dataclass
class Report:
    """What ``Engine.run`` returns."""

    aborted: set = field(default_factory=set)        # sequence numbers
    outputs: Outputs = field(default_factory=Outputs)  # seq -> tuple of written values | None
    errors: dict = field(default_factory=dict)       # seq -> message (on_error="abort")
    events: int = 0                                  # events run by this call (not resumed ones)
    seconds: float = 0.0
    batches: list = field(default_factory=list)      # BatchStats
    _lat: _Latency = field(default_factory=_Latency, repr=False)

    @property
    def throughput(self) -> float:
        """Events per second over this call."""
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def latency(self) -> dict:
        """``{"p50": s, "p99": s}`` per event, arrival to commit (1%-wide buckets)."""
        return {"p50": self._lat.quantile(0.50), "p99": self._lat.quantile(0.99)}

    def _add(self, seq0, txn_start, vals, committed, errors, keep) -> None:
        if keep:
            self.outputs.add(seq0, txn_start, vals, committed)
        self.aborted.update((np.flatnonzero(~committed) + seq0).tolist())
        self.errors.update({seq0 + t: m for t, m in errors.items()})


class _PilotRunner:
    """The schedulers that run on a pilot: one task per worker per batch (phase)."""

    def __init__(self, engine: Engine):
        self.e = engine
        self.pilot = engine.pilot
        self.area = Area(engine.store.size)
        self.claims = ClaimDir()
        self.claim_dir = self.claims.path
        self.run_id = uuid.uuid4().hex
        self.epoch = 0
        self.expected_abort: float | None = None
        self.chain_hint = False  # the last batch's graph would have allowed chain granularity

    def _planning(self, n: int) -> dict:
        """Split planning (split.py) unless this batch may run chains (they need the
        replicated plan): a fixed chain TPG, or adaptive after a batch whose shape chose them."""
        sched = self.e.scheduler
        if isinstance(sched, TPG):
            chains = sched.granularity is Granularity.CHAIN
        else:
            chains = sched is Scheduler.ADAPTIVE and self.chain_hint
        return {"mode": "replicated" if chains else "split", "n": n}

    def close(self) -> None:
        self.area.close()
        self.claims.close()

    def _phase(self, job: Job, fn) -> list:
        self.epoch += 1
        job.epoch = self.epoch
        nparts = job.nparts
        futs = [self.pilot.submit(fn, job, i) for i in range(nparts)]
        # the first failure (a worker lost, a stall) cancels the batch at once: the other
        # tasks may be waiting on a partition the failed one held
        cf.wait(futs, return_when=cf.FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futs):
            self.area.view("ctl")[0] = 1
        results, first = [], None
        for f in futs:
            try:
                results.append(f.result())
            except Cancelled:
                pass
            except BaseException as exc:
                if first is None:
                    first = exc
                    self.area.view("ctl")[0] = 1
        for p in range(nparts):
            try:
                os.unlink(os.path.join(self.claim_dir, f"{job.epoch}.{p}"))
            except FileNotFoundError:
                pass
        if first is not None:
            raise first
        return results

    def run_batch(self, batch: list, seq0: int, batch_no: int) -> BatchResult:
        e, area = self.e, self.area
        n, w = len(batch), self.pilot.workers
        try:
            blobs = [dumps_events([batch[t] for t in owned(p, n, w)], columns=True)
                     for p in range(w)]  # per partition
        except Exception as exc:
            raise unpicklable(batch, seq0, exc) from exc
        slices, off = [], 0
        for b in blobs:
            slices.append((off, len(b)))
            off += len(b)
        area.ensure(ops=4 * n, txns=n + 1, nbytes=off)
        kind = e.scheduler.value if isinstance(e.scheduler, Scheduler) else "tpg"
        fn = tpg_task if kind in ("adaptive", "tpg") else locking_task
        while True:
            for (o, size), b in zip(slices, blobs, strict=True):
                area.inbox.array[o:o + size] = np.frombuffer(b, np.uint8)
            area.reset()
            job = Job(kind, area.state, area.fields, area.inbox, e.store.shared,
                      e.store.layout, w, batch_no, 0, slices, self.claim_dir,
                      self.run_id, tpg=e.scheduler if isinstance(e.scheduler, TPG) else None,
                      expected_abort=self.expected_abort, stall_s=e.stall_timeout,
                      extra=self._planning(n))
            results = self._phase(job, fn)
            need = [r for r in results if "need_ops" in r]
            if not need:
                break
            area.ensure(ops=need[0]["need_ops"], txns=need[0]["need_txns"],
                        reads=need[0].get("need_reads", 0))
        self.chain_hint = any(r.get("chain_hint") for r in results)
        done = [r for r in results if "n_ops" in r]
        n_ops = done[0]["n_ops"]
        errors, bad = {}, {}
        for r in results:
            errors.update(r["errors"])
            bad.update(r["bad"])
        decisions = done[0]["decisions"]
        txn_abort = area.view("txn_abort")[:n]
        redo_from = None
        if kind != "2pl" and kind != "partitioned" and decisions.endswith("lazy") and txn_abort.any():
            redo_from = int(np.flatnonzero(txn_abort)[0])
            first_op = int(area.view("meta_start")[redo_from])
            area.view("op_state")[first_op:n_ops] = 0
            txn_abort[redo_from:] = 0
            area.view("ctl")[0] = 0
            job.extra = dict(job.extra, redo=True)
            job.start_txn = redo_from
            errors = {t: m for t, m in errors.items() if t < redo_from}
            for r in self._phase(job, fn):
                errors.update(r["errors"])
        txn_start = area.view("meta_start")[:n + 1].copy()
        vals = area.view("op_val")[:n_ops].copy()
        committed, cm = settle(txn_start, area.view("op_state")[:n_ops], txn_abort, bad, errors)
        if kind not in ("2pl", "partitioned") and not (errors and e.on_error is OnError.STOP):
            install(e.store.flat, area.view("meta_gid")[:n_ops], vals, cm)
        self.expected_abort = float((~committed).mean()) if n else 0.0
        return BatchResult(txn_start, vals, committed, errors, decisions, redo_from)


class _SerialRunner:
    def __init__(self, engine: Engine):
        self.e = engine

    def run_batch(self, batch, seq0, batch_no) -> BatchResult:
        return run_serial(self.e.store.flat, self.e.store.layout, batch, seq0, self.e.on_error)

    def close(self) -> None:
        pass


class Engine:
    """Runs a stream of transactions on ``store`` (see the module docstring)."""

    def __init__(self, store: Store, *, pilot=None, scheduler="adaptive", punctuation: int = 10_240,
                 checkpoint=None, on_error="stop", on_batch=None, keep_outputs: bool = True,
                 stall_timeout: float = 120.0, across_hosts: bool | None = None):
        if not isinstance(store, Store):
            raise TypeError(f"Engine needs a ts.Store, got {type(store).__name__}")
        if isinstance(scheduler, TPG):
            self.scheduler = scheduler
        else:
            try:
                self.scheduler = Scheduler(scheduler)
            except ValueError:
                raise ValueError(f"unknown scheduler {scheduler!r}: one of "
                                 f"{[s.value for s in Scheduler]} or a ts.TPG(...)") from None
        if self.scheduler is not Scheduler.SERIAL and pilot is None:
            raise ValueError(f"scheduler {self.scheduler!s} runs on a pilot: pass "
                             "pilot=shoal.Pilot(...) (only 'serial' runs without one)")
        if isinstance(punctuation, bool) or not isinstance(punctuation, int) or punctuation < 1:
            raise ValueError(f"punctuation must be a positive int (events per batch), got {punctuation!r}")
        if (isinstance(stall_timeout, bool) or not isinstance(stall_timeout, (int, float))
                or not stall_timeout > 0):  # (nan > 0 is False)
            raise ValueError(f"stall_timeout must be a number of seconds > 0, got {stall_timeout!r}")
        if on_batch is not None and not callable(on_batch):
            raise TypeError("on_batch must be callable(BatchStats)")
        self.store = store
        self.pilot = pilot
        self.punctuation = punctuation
        self.on_error = OnError(on_error)
        self.on_batch = on_batch
        self.keep_outputs = keep_outputs
        self.stall_timeout = stall_timeout
        self.across_hosts = self._across_hosts(across_hosts)
        self.checkpoint = Checkpoint(checkpoint, store.fingerprint()) if checkpoint else None
        self.last: BatchStats | None = None  # the latest batch (for a dashboard that polls)

    def _across_hosts(self, asked: bool | None) -> bool:
        """Whether batches run as key groups exchanged in waves (hosts.py): asked, or found
        (some worker of a dask pilot on another host).  Only the TPG runs so."""
        if asked is not None and not isinstance(asked, bool):
            raise TypeError(f"across_hosts must be True, False or None (find out), got {asked!r}")
        if self.scheduler is Scheduler.SERIAL:
            return False
        if asked is None:
            from shoal.patterns.all_pairs import across_hosts

            asked = across_hosts(self.pilot)
        if not asked:
            return False
        sched = self.scheduler
        if sched in (Scheduler.TWO_PL, Scheduler.PARTITIONED):
            raise ValueError(f"scheduler {sched.value!r} locks in one host's shared memory, and "
                             "this pilot's workers are on other hosts: use 'adaptive' there")
        if isinstance(sched, TPG) and (sched.granularity is Granularity.CHAIN
                                       or sched.abort is AbortHandling.LAZY):
            raise ValueError(f"scheduler {sched} across hosts: key groups run operations with "
                             "eager abort (hosts.py); use 'adaptive' or ts.TPG('op', ..., 'eager')")
        return True

    def _name(self) -> str:
        return str(self.scheduler) if isinstance(self.scheduler, TPG) else self.scheduler.value

    def run(self, events) -> Report:
        """Run every event of the iterable (resuming from the checkpoint, if any)."""
        report = Report()
        if self.checkpoint is None:
            return self._run(events, report, 0, 0)
        self.checkpoint.lock()  # one driver per checkpoint, for the whole run
        offset, batch_no = 0, 0
        try:
            loaded = self.checkpoint.load()
            if loaded is not None:
                flat, offset, batch_no, segs = loaded
                self.store.flat[:] = flat
                for seq0, ts_, vals, committed, errors in segs:
                    report._add(seq0, ts_, vals, committed, errors, self.keep_outputs)
            return self._run(events, report, offset, batch_no)
        finally:
            self.checkpoint.unlock()

    def _run(self, events, report: Report, offset: int, batch_no: int) -> Report:
        it = iter(events)
        if offset:
            skipped = sum(1 for _ in islice(it, offset))
            if skipped < offset:
                raise ValueError(f"the checkpoint is at event {offset}, but the stream has only "
                                 f"{skipped} events: not the stream it was written for")
        if self.scheduler is Scheduler.SERIAL:
            runner = _SerialRunner(self)
        else:
            runner = HostRunner(self) if self.across_hosts else _PilotRunner(self)
        in_place = self.scheduler in (Scheduler.SERIAL, Scheduler.TWO_PL, Scheduler.PARTITIONED)
        t0 = time.perf_counter()
        seq = offset
        try:
            while True:
                batch, arrivals = [], []
                pc = time.perf_counter
                for item in islice(it, self.punctuation):
                    if type(item) is not Event:
                        item = _coerce(item, seq + len(batch))
                    batch.append(item)
                    arrivals.append(pc())
                if not batch:
                    break
                # in-place schedulers write the store during the batch: keep its state as of
                # the punctuation, so a stop or a failure (worker lost, stall) never leaves a
                # half-applied batch behind (the TPG installs only after a batch succeeded)
                saved = self.store.flat.copy() if in_place else None
                try:
                    res = runner.run_batch(batch, seq, batch_no)
                except BaseException:
                    if saved is not None:
                        self.store.flat[:] = saved
                    raise
                if res.errors and self.on_error is OnError.STOP:
                    if saved is not None:
                        self.store.flat[:] = saved
                    t = min(res.errors)
                    raise TxnError(seq + t, res.errors[t] + " (the store is as of the last "
                                   "punctuation; on_error='abort' records such errors and goes on)")
                done = time.perf_counter()
                lat = done - np.asarray(arrivals)
                report._lat.add(lat)
                report._add(seq, res.txn_start, res.vals, res.committed, res.errors,
                            self.keep_outputs)
                report.events += len(batch)
                if self.checkpoint is not None:
                    self.checkpoint.commit(batch_no, seq + len(batch), self.store.flat, seq,
                                           res.txn_start, res.vals, res.committed, res.errors)
                n_commit = int(res.committed.sum())
                stats = BatchStats(
                    batch_no, seq, len(batch), n_commit, len(batch) - n_commit, len(res.errors),
                    done - arrivals[0], len(batch) / max(done - arrivals[0], 1e-9),
                    float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), self._name(),
                    res.decisions, None if res.redo_from is None else seq + res.redo_from,
                    time.time(), getattr(runner, "waves", 0), sorted(getattr(runner, "hosts", ())))
                report.batches.append(stats)
                self.last = stats
                # the dashboard's progress page (events/s, aborts, latency per batch); a record
                # holds scalars only (a list field made publish() refuse every batch's record)
                shoal.publish("txstream", {**stats.as_dict(), "hosts": ",".join(stats.hosts)})
                if self.on_batch is not None:
                    self.on_batch(stats)
                seq += len(batch)
                batch_no += 1
        finally:
            runner.close()
            report.seconds = time.perf_counter() - t0
        return report


def _coerce(item, seq: int) -> Event:
    try:
        fn, ev = item
    except (TypeError, ValueError):
        raise TypeError(f"event {seq}: expected ts.Event(fn, ev), got {item!r:.80}") from None
    if not callable(fn):
        raise TypeError(f"event {seq}: its fn {fn!r:.60} is not callable")
    return Event(fn, ev)
