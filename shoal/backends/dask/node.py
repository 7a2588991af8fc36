"""The node side of the dask backend: one shoal runtime inside each dask worker process.

Data flow (one dask task)::

    dask worker thread ── run_task(cfg, fn blob, args, kwargs) ──► node_runtime(cfg)
        │  (secede from dask's thread pool while the node has room)      │ a LocalBackend:
        └── waits on node.backend.submit(fn, ...).result() ◄─────────────┘ shoal workers,
                                                                            rings, stealing

* ``node_runtime(cfg)`` finds or starts the ``LocalBackend`` of the pilot
  ``cfg.token`` in this process (called once per pilot and process; later
  calls are a dict lookup).  Its worker processes are children of the dask
  worker process and hold the read end of the LocalBackend's lifeline pipe,
  so they exit when the dask worker dies, even by SIGKILL.
* ``close_node(token)`` (sent with ``client.run`` when the pilot closes) stops
  that runtime; an *idle reaper* stops a runtime no task used for
  ``cfg.idle_timeout`` seconds (a driver that died without closing leaves
  nothing behind for long).  A later task starts a fresh runtime, except for a
  pilot that closed here: its tasks that dask still hands out return
  ``claims.CANCELLED`` (a fresh runtime would live on with nobody to stop it).
* Cancel: ``run_task``/``run_batch`` claim their dask key in ``Claims`` (one per
  pilot in this process) before the node runtime gets the task; the driver's
  ``cancel()`` takes it back there or learns it started (claims.py).
* Admission: a task *secedes* from dask's thread pool while the node has
  more idle shoal workers than the dask worker has threads, so one dask thread
  can feed a node of many shoal workers; the last tasks hold their dask slots,
  so a node whose shoal workers are all busy looks full to the scheduler, which
  keeps further root tasks centrally and hands them to whichever node frees a
  slot first (cross-node balancing at the granularity of dask tasks).  Rejected:
  seceding while the node has any idle worker — the scheduler then queues a
  task behind the busy workers, where it waits while another node idles.
* Errors: the exception from the node keeps its type; the shoal worker's
  traceback text rides along in the exception's ``__dict__`` (which pickle
  keeps) as ``_shoal_remote_tb``, because dask drops ``__cause__``.

Invariants: one runtime per (process, pilot token); ``inflight`` counts this
process's dask tasks that are inside a runtime, and the reaper never closes a
runtime with ``inflight > 0``.

Rejected: a ``WorkerPlugin`` per pilot (its teardown runs only on clean
shutdown, and workers that join late need the lazy path anyway); running the
task in the dask worker process itself (no stealing, and ``shoal.spawn``
would have no worker loop to push to).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from collections import OrderedDict
from concurrent.futures import CancelledError
from dataclasses import dataclass

import cloudpickle
from distributed.diagnostics.plugin import WorkerPlugin

from ..._errors import PilotClosed, SerializationError
from ...runtime import graph, wire
from ...runtime.mapping import TARGET_S, map_iter
from ...runtime.shared import portable_dumps
from ...runtime.topology import topology as get_topology
from ..local import LocalBackend
from . import on_scheduler
from .cells import drop_pilot, publish, register_worker
from .claims import CANCELLED, Claims, Fate, Verdict

cloudpickle.register_pickle_by_value(on_scheduler)  # the scheduler need not have shoal

DASK_TARGET_S = 0.1  # node time one map batch (= one dask task) should take
_FN_CACHE = 256
_REAP_EVERY_S = 10.0
WATCH_S = 0.002  # how often the started watcher looks at tasks queued in node runtimes
ARBITRATE_TIMEOUT_S = 10.0  # a holder's question to the scheduler (``_arbitrate``)
TB_ATTR = "_shoal_remote_tb"


@dataclass(frozen=True)
class NodeConfig:
    """What a dask task needs to find (or start) its pilot's runtime in a dask worker."""

    token: str
    workers: int | None = None  # shoal workers per dask worker; None: from the sizing plugin
    seed: int = 0
    idle_timeout: float = 600.0


