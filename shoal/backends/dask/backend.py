"""The dask.distributed backend: dask moves coarse work between machines, shoal runs it inside.

Two levels::

    driver (this process)                       dask worker process (each host, 1+)
      Pilot.submit ─► DaskBackend.submit           run_task(cfg, fn blob, args, kwargs)
        │ client.submit(run_task, ...) ───dask───►   │ node runtime = a LocalBackend:
        │                                            │ shoal worker processes, rings,
      shoal.Future ◄── settle ◄── gather ◄───dask──  │ work stealing, shoal.spawn
                                                     ▼ (see node.py)

* ``submit`` sends one dask task that runs the function on the node runtime of
  whichever dask worker dask picks.  ``shoal.spawn`` inside it pushes to that
  node's deques; idle shoal workers of the node steal; when a whole machine
  runs dry, the driver's balancer lends it spawned tasks of the busiest one
  (``balance``).  Cells, per-node arrays and channels that span the
  machines are in ``cells``.
* Futures among the arguments (also inside lists, tuples, dicts) become the
  dask futures behind them, so dask resolves them **on the workers**: a result
  that only feeds another task never crosses the driver (the local backend
  resolves them in the driver).
* ``map`` reuses ``shoal.runtime.mapping.map_iter`` one level up: a batch is
  one dask task, spread over the node's shoal workers by the node's own map;
  the node reports scaled durations so a batch lasts ~``DASK_TARGET_S``
  (dask costs 1-2 ms a task; shoal's ring costs microseconds).
* Results: dask's done callback (its callback thread) queues the finished
  dask future; one coroutine on the client's event loop gathers the queued
  ones in a batch and settles the shoal futures.  Errors keep their type and
  the shoal worker's traceback (``__cause__`` = ``RemoteTraceback``).
* Failure: ``retries`` is dask's (any exception, incl. ``WorkerLost`` and
  ``TaskTimeout`` from the node); a dask worker that dies mid-task is re-run
  by dask, and after ``distributed.scheduler.allowed-failures`` deaths the
  future gets ``WorkerLost`` (naming the last dask worker and its host).  A dask
  worker not heard from for ``silent_after_s`` (default 30 s; a cut-off host keeps
  its connections open and silent) is removed through the scheduler, so its tasks
  re-run elsewhere as for a death (liveness.py).  A scheduler that vanishes cancels the client's
  futures: they get ``BackendUnavailable``; an address that refuses
  connections raises it from the constructor within ``connect_timeout``.
* Cancel (the stdlib's promise: True only if the call never runs; cancel.py):
  ``cancel()`` asks the scheduler where the task is (one on no dask worker is
  cancelled there at once) and then only the dask worker holding it, which takes
  it back (from its node runtime's queue, or a tombstone for one it has not
  started) or reports it started; no answer within ``CLAIM_TIMEOUT_S``: False
  (claims.py, with the alternatives rejected).  ``running()`` asks nobody: the
  nodes push STARTED events.  ``shutdown(cancel_futures=True)`` and
  ``pilot.cancel_many`` claim all their tasks in one round;
  ``pilot.cancel(fut, force=True)`` has the holder's node runtime kill and replace
  the shoal worker running the task.  Map batches (``_Coarse``) skip the round:
  only ``map_iter`` cancels them, and nobody reads its answer.
* Close: ``close`` unregisters the pilot's ``NodePlugin``; its teardown stops the
  node runtime in each dask worker for good (a task dask hands out afterwards
  returns ``claims.CANCELLED`` and starts no fresh runtime).
* ``resources={"GPU": 1}`` (``Pilot.options``) goes to ``client.submit``: dask
  runs the task only where a worker declared that much.  A request no
  connected worker meets is refused at submit (``ValueError``); one whose
  capable worker left later fails after ``resource_wait_s``
  (``watch_resources``, on the balancer's thread) instead of waiting for good.
  While such a task runs on a node, the node lends none of its spawned work.
* ``provider="slurm"|"pbs"``: dask-jobqueue submits the batch jobs
  (``provider``); on SLURM a ``JobWatch`` (``jobs``) reports queue
  state, replaces jobs that end, and fails the pending tasks with SLURM's
  reason when a job can never start (docs/hpc.md); with ``jobs=(low, high)`` a
  ``JobScaler`` (``scaling``) submits jobs while tasks wait and gives idle ones back.

Invariants: every shoal Future this backend returned is settled exactly once
(``_pending`` holds it until then; ``close`` settles leftovers with
``PilotClosed``); the node runtimes of a pilot live exactly as long as its
``NodePlugin`` registration (plus the dask worker's lifetime).

Rejected: settling each future with a blocking ``result()`` in dask's single
callback thread (one network round trip per task, serialised); a home-made
TCP transport between nodes (dask already has scheduler, comms, TLS and
dask-jobqueue); running user tasks in dask's thread pool (no stealing, no
``shoal.spawn``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import enum
import io
import itertools
import socket
import threading
import time
import uuid
import weakref

from ..._errors import (
    BackendUnavailable,
    PilotClosed,
    SerializationError,
)
from ...runtime import graph, wire
from ...runtime.api import check_options, check_resources, settle
from ...runtime.future import Future
from ...runtime.mapping import map_iter
from .balance import Balancer
from .cancel import CancelPaths, _force_cancelled
from .cells import CellHub
from .claims import CANCELLED
from .elastic import parse_jobs
from .errors import gone, unpicklable, unwrap
from .job_nodes import JobStep, NodesJob, NodesJobWatch
from .jobs import JobPolicy, JobWatch
from .liveness import DEFAULT_SILENT_AFTER_S, LivenessWatch
from .node import (
    NodeConfig,
    NodePlugin,
    cpu_slices,
    probe,
    run_batch,
    run_task,
)
from .provider import Provider, elastic_bounds, make_cluster
from .scaling import JobScaler

_GONE = frozenset(("scheduler-connection-lost", "scheduler-restart"))
# dask re-runs a failed task as soon as its scheduler hears of the failure (client.submit's
# retries=): it has no delay between attempts, and holding a worker slot asleep is no delay
_NO_RETRY_DELAY = ("retry_delay={!r}: on the dask backend retries are dask's own, which re-run a "
                   "failed task at once; drop retry_delay=, or retry with a delay in the driver "
                   "(shoal.ensemble's Task(retries=, retry_delay=) does, on dask too)")
RESOURCE_CHECK_S = 2.0  # a resources= request found satisfiable is not re-checked for this long


class Owned(enum.Enum):
    """What the backend created, and so closes: nothing, the client, or client and cluster."""

    NOTHING = "nothing"
    CLIENT = "client"
    CLUSTER = "cluster"


class _Coarse:
    """``map_iter``'s view of the cluster: ``n`` node workers, and a ``submit`` that turns
    each batch into one dask task for ``run_batch`` (the per-batch runner is replaced)."""

    def __init__(self, backend: DaskBackend, fn, star: bool, resources: dict | None = None):
        self.backend = backend
        self.n = backend.n
        self.blob = backend._blob(fn)
        self.name = f"map-{_name(fn)}"
        self.star = star
        self.resources = resources

    def submit(self, _runner, args: tuple, kwargs: dict) -> Future:
        (batch,) = args
        be = self.backend
        return be._send(run_batch, (be.cfg, self.blob, self.star, batch, bool(self.resources)),
                        self.name, 0, self.resources, claim=False)


class DaskBackend(CancelPaths):
    """Tasks on a dask.distributed cluster, each dask worker running a node-local shoal runtime."""

    kind = "dask"

    def __init__(self, workers: int | None = None, *, address: str | None = None, client=None,
                 cluster=None, provider: str | Provider | None = None, seed: int = 0,
                 connect_timeout: float = 10.0, idle_timeout: float = 600.0,
                 jobs: int | tuple[int, int] | str = 1,
                 resource_wait_s: float = 60.0, allocation: bool = False,
                 silent_after_s: float | None = DEFAULT_SILENT_AFTER_S, **provider_options):
        given = [k for k, v in (("address", address), ("client", client), ("cluster", cluster),
                                ("provider", provider), ("allocation", allocation or None))
                 if v is not None]
        if len(given) != 1:
            raise ValueError("backend='dask' needs exactly one of address='tcp://host:8786', "
                             "client=<distributed.Client>, cluster=<dask cluster>, "
                             "provider='slurm'|'pbs', allocation=True (the nodes of the SLURM "
                             f"job this runs in); got {given or 'none'}")
        if provider_options and provider is None and not allocation:
            raise TypeError(f"unexpected options for backend='dask': {sorted(provider_options)}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                    or workers < 1):
            raise ValueError(f"workers must be an int >= 1 or None, got workers={workers!r}")
        LivenessWatch(None, silent_after_s)  # a bad value fails before anything connects
        from distributed import Client

        self.token = uuid.uuid4().hex[:12]
        self.cluster = cluster
        self.owned = Owned.CLIENT
        self.jobs: JobWatch | None = None  # the batch jobs of provider=, watched
        self.scaler: JobScaler | None = None  # jobs=(low, high): grows and shrinks them
        self.broken: str | None = None  # why the provider's jobs can never run
        wait = True
        bounds = None  # jobs=(low, high) of an elastic provider pilot
        spans_nodes = allocation or (provider is not None and (
            "nodes" in provider_options or "cores_per_node" in provider_options))
        if spans_nodes:  # one job's nodes, one worker step over them (job_nodes.py)
            self.cluster = _nodes_cluster(allocation, provider, jobs, provider_options)
            self.owned = Owned.CLUSTER
            address = self.cluster.scheduler_address
            wait = allocation  # inside the job every node's worker is up; a NodesJob queues
            provider = None
        elif provider is not None:
            try:
                provider = Provider(provider)
            except ValueError:
                raise ValueError(f"unknown provider={provider!r}; choose one of "
                                 f"{', '.join(repr(p.value) for p in Provider)}") from None
            warn_s = provider_options.pop("queue_warn_s", 10.0)  # pending this long: a warning
            bounds = elastic_bounds(jobs, provider, provider_options)
            jobs = bounds.low if bounds is not None else parse_jobs(jobs)[0]
            self.cluster = make_cluster(provider, jobs=jobs, elastic=bounds is not None,
                                        **provider_options)
            self.owned = Owned.CLUSTER
            wait = False  # batch jobs start when the queue says so; tasks wait for them
        try:
            if client is not None:
                self.client, self.owned = client, Owned.NOTHING
            elif self.cluster is not None and address is None:
                self.client = Client(self.cluster, set_as_default=False, timeout=connect_timeout)
            else:
                try:
                    _probe_tcp(address, connect_timeout)
                    self.client = Client(address, set_as_default=False, timeout=connect_timeout)
                except (OSError, TimeoutError) as exc:
                    raise BackendUnavailable(
                        f"cannot reach the dask scheduler at {address!r} within {connect_timeout} s "
                        f"({exc}); is `dask scheduler` running there?") from None
            self._size(workers, seed, idle_timeout, connect_timeout if wait else None)
            if spans_nodes and not wait:  # the job is queued: what its nodes will bring
                self.n = self.cluster.nodes * self.cluster.cores
                self.jobs = NodesJobWatch(self.cluster, self.client, self._provider_failed,
                                          policy=JobPolicy(warn_after_s=self.cluster.warn_s))
            elif not wait:  # no worker to probe yet: what the jobs will bring (at most)
                most = bounds.high if bounds is not None else jobs
                self.n = max(1, most * int(provider_options.get("cores", 1)))
            if provider is Provider.SLURM:
                self.jobs = JobWatch(self.cluster, self.client, self._provider_failed,
                                     policy=JobPolicy(warn_after_s=warn_s))
            if bounds is not None:
                self.scaler = JobScaler(self.cluster, self.client, self.jobs, bounds)
        except BaseException:
            self._release()
            raise
        self.hub = CellHub(self.client, self.token)
        self.hub.subscribe()  # before any task: node events (cells, lent results) come on it
        self.hub.on_started = self._on_started
        self.hub.on_ended = self._on_ended
        self.shared = self.hub  # SharedFactory: cluster cells, per-node arrays, channels
        self.liveness = LivenessWatch(self.client, silent_after_s,
                                      busy=lambda: bool(getattr(self, "_pending", None)))
        self.balancer = Balancer(self)
        self.liveness.start()
        self.topology = None  # each host has its own; see stats()
        self.closing = False
        self.closed = False
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[Future, object]] = {}
        self._satisfiable: dict[tuple, float] = {}  # resources= -> checked until (monotonic)
        self._needs: dict[str, dict] = {}  # key of a pending task -> its resources=
        self._unmet: dict[str, float] = {}  # key -> since when no connected worker offers them
        self._watched = 0.0
        self.resource_wait_s = resource_wait_s
        self._dask_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Future -> dask's
        self._done: list[str] = []
        self._flushing = False
        self._ids = itertools.count(1)
        self._blobs: dict[int, tuple[bytes, object]] = {}
        self._cancel_cb = self._cancel
        self._probe_cb = self._probe
        self._claimed: set[str] = set()  # keys a claim round took back: they never run
        self._claiming: dict[str, int] = {}  # keys in a claim round now -> how many rounds
        self._rounds = itertools.count(1)
        self._withheld: dict[str, tuple] = {}  # outcomes _flush got during a key's claim round
        self._batches: set[str] = set()  # keys of pending map batches (run_batch)
        self.counters = {"submitted": 0, "completed": 0, "failed": 0, "cancelled": 0}

    def _size(self, workers, seed, idle_timeout, wait_s) -> None:
        """Probe the dask workers, size each host's node runtime, register the plugin."""
        if wait_s is not None:
            try:
                self.client.wait_for_workers(1, timeout=wait_s)
            except (OSError, TimeoutError) as exc:
                raise BackendUnavailable(f"the dask cluster at {self.client.scheduler.address} has "
                                         f"no workers after {wait_s} s ({exc})") from None
        probes = self.client.run(probe, on_error="ignore") if wait_s is not None else {}
        slices = cpu_slices(probes)
        self.cfg = NodeConfig(self.token, workers, seed, idle_timeout)
        self.n = max(1, sum(workers or len(s) for s in slices.values()))
        self.nodes_seen = max(1, len(slices))
        self.client.register_plugin(NodePlugin(self.token, slices), name=self._plugin_name)

    @property
    def nodes(self) -> int:
        """Dask workers (each runs one node runtime) connected now."""
        try:
            return max(1, len(self.client.scheduler_info().get("workers", {})))
        except Exception:  # pragma: no cover - the cluster is going away
            return self.nodes_seen

    @property
    def _plugin_name(self) -> str:
        return f"shoal-{self.token}"

    # -- submitting --------------------------------------------------------------------

    def submit(self, fn, args: tuple, kwargs: dict, *, retries: int = 0,
               timeout: float | None = None, resources=None, retry_delay=None, priority: int = 0) -> Future:
        if (type(retries) is not int or retries or timeout is not None or resources is not None
                or retry_delay is not None or priority):
            check_options(retries, timeout, None, retry_delay, priority)
            if resources is not None:
                resources = self._resources(resources)
            if retry_delay is not None and retries:
                raise ValueError(_NO_RETRY_DELAY.format(retry_delay))
        if not callable(fn):
            raise TypeError(f"submit() needs a callable, got {type(fn).__name__} {fn!r}")
        for a in (*args, *kwargs.values()):
            if isinstance(a, io.IOBase) and not isinstance(a, (io.BytesIO, io.StringIO)):
                return _failed(SerializationError(  # dask's cloudpickle would send a StringIO
                    f"an open file ({type(a).__name__} {getattr(a, 'name', None)!r}) cannot be "
                    "sent to a worker; pass the path (and open it in the task) or the contents"))
        try:
            blob = self._blob(fn)
            deps = (bool(args) and graph.any_future(args)) or (bool(kwargs) and graph.any_future(kwargs.values()))
            if deps:
                args, kwargs = self._to_dask(args), self._to_dask(kwargs)
        except _ForeignFuture as exc:
            raise ValueError(str(exc)) from None
        except Exception as exc:
            return _failed(SerializationError(f"cannot pickle {_name(fn)}: {exc}"))
        return self._send(run_task, (self.cfg, blob, args, kwargs, timeout, deps, bool(resources)),
                          _name(fn), retries, resources, priority=priority)

    def map(self, fn, iterables, *, ordered: bool = True, chunksize: int | None = None,
            timeout: float | None = None, window_bytes: int | None = None, retries: int = 0,
            task_timeout: float | None = None, resources=None):
        """``Pilot.map``: batches of items become dask tasks, each spread over a node.

        With ``retries`` or ``task_timeout`` each batch is one shoal task (``submit``),
        so the options apply per batch as on the local backend."""
        if not callable(fn):
            raise TypeError(f"map() needs a callable, got {type(fn).__name__} {fn!r}")
        if retries or task_timeout is not None:
            def submit(runner, args, kwargs):
                return self.submit(runner, args, kwargs, retries=retries, timeout=task_timeout,
                                   resources=resources)

            return map_iter(self, fn, iterables, ordered=ordered, chunksize=chunksize,
                            timeout=timeout, window_bytes=window_bytes, submit=submit,
                            catch=not retries)
        if resources is not None:
            resources = self._resources(resources)
        return map_iter(_Coarse(self, fn, len(iterables) > 1, resources), fn, iterables,
                        ordered=ordered, chunksize=chunksize, timeout=timeout,
                        window_bytes=window_bytes)

    def _send(self, runner, args: tuple, name: str, retries: int, resources=None,
              claim: bool = True, priority: int = 0) -> Future:
        if self.closing:
            raise PilotClosed("submit() on a closed pilot; open a new shoal.Pilot")
        if self.broken is not None:
            raise BackendUnavailable(self.broken)
        if self.client.status != "running":
            raise BackendUnavailable(f"the dask client is {self.client.status}: the cluster went "
                                     "away or the client was closed")
        fut = Future()
        fut.task_id = tid = next(self._ids)
        fut._canceller = self._cancel_cb
        if claim:  # cancel() asks the nodes first (claims.py); map batches are map_iter's own
            fut._prober = self._probe_cb
        key = f"{name}-{self.token}-{tid}"
        try:
            dfut = self.client.submit(runner, *args, key=key, pure=False, retries=retries or None,
                                      resources=resources, priority=priority)
        except Exception as exc:  # arguments dask cannot serialise
            fut.set_exception(unpicklable(name, runner is run_batch, args, exc))
            return fut
        self._dask_of[fut] = dfut
        with self._lock:
            self._pending[key] = (fut, dfut)
            if resources:
                self._needs[key] = resources
            if runner is run_batch:
                self._batches.add(key)
            self.counters["submitted"] += 1
        dfut.add_done_callback(self._on_done)
        self.balancer.kick()
        return fut

    def _dask_future_of(self, fut: Future):
        dfut = self._dask_of.get(fut)
        if dfut is None:
            raise _ForeignFuture("a shoal.Future of another pilot was passed to this dask pilot's "
                                 "task; pass its .result() instead")
        return dfut

    def _to_dask(self, obj):
        """``obj`` with this backend's shoal Futures replaced by their dask futures (the one
        walk of ``shoal.runtime.graph``; dask then finds them at the same places)."""
        return graph.substitute(obj, self._dask_future_of, sets_as_dicts=True)

    def _blob(self, fn) -> bytes:
        entry = self._blobs.get(id(fn))
        if entry is None:
            entry = self._blobs[id(fn)] = (wire.dump_function(fn), fn)  # fn kept: id stays unique
        return entry[0]

    def _cancel(self, fut: Future) -> None:
        dfut = self._dask_of.get(fut)
        with self._lock:
            self.counters["cancelled"] += 1
            if dfut is not None:
                self._pending.pop(dfut.key, None)  # close() must not wait for it
                self._batches.discard(dfut.key)
                if dfut.key in self._claimed:  # the scheduler cancelled it (or the node will)
                    self._claimed.discard(dfut.key)
                    dfut = None
        if dfut is not None and self.client.status == "running":
            self.client.loop.add_callback(self._cancel_async, dfut)

    async def _cancel_async(self, dfut) -> None:
        try:
            await self.client.cancel([dfut], asynchronous=True)
        except Exception:  # pragma: no cover - the cluster went away: nothing left to cancel
            pass

    # -- resources ---------------------------------------------------------------------

    def _resources(self, resources) -> dict:
        """``resources=`` checked: a plain dict, refused at once (ValueError) when dask
        workers are connected and none of them offers that much (dask would keep the task
        waiting for a worker that never comes).  With no worker connected yet (a provider
        pilot whose jobs have not started) the task waits, as any task does."""
        resources = check_resources(resources)
        key = tuple(sorted(resources.items()))
        now = time.monotonic()
        if self._satisfiable.get(key, 0.0) > now:
            return resources
        offered = self._offered()
        if offered and not any(all(have.get(k, 0) >= v for k, v in resources.items())
                               for have in offered.values()):
            listing = "; ".join(f"{addr}: {have or 'none'}" for addr, have in sorted(offered.items()))
            raise ValueError(f"resources={resources}: no dask worker of this cluster offers that "
                             f"much (start one with `dask worker --resources "
                             f"\"{','.join(f'{k}={v}' for k, v in resources.items())}\"`); "
                             f"workers offer: {listing}")
        if offered:
            self._satisfiable[key] = now + RESOURCE_CHECK_S
        return resources

    def watch_resources(self) -> None:
        """The balancer's thread, about once a second while tasks are out: a task whose
        ``resources=`` no connected dask worker has offered for ``resource_wait_s`` (its
        capable worker left after the submit) fails with ``BackendUnavailable`` instead
        of waiting in dask's ``no-worker`` state for good.  With no worker connected at
        all (a provider's jobs starting or replaced) nothing is failed."""
        now = time.monotonic()
        if now - self._watched < 1.0:
            return
        self._watched = now
        with self._lock:
            for key in [k for k in self._needs if k not in self._pending]:
                del self._needs[key]
                self._unmet.pop(key, None)
            needs = dict(self._needs)
        if not needs:
            return
        offered = self._offered()
        if not offered:
            return
        for key, res in needs.items():
            if any(all(have.get(k, 0) >= v for k, v in res.items()) for have in offered.values()):
                self._unmet.pop(key, None)
                continue
            self._satisfiable.pop(tuple(sorted(res.items())), None)  # new submits check afresh
            since = self._unmet.setdefault(key, now)
            if now - since < self.resource_wait_s:
                continue
            with self._lock:
                entry = self._pending.pop(key, None)
                self._needs.pop(key, None)
                self._unmet.pop(key, None)
                if entry is not None:
                    self.counters["failed"] += 1
            if entry is None:
                continue
            fut, dfut = entry
            listing = "; ".join(f"{a}: {h or 'none'}" for a, h in sorted(offered.items()))
            settle(fut, False, BackendUnavailable(
                f"task {key} needs resources={res}, and no connected dask worker has offered "
                f"that much for {self.resource_wait_s:g} s (the worker that had them left?); "
                f"workers offer: {listing}"))
            if self.client.status == "running":
                self.client.loop.add_callback(self._cancel_async, dfut)

    def _offered(self) -> dict[str, dict] | None:
        """Each connected dask worker's resources (None from the client's event loop,
        where a blocking call would deadlock, or when the scheduler cannot be asked)."""
        try:
            asyncio.get_running_loop()
            return None
        except RuntimeError:
            pass
        try:
            workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        except Exception:  # pragma: no cover - the cluster is going away: submit says so
            return None
        return {addr: dict(info.get("resources") or {}) for addr, info in workers.items()}

    # -- results -----------------------------------------------------------------------

    def _on_done(self, dfut) -> None:
        """dask's callback thread: queue the key; one coroutine on the loop gathers batches."""
        with self._lock:
            self._done.append(dfut.key)
            if self._flushing:
                return
            self._flushing = True
        try:
            self.client.loop.add_callback(self._flush)
        except Exception:  # the loop is gone: settle what we can here
            self._settle_gone()

    async def _flush(self) -> None:
        while True:
            with self._lock:
                keys, self._done = self._done, []
                if not keys:
                    self._flushing = False
                    return
                entries = [self._pending.get(k) for k in keys]
            finished = [e for e in entries if e is not None and e[1].status == "finished"]
            others = [e for e in entries if e is not None and e[1].status != "finished"]
            values = None
            if finished:
                try:
                    values = await self.client.gather([d for _, d in finished], asynchronous=True)
                except BaseException:
                    values = None
            settled = []
            if values is not None:
                settled.extend((f, d, True, v) for (f, d), v in zip(finished, values, strict=True))
            else:
                others = finished + others
            for f, d in others:
                ok, value = await self._outcome(d)
                settled.append((f, d, ok, value))
            refused = []  # keys a node refused to start (the pilot closed there)
            withheld = []
            with self._lock:
                for f, d, ok, value in settled:
                    key = d.key
                    self._pending.pop(key, None)
                    if self._needs:
                        self._needs.pop(key, None)
                    batch = key in self._batches
                    self._batches.discard(key)
                    refusal = ok and type(value) is str and value == CANCELLED
                    if refusal or d.status == "cancelled":
                        if key in self._claimed:
                            withheld.append(f)  # taken back by a claim round: it cancels f
                            continue
                        if key in self._claiming:  # the round decides (_unclaim)
                            self._withheld[key] = (f, ok, value, refusal)
                            withheld.append(f)
                            continue
                    self._claimed.discard(key)
                    if refusal:
                        refused.append(f)
                        continue
                    if ok and batch and type(value) is tuple and value[2] is not None:
                        ok = False  # a map item raised: its batch failed (the error rides along)
                    self.counters["completed" if ok else "failed"] += 1
            for f in refused:
                # Nobody cancelled it (its pilot closed on that node; or a claim round
                # gave up after the node had taken it back, docs/guide.md): it never ran.
                if _force_cancelled(f):
                    with self._lock:
                        self.counters["cancelled"] += 1
            for f, _, ok, value in settled:
                if value is not _SKIP and f not in refused and f not in withheld:
                    settle(f, ok, value)

    async def _outcome(self, dfut):
        """(ok, value or exception) of a dask future that did not gather cleanly."""
        status = dfut.status
        try:
            if status == "finished":
                return True, await self.client.gather(dfut, asynchronous=True)
            if status == "error":
                exc = await dfut.exception(asynchronous=True)
                tb = await dfut.traceback(asynchronous=True)
                return False, unwrap(exc, tb, dfut.key)
        except BaseException as exc:  # lost while gathering
            return False, gone(dfut.key, exc)
        if status == "cancelled":
            reason = getattr(dfut._state.exception, "reason", "")
            if reason in _GONE or self.client.status != "running":
                return False, gone(dfut.key, reason)
            return False, cf.CancelledError(f"dask cancelled task {dfut.key} ({reason})")
        return False, _SKIP  # pragma: no cover - a done callback for a pending future

    def _provider_failed(self, message: str) -> None:
        """The job watch's thread: the batch jobs can never run; fail what waits for them."""
        self.broken = message
        with self._lock:
            entries = list(self._pending.values())
            self._pending.clear()
            self.counters["failed"] += len(entries)
        for fut, dfut in entries:
            settle(fut, False, BackendUnavailable(message))
            if self.client.status == "running":
                self.client.loop.add_callback(self._cancel_async, dfut)

    def _settle_gone(self) -> None:
        with self._lock:
            entries = list(self._pending.values())
            self._pending.clear()
            self._done.clear()
            self._flushing = False
        for fut, dfut in entries:
            settle(fut, False, gone(dfut.key, "the client's event loop stopped"))

    # -- introspection and shutdown ----------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Tasks submitted and not settled yet (the balancer runs while there are any)."""
        return len(self._pending)

    def stats(self, timeout: float = 2.0) -> dict:
        """Per node (each dask worker's runtime, its shoal workers) and driver counters."""
        from .node import node_stats

        nodes = {}
        if self.client.status == "running":
            nodes = self.client.run(node_stats, self.token, on_error="return")
        workers = []
        for addr, st in sorted(nodes.items()):
            if isinstance(st, dict):
                host = (st.get("node") or {}).get("host")  # pids mean something only there
                for w in st.get("workers", []):
                    workers.append({**w, "dask_worker": addr, "host": host})
        with self._lock:
            driver = {**self.counters, "outstanding": len(self._pending)}
        driver.update(dask_workers=len(nodes), scheduler=self._scheduler_address(),
                      moved=self.balancer.moved)
        if self.jobs is not None:
            driver.update(jobs=self.jobs.snapshot(), jobs_replaced=self.jobs.replaced)
        if self.scaler is not None:
            driver.update(elastic=self.scaler.snapshot())
        return {"backend": self.kind, "workers": workers, "nodes": nodes, "driver": driver}

    def monitor(self) -> dict:
        """``stats()`` with the dask dashboard's address (the shoal dashboard's sample)."""
        if self.closing:
            return {"backend": self.kind, "workers": [], "closing": True}
        try:
            link = self.client.dashboard_link
        except Exception:  # noqa: BLE001 - no bokeh, no dask dashboard: no link
            link = None
        return {**self.stats(), "dashboard_link": link}

    def _scheduler_address(self) -> str | None:
        try:
            return self.client.scheduler.address
        except Exception:  # pragma: no cover
            return None

    def close(self, cancel_pending: bool = False, wait: bool = True) -> None:
        if self.closed:
            return
        cancel_pending = cancel_pending or not wait  # started tasks stop with their node runtimes
        self.closing = True
        with self._lock:
            futs = [f for f, _ in self._pending.values()]
        if cancel_pending:
            self.cancel_pending()  # the started ones are stopped with their node runtimes
        else:
            cf.wait(futs)
        self.closed = True
        self.balancer.close()
        self.liveness.close()
        self.hub.close()
        try:
            if self.client.status == "running":
                self.client.unregister_worker_plugin(self._plugin_name)  # stops node runtimes
        except Exception:  # a worker already gone: its runtime went with it (lifeline)
            pass
        with self._lock:
            left = list(self._pending.values())
            self._pending.clear()
        for f, _ in left:
            settle(f, False, PilotClosed("the pilot closed before this task finished"))
        self._release()

    def _release(self) -> None:
        scaler = getattr(self, "scaler", None)
        if scaler is not None:
            scaler.stop()  # before the cluster closes: no job is asked for or given back now
        jobs = getattr(self, "jobs", None)
        if jobs is not None:
            jobs.stop()  # before the cluster cancels its jobs: none is replaced now
        client = getattr(self, "client", None)
        if self.owned is not Owned.NOTHING and client is not None:
            try:
                client.close()
            except Exception:  # pragma: no cover
                pass
        if self.owned is Owned.CLUSTER and self.cluster is not None:
            try:
                self.cluster.close()
            except Exception:  # pragma: no cover
                pass
        if jobs is not None:
            jobs.wait_gone()  # squeue lists none of the pilot's jobs when close() returns