class _Node:
    """One pilot's runtime in this dask worker process (guarded by ``_lock``)."""

    def __init__(self, cfg: NodeConfig, workers: int):
        self.backend = LocalBackend(workers, seed=cfg.seed)
        self.cfg = cfg
        self.inflight = 0
        self.pinned = 0  # tasks in flight that hold dask worker resources (resources=)
        self.tasks = 0
        self.seceded = 0
        self.last_used = time.monotonic()
        self.fns: OrderedDict[bytes, object] = OrderedDict()

    def function(self, blob: bytes):
        """The function for a cloudpickle blob; the same object for the same blob, so the
        LocalBackend sends it to its workers once."""
        with _lock:
            fn = self.fns.get(blob)
            if fn is not None:
                self.fns.move_to_end(blob)
                return fn
        fn = cloudpickle.loads(blob)
        with _lock:
            fn = self.fns.setdefault(blob, fn)
            while len(self.fns) > _FN_CACHE:
                self.fns.popitem(last=False)
        return fn


_lock = threading.Lock()
_nodes: dict[str, _Node] = {}
_reaper: threading.Thread | None = None
_claims: dict[str, Claims] = {}  # pilot token -> its tasks' claims in this process (claims.py)
_closed: set[str] = set()  # tokens of pilots closed here: no runtime of theirs starts again


_watched: dict[tuple[str, str], object] = {}  # (token, key) -> node-queued local future
_watch_cv = threading.Condition()
_watcher: threading.Thread | None = None

_slices: dict[str, dict[str, tuple[int, ...]]] = {}  # pilot token -> {dask worker: its CPUs}


def _my_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return ""


def _claim_cpus(cfg: NodeConfig) -> int:
    """Restrict this dask worker process to its slice of the host's CPUs (so the node
    runtimes of several dask workers on one host pin their shoal workers to disjoint CPUs)
    and return how many shoal workers to start: ``cfg.workers``, else the slice's size."""
    mine = _slices.get(cfg.token, {}).get(_my_address())
    if mine:
        try:
            os.sched_setaffinity(0, mine)
            get_topology(refresh=True)
        except OSError:  # pragma: no cover - CPUs gone from the cgroup meanwhile
            pass
    if cfg.workers is not None:
        return cfg.workers
    return len(mine) if mine else max(1, len(get_topology(spec="").usable_cpus))  # the job's CPUs


def node_runtime(cfg: NodeConfig) -> _Node:
    """This process's runtime for pilot ``cfg.token``, started on first use; PilotClosed
    once that pilot closed here (a task dask still hands out after the close must not
    start a fresh runtime that nobody would stop)."""
    global _reaper
    with _lock:
        node = _nodes.get(cfg.token)
        if node is not None and not node.backend.closing:
            return node
        if cfg.token in _closed:
            raise PilotClosed(f"pilot {cfg.token} closed; its node runtime does not start again")
    workers = _claim_cpus(cfg)
    with _lock:
        if cfg.token in _closed:
            raise PilotClosed(f"pilot {cfg.token} closed; its node runtime does not start again")
        node = _nodes.get(cfg.token)
        if node is not None and not node.backend.closing:
            return node
        node = _nodes[cfg.token] = _Node(cfg, workers)
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reap, name="shoal-dask-reaper", daemon=True)
            _reaper.start()
    return node


def _enter(node: _Node, pinned: bool = False) -> bool:
    """Count a task in; True when it should leave dask's thread pool.

    The last ``threads`` tasks a node can run keep their dask slots: once every
    shoal worker has a task, the dask worker looks full to the scheduler, which
    then holds further tasks centrally instead of queueing them behind busy
    workers here (where they would wait while another node idles)."""
    threads = _dask_threads()
    with _lock:
        node.inflight += 1
        node.pinned += pinned
        node.tasks += 1
        node.last_used = time.monotonic()
        room = node.inflight <= node.backend.n - threads
        if room:
            node.seceded += 1
        return room


def _dask_threads() -> int:
    try:
        from distributed import get_worker

        return max(1, get_worker().state.nthreads)
    except (ImportError, ValueError, AttributeError):  # not in a dask task (unit tests)
        return 1


def _leave(node: _Node, pinned: bool = False) -> None:
    with _lock:
        node.inflight -= 1
        node.pinned -= pinned
        node.last_used = time.monotonic()


def _secede() -> None:
    try:
        from distributed import secede

        secede()
    except (ImportError, ValueError):  # not inside a dask task (tests call run_task directly)
        pass


def _tag(exc: BaseException) -> None:
    """Keep the shoal worker's traceback text on the exception across dask's pickling."""
    cause = exc.__cause__
    tb = getattr(cause, "tb", None)
    if isinstance(tb, str):
        try:
            exc.__dict__[TB_ATTR] = tb
        except (AttributeError, TypeError):  # pragma: no cover - exceptions without __dict__
            pass


def run_task(cfg: NodeConfig, blob: bytes, args: tuple, kwargs: dict, timeout: float | None,
             unpack: bool = False, pinned: bool = False):
    """A dask task: run ``fn(*args, **kwargs)`` on this node's shoal runtime (dask worker).
    ``unpack``: the arguments held dependencies, and sets among them travelled as tagged
    dicts (``graph.substitute(..., sets_as_dicts=True)``; dask walks no sets).
    ``pinned``: the task holds dask worker resources here (``resources=``): while it
    runs, this node lends none of its spawned work to other machines.
    Returns ``claims.CANCELLED`` without running when the driver cancelled the task first
    (or its pilot closed here)."""
    key, worker = _current()
    try:
        node = node_runtime(cfg)
    except PilotClosed:
        return CANCELLED
    if unpack:
        args, kwargs = graph.unpack_sets(args), graph.unpack_sets(kwargs)
    fn = node.function(blob)
    if _enter(node, pinned):
        _secede()
    failed = False
    try:
        if key is None:  # not a dask task (unit tests call run_task directly)
            return node.backend.submit(fn, args, kwargs, timeout=timeout).result()
        claims = claims_of(cfg.token)
        while True:
            local = claims.start(key, lambda: node.backend.submit(fn, args, kwargs, timeout=timeout))
            if local is None:
                return CANCELLED
            _watch(cfg.token, key, local)
            try:
                return local.result()
            except CancelledError:
                if not local.cancelled():
                    raise
            # taken back by a claim round: CANCELLED once dask released the key here (the
            # driver confirmed it), or run after all if the driver gave the round up (it
            # answered False; the reply came too late: a stalled worker, claims.py)
            if not claims.settle_taken(key, lambda: _executing(worker, key),
                                       lambda k, rids: _arbitrate(worker, k, rids)):
                return CANCELLED
    except BaseException as exc:
        _tag(exc)
        if key is not None:  # dask may retry it: the driver's future is PENDING again
            failed = True
            with _watch_cv:  # after this attempt's STARTED, if any (_watch_loop)
                publish(cfg.token, {"ended": [key]})
        raise
    finally:
        _leave(node, pinned)
        if key is not None:
            _finish(cfg.token, key, worker, failed)


def _executing(worker, key: str) -> bool:
    """Whether dask still wants ``key`` run on ``worker`` (not released or cancelled there)."""
    ts = worker.state.tasks.get(key)
    return ts is not None and ts.state in ("executing", "long-running")


def _arbitrate(worker, key: str, rids: list[int]) -> bool:
    """``on_scheduler.arbitrate`` on the scheduler, from this dask thread (claims.py
    ``settle_taken``: no verdict came for a task taken back here)."""
    from distributed.protocol.pickle import dumps
    from distributed.utils import sync

    reply = sync(worker.loop, worker.scheduler.run_function,
                 function=dumps(on_scheduler.arbitrate),
                 args=dumps((key, rids, worker.address)), kwargs=dumps({}),
                 callback_timeout=ARBITRATE_TIMEOUT_S)
    if reply.get("status") != "OK":
        raise RuntimeError(f"the scheduler could not decide {key!r}: {reply!r}")
    return bool(reply["result"])


def _watch(token: str, key: str, local) -> None:
    """Tell the driver (the pilot's topic) once a shoal worker starts ``local``: its
    ``Future.running()`` then reads a local state instead of asking the cluster.  One
    watcher thread per process looks at the tasks queued in node runtimes every
    ``WATCH_S`` (or less often, so that it takes at most ~10% of a CPU) while there are
    any; a task that finishes first sends nothing."""
    global _watcher
    with _watch_cv:
        _watched[(token, key)] = local
        if _watcher is None or not _watcher.is_alive():
            _watcher = threading.Thread(target=_watch_loop, name="shoal-dask-started",
                                        daemon=True)
            _watcher.start()
        _watch_cv.notify()