_SKIP = object()


def _nodes_cluster(allocation: bool, provider, jobs, options: dict):
    """The job of ``allocation=True`` (this one) or ``provider='slurm', nodes=N`` (a new one)
    and its worker step; the options are ``NodesJob``'s (``scheduler_options={"host": ...}``:
    the address the nodes reach the scheduler at, as dask-jobqueue's)."""
    host = dict(options.pop("scheduler_options", None) or {}).get("host")
    if allocation:
        if options:
            raise TypeError(f"allocation=True takes no provider options, got {sorted(options)}")
        return JobStep(host=host)
    try:
        kind = Provider(provider)
    except ValueError:
        kind = None
    if kind is not Provider.SLURM:
        raise ValueError(f"nodes=/cores_per_node= (one job of N nodes) need provider='slurm', "
                         f"got provider={provider!r}")
    if jobs != 1:
        raise ValueError(f"give nodes=N (one job of N nodes) or jobs= (one job per node), not "
                         f"both (got jobs={jobs!r})")
    options.pop("drain_margin_s", None)  # no worker --lifetime: the job's end is the engine's
    return NodesJob(host=host, **options)


def _failed(exc: BaseException) -> Future:
    fut = Future()
    fut.set_exception(exc)
    return fut


class _ForeignFuture(Exception):
    pass


def _probe_tcp(address: str, timeout: float) -> None:
    """Fail fast (OSError) when a ``tcp://host:port`` address refuses connections.

    A ``distributed.Client`` that cannot connect keeps retrying until its timeout and then
    leaves its event-loop thread's descriptors behind; a plain socket does neither."""
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp"):
        return  # tls://, ucx://, inproc://: leave it to distributed
    host, _, port = rest.rpartition(":")
    if not port.isdigit():
        return  # no port given: distributed's default applies
    with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):
        pass


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__).replace("<", "").replace(">", "")