def _watch_loop() -> None:
    while True:
        with _watch_cv:
            while not _watched:
                _watch_cv.wait()
            items = list(_watched.items())
        t0 = time.perf_counter()
        started: dict[str, list[tuple[str, object]]] = {}
        seen = []
        for (token, key), local in items:
            try:
                if local.done():
                    seen.append((token, key))
                elif local.running():
                    started.setdefault(token, []).append((key, local))
                    seen.append((token, key))
            except Exception:  # noqa: BLE001 - a runtime closing under us: stop watching it
                seen.append((token, key))
        with _watch_cv:
            for item in seen:
                _watched.pop(item, None)
            # under the lock, and only while the attempt has not ended: run_task publishes
            # "ended" under it too, so an attempt's STARTED never arrives after its "ended"
            # (the future would stay RUNNING through a queued retry)
            for token, pairs in started.items():
                keys = [key for key, local in pairs if not local.done()]
                if keys:
                    publish(token, {"started": keys})
        # at most ~10% of a CPU: a big node with many queued tasks scans for longer
        time.sleep(max(WATCH_S, 9 * (time.perf_counter() - t0)))


def _current() -> tuple[str | None, object]:
    """(dask key, dask worker) of the task this thread runs; (None, None) outside dask."""
    try:
        from distributed import get_worker

        worker = get_worker()
        return worker.get_current_task(), worker
    except (ImportError, ValueError, AttributeError, KeyError):
        return None, None


def claims_of(token: str) -> Claims:
    with _lock:
        claims = _claims.get(token)
        if claims is None:
            claims = _claims[token] = Claims()
        return claims


def _finish(token: str, key: str, worker, failed: bool = False) -> None:
    with _lock:
        claims = _claims.get(token)
    if claims is not None:
        tasks = getattr(getattr(worker, "state", None), "tasks", None)
        claims.finish(key, None if tasks is None else tasks.__contains__, failed)


def cancel_keys(token: str, keys: list[str], round_id: int | None = None,
                deadline: float | None = None, dask_worker=None) -> dict[str, str]:
    """``client.run`` on the dask worker the scheduler says holds ``keys`` (the driver's
    ``cancel()``, claims.py): take each key back here, or report it started;
    ``{key: Verdict value}``.  ``deadline`` (the driver's ``time.time()``): a round
    arriving later than that (this worker was stopped) takes nothing, since the driver
    answered False by then."""
    tasks = getattr(getattr(dask_worker, "state", None), "tasks", None)

    def state(key):
        ts = None if tasks is None else tasks.get(key)
        return None if ts is None else ts.state

    with _lock:
        if token in _closed:
            return {}  # nothing of that pilot runs here any more
    if deadline is not None and time.time() > deadline:
        return {k: Verdict.STARTED.value for k in keys}
    out = claims_of(token).cancel(keys, state, round_id, deadline)
    return {k: v.value for k, v in out.items()}


def give_up_round(token: str, round_id: int, keys: list[str]) -> None:
    """``client.run`` after the driver stopped waiting for this worker's answer to round
    ``round_id``: it takes nothing if it comes later; its tombstones are lifted."""
    with _lock:
        claims = _claims.get(token)
    if claims is not None:
        claims.give_up(round_id, keys)


def started_keys(token: str, keys: list[str]) -> list[str]:
    """``client.run``: the keys among ``keys`` a shoal worker here runs or ran."""
    with _lock:
        claims = _claims.get(token)
    return [] if claims is None else claims.started(keys)


def force_keys(token: str, keys: list[str]) -> list[str]:
    """``client.run`` (``pilot.cancel(fut, force=True)``): the keys among ``keys`` whose
    task this node's runtime held and cancelled, killing (and replacing) the shoal worker
    running it (``LocalBackend.force_cancel``); their ``run_task`` returns CANCELLED."""
    with _lock:
        claims, node = _claims.get(token), _nodes.get(token)
    if claims is None or node is None:
        return []
    with claims.lock:
        held = [(k, claims.entries.get(k)) for k in keys]
    return [k for k, entry in held if entry is not None and not isinstance(entry, Fate)
            and not entry.done() and node.backend.force_cancel(entry)]


def forget_keys(token: str, keys: list[str]) -> None:
    """``client.run``: lift the tombstones of keys whose cancel another worker refused."""
    with _lock:
        claims = _claims.get(token)
    if claims is not None:
        claims.forget(keys)


def run_batch(cfg: NodeConfig, blob: bytes, star: bool, batch: list, pinned: bool = False):
    """A dask task: one coarse map batch, spread over this node's shoal workers by the
    node's own adaptive map.  Returns ``(results, scaled seconds, error or None)``: the seconds are
    scaled so that the driver's ``map_iter`` (which aims at ``TARGET_S`` per batch)
    sizes dask batches to about ``DASK_TARGET_S`` of node time; ``claims.CANCELLED`` when
    the driver cancelled the batch before it started here (or the pilot closed)."""
    key, worker = _current()
    try:
        node = node_runtime(cfg)
    except PilotClosed:
        return CANCELLED
    if key is not None and claims_of(cfg.token).start(key, lambda: Fate.STARTED) is None:
        return CANCELLED
    fn = node.function(blob)
    if _enter(node, pinned):
        _secede()
    try:
        t0 = time.perf_counter()
        columns = [list(c) for c in zip(*batch, strict=True)] if star else [batch]
        out, err = [], None
        try:
            out.extend(map_iter(node.backend, fn, columns))
        except Exception as exc:  # the results before the failing item travel with its error
            cause = exc.__cause__
            tb = cause.tb if isinstance(getattr(cause, "tb", None), str) else "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__))
            err = (exc, tb)
        elapsed = time.perf_counter() - t0
        return out, elapsed * TARGET_S / DASK_TARGET_S, err
    except BaseException as exc:
        _tag(exc)
        raise
    finally:
        _leave(node, pinned)
        if key is not None:
            _finish(cfg.token, key, worker)


# -- spawned work lent between machines (the driver's Balancer, shoal/backends/dask/balance.py) --


def export_spawned(token: str) -> list[tuple]:
    """``client.run`` on a busy node: lend spawned tasks for another machine.

    The node runtime steals as endpoint 0 (half of every worker's deque, oldest
    first); each task whose arguments can leave this machine (``portable_dumps``:
    this node's replicas of pilot-level objects go as those objects, cells.py;
    other shared memory of this machine cannot go) is returned as ``(task id,
    function blob or None, payload pickled for there, inline)``, the rest run here
    after all.  A returned task is owed a ``deliver_result``: its owner waits for it.
    Nothing is lent while a task holding dask worker resources runs here (its
    spawned children may need the GPU it holds; they are not told apart from the
    others' in the workers' deques).
    """
    with _lock:
        node = _nodes.get(token)
        if node is None or node.pinned:
            return []
    out, back = [], []
    for msg in node.backend.export():
        item = _portable(node, msg)
        if item is None:
            back.append(msg)
        else:
            out.append(item)
    if back:
        node.backend.give_back(back)
    return out


def _portable(node: _Node, msg: bytes) -> tuple | None:
    flags, fn_id, tid = wire.decode_task_header(msg)
    inline = bool(flags & wire.Flag.INLINE_FN)
    try:
        # pickled again for the other machine: this node's replicas of pilot-level
        # objects go as those objects (cells.py), other shared memory not at all
        body = portable_dumps(wire.pickle.loads(memoryview(msg)[wire.TASK_HDR.size:]))
        blob = None
        if not inline:
            fn = node.backend.function_of(fn_id)
            blob = None if fn is None else portable_dumps(fn, by_value=True)
            if blob is None:
                return None
    except Exception:
        return None
    if body is None:
        return None
    return tid, blob, body, inline


async def run_lent(cfg: NodeConfig, lid: int, blob: bytes | None, body: bytes,
                   inline: bool) -> None:
    """``client.run`` on an idle node: run a task lent by another machine.

    Not a dask task: one would need a free dask thread, and the lending node's
    root task (waiting in a join for this one) may hold the only one there is.
    A thread starts the task on this node's runtime and returns; the result is
    published on the pilot's topic (``lent_done``) for the driver to hand back.
    """
    threading.Thread(target=_start_lent, args=(cfg, lid, blob, body, inline),
                     name="shoal-lent", daemon=True).start()


def _start_lent(cfg: NodeConfig, lid: int, blob, body: bytes, inline: bool) -> None:
    try:
        node = node_runtime(cfg)
        if inline:
            fn, args, kwargs = wire.pickle.loads(body)
        else:
            fn = node.function(blob)
            args, kwargs = wire.pickle.loads(body)
        with _lock:
            node.inflight += 1
            node.last_used = time.monotonic()
        fut = node.backend.submit(fn, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 - it travels back to the task's owner
        _lent_done(cfg.token, lid, False, exc)
        return

    def done(f):
        with _lock:
            node.inflight -= 1
            node.last_used = time.monotonic()
        try:
            _lent_done(cfg.token, lid, True, f.result())
        except BaseException as exc:  # noqa: BLE001
            _lent_done(cfg.token, lid, False, exc)

    fut.add_done_callback(done)


def _lent_done(token: str, lid: int, ok: bool, value) -> None:
    try:
        blob = cloudpickle.dumps(value)
    except Exception as exc:
        ok, blob = False, cloudpickle.dumps(SerializationError(
            f"cannot pickle the result of a lent task ({type(value).__name__}): {exc!r}"))
    publish(token, {"lent": lid, "ok": ok, "value": blob})


def node_load(token: str) -> tuple[int, int]:
    """``client.run``: (shoal workers, how many of them are hungry) of this node's runtime;
    (0, 0) when it has none."""
    with _lock:
        node = _nodes.get(token)
    if node is None or node.backend.closing:
        return 0, 0
    return node.backend.n, node.backend.hungry()


def deliver_result(token: str, task_id: int, ok: bool, blob: bytes) -> bool:
    """``client.run`` on the lending node: the (pickled) result of a task it lent."""
    with _lock:
        node = _nodes.get(token)
    if node is None:
        return False
    node.backend.deliver(task_id, ok, cloudpickle.loads(blob))
    return True


def probe() -> tuple[str, tuple[int, ...]]:
    """(host, usable CPUs) of this dask worker (run with ``client.run``)."""
    return _my_address().rsplit(":", 1)[0], get_topology(spec="").usable_cpus  # a batch job's


def cpu_slices(probes: dict[str, tuple[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """Split each host's CPUs between the dask workers on it (pure): ``{address: CPUs}``,
    disjoint when there are at least as many CPUs as dask workers, at least one CPU each."""
    by_host: dict[str, list[str]] = {}
    for addr, (host, _) in sorted(probes.items()):
        by_host.setdefault(host, []).append(addr)
    out = {}
    for addrs in by_host.values():
        cpus = probes[addrs[0]][1] or (0,)
        k = max(1, len(cpus) // len(addrs))
        for i, addr in enumerate(addrs):
            out[addr] = tuple(cpus[(i * k + j) % len(cpus)] for j in range(k))
    return out


class NodePlugin(WorkerPlugin):
    """Registered once per pilot: gives every dask worker it knows its slice of the host's
    CPUs (a worker that joins or restarts later, under a new address, takes all of them);
    its teardown (pilot close, or the dask worker closing) stops the pilot's runtime there."""

    def __init__(self, token: str, slices: dict[str, tuple[int, ...]]):
        self.token = token
        self.slices = dict(slices)

    def setup(self, worker=None):
        _slices[self.token] = self.slices
        register_worker(self.token, worker)

    def teardown(self, worker=None):
        _slices.pop(self.token, None)
        close_node(self.token)
        drop_pilot(self.token)


def node_stats(token: str) -> dict | None:
    """Stats of pilot ``token``'s runtime here, or None when none runs (``client.run``)."""
    with _lock:
        node = _nodes.get(token)
        if node is None:
            return None
        counters = {"dask_tasks": node.tasks, "seceded": node.seceded, "inflight": node.inflight,
                    "pid": os.getpid(), "host": socket.gethostname()}
    stats = node.backend.stats()
    stats["node"] = counters
    return stats


def close_node(token: str) -> bool:
    """Stop pilot ``token``'s runtime in this process for good (its plugin's teardown at
    pilot close): tasks of that pilot that dask still hands out afterwards return
    ``CANCELLED`` instead of starting a fresh runtime."""
    with _lock:
        node = _nodes.pop(token, None)
        _closed.add(token)
        _claims.pop(token, None)
    if node is None:
        return False
    node.backend.close(cancel_pending=True)
    return True


def _reap() -> None:
    """Close runtimes that no task used for their ``idle_timeout`` (daemon thread)."""
    while True:
        time.sleep(_REAP_EVERY_S)
        now = time.monotonic()
        with _lock:
            idle = [t for t, n in _nodes.items()
                    if n.inflight == 0 and now - n.last_used > n.cfg.idle_timeout]
            nodes = [_nodes.pop(t) for t in idle]
        for token in idle:
            drop_pilot(token)
        for node in nodes:
            try:
                node.backend.close(cancel_pending=True)
            except Exception:  # pragma: no cover - keep reaping the others
                pass
