"""Shared state across the nodes of a dask pilot: cluster-wide best cells, channels to the
driver, per-node arrays; and the pilot's topic (node -> driver messages).

On the local backend a ``BestCell`` or ``SharedArray`` is one memfd that the
driver and all workers map.  A dask pilot spans hosts, so the two public
factories mean, on this backend:

* ``BestCell.for_pilot(pilot)`` -> a **ClusterCell**: every node gets its own
  replica (a plain BestCell in that dask worker's memory, mapped by its shoal
  workers), and the replicas are kept in step through the driver::

      node A: a worker offers v ─► replica A's slot (lock-free, as locally)
      node A: sync thread sees max(worker slots) > last published
              ─► dask worker.log_event(topic, {cell, value})  ─► scheduler
      driver: topic handler (client event loop) ─► driver copy; if v beats it:
              client.run(cell_offer, cell, v, wait=False) ─► every node writes v
              into its replica's slot 0 (the "from elsewhere" slot)
      driver: cell.offer(v) (e.g. a stop flag) ─► the same broadcast

  A value crosses the cluster in a few milliseconds (two scheduler hops).
  Values only improve, so replicas converge to the same best whatever the
  order of messages; a late or duplicated message is a no-op.
* ``Channel.for_pilot(pilot)`` -> a **DriverChannel**: each node has its own
  slots (a plain Channel there); the sync thread empties them and publishes
  each message; the driver's ``get()`` takes what arrived.
* ``SharedArray.per_node(pilot, shape, dtype, fill)`` -> a **NodeArray**: each
  node makes its own array (same shape and fill) the first time a task that
  carries the handle reaches it; nothing is synchronised.  The search engine
  keeps its per-worker counters there (who is hungry on *this* node).

Replicas are made when dask unpickles a task's arguments in the dask worker
process (``node_cell`` / ``node_array`` are the unpickling functions; the
pilot's worker plugin marks the processes that are dask workers — elsewhere,
e.g. in the scheduler, a handle stays a handle); that process owns the memfd,
and re-pickling them for its shoal workers yields ordinary handles.  They are
dropped when the driver closes the object and when the pilot closes or its node
runtime is reaped idle (``drop_pilot``) -- never while the pilot lives: a task may
hold any replica for as long as it runs.  (An LRU bound of 256 replicas per process
closed the oldest: a task waiting on a flag stopped hearing it once the node had made
256 newer replicas, and a task carrying more than 256 pilot-level objects failed
with "a closed SharedArray cannot be sent to a task".)

**Replicas travel with lent tasks.**  The balancer (balance.py) lends a spawned
task to another machine by pickling it with ``portable_dumps``.  Each replica is
registered (``runtime.shared.portable_as``) with its pilot-level handle, so the
replica — or a shoal worker's attached copy of it, which arrives in the dask
worker process when the task is taken from the deque — pickles as that handle
and unpickles on the destination into *that* machine's replica (made on demand).
What a moved task sees:

* a cell: the same global best.  Its handle carries the value the lending
  machine's replica had; on arrival that value goes into the destination
  replica's "from elsewhere" slot (values only improve: harmless if stale).  A
  replica that is *new* on its machine sends ``{"join": cell}`` to the driver,
  which answers with its own (best) value: a broadcast sent before the replica
  existed is not lost — a stop flag set anywhere reaches a task that arrives
  later, too.
* a ``per_node`` array: the destination machine's array (made with the same
  shape and fill if it is the first there), not the lender's: per node means the
  machine the task runs on (the search's Control rows say who works *here*).
* a Channel: the destination machine's slots, forwarded to the driver as any.

Rejected: refusing such tasks (``NodeBound``, the previous rule: every search task
and every user spawn program that passes a ``BestCell.for_pilot`` stayed on its
machine, so the balancer could move nothing of theirs); sending the replica's
memory by value (a copy would stop being shared: a stop would not reach it).

Rejected: dask's ``Variable``/``Event`` (polled through the scheduler: a round
trip per read, where a poll must cost nanoseconds); dask pub/sub (deprecated
in distributed, and a subscriber per node would still need a thread per
node); letting nodes open each other's memfds (works on one host only — the
loopback test clusters would hide exactly the multi-host case).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
import uuid
from collections import OrderedDict

from ...runtime.shared import BestCell, Channel, Sense, SharedArray, forget_portable, portable_as

SYNC_S = 0.002  # how often a node's sync thread looks at its replicas
SYNC_IDLE_EXIT_S = 2.0  # the sync thread exits after this long without a replica
REMOTE = 0  # the replica slot written with values from other nodes


def topic(pilot_token: str) -> str:
    return f"shoal-cells-{pilot_token}"


def _better(sense: Sense, a: float, b: float) -> bool:
    return a > b if sense is Sense.MAX else a < b


# ---------------------------------------------------------------------------
# driver side
# ---------------------------------------------------------------------------


class ClusterCell(BestCell):
    """A BestCell of a dask pilot: replicated on every node, improvements broadcast."""

    def __init__(self, hub: CellHub, sense: Sense | str, initial: float | None):
        # slot 0: the driver's own offers; slot 1: improvements from nodes (event-loop thread)
        super().__init__(2, sense, initial=initial)
        self._hub = hub
        self.token = uuid.uuid4().hex

    def _me(self) -> int:
        return 0

    def offer(self, value: float) -> bool:
        better = super().offer(value)
        if better:
            self._hub.broadcast(self.token, float(value))
        return better

    def _from_node(self, value: float) -> bool:
        """A node's improvement (event-loop thread only); True if it beats every other."""
        a = self._slots.array
        if a is None or not _better(self.sense, value, self.value):
            return False
        a[1] = value
        return True

    def __reduce__(self):
        return (node_cell, (self._hub.pilot_token, self.token, self.sense.value, self.value))

    def close(self) -> None:
        if self._slots.array is not None:
            self._hub.forget(self.token)
        super().close()


class NodeArray(SharedArray):
    """A SharedArray of a dask pilot that each node replaces with its own copy."""

    def __init__(self, hub: CellHub, shape, dtype, fill):
        super().__init__(shape, dtype, fill=fill)
        self._hub = hub
        self._fill = fill

    def __reduce__(self):
        return (node_array, (self._hub.pilot_token, self._token, self.shape, self.dtype.str,
                             self._fill))

    def close(self) -> None:
        if self._fd is not None:
            self._hub.forget(self._token)
        super().close()


class DriverChannel(Channel):
    """A Channel of a dask pilot: each node has its own slots, which its sync thread
    empties and forwards (``log_event``); ``get()`` takes what has reached the driver."""

    def __init__(self, hub: CellHub, size: int):
        self.size = size
        self._hub = hub
        self.token = uuid.uuid4().hex
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, blob: bytes) -> bool:
        raise RuntimeError("a dask pilot's Channel is written by tasks, read by the driver")

    def get(self) -> list[bytes]:
        out = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    def __reduce__(self):
        return (node_channel, (self._hub.pilot_token, self.token, self.size))

    def close(self) -> None:
        self._hub.forget(self.token)


class CellHub:
    """The driver's end: makes cells and node arrays, relays improvements between nodes."""

    def __init__(self, client, pilot_token: str):
        self.client = client
        self.pilot_token = pilot_token
        self._cells: dict[str, ClusterCell | DriverChannel] = {}
        self._subscribed = False
        self._lock = threading.Lock()
        self.on_lent = None  # the Balancer's handler of {"lent": id, "ok", "value"} messages
        self.on_started = None  # the backend's handler of {"started": [dask keys]} (node.py)
        self.on_ended = None  # ... and of {"ended": [dask keys]}: an attempt raised (retries)
        self._pinged = threading.Event()

    def subscribe(self, timeout: float = 10.0) -> None:
        """Subscribe to the pilot's topic and wait until the scheduler has it: an event
        published before the subscription arrives reaches nobody.  The handshake: ping
        the topic until the ping comes back."""
        with self._lock:
            if self._subscribed:
                return
            self._subscribed = True
        self.client.subscribe_topic(topic(self.pilot_token), self._on_event)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # (log_event is an RPC of its own: it may overtake the subscription; ping again)
            self.client.log_event(topic(self.pilot_token), {"ping": 1})
            if self._pinged.wait(0.02):
                return

    def _register(self, obj):
        with self._lock:
            self._cells[obj.token] = obj
        return obj

    def best_cell(self, sense, initial) -> ClusterCell:
        """``BestCell.for_pilot``: one replica per node, improvements broadcast."""
        return self._register(ClusterCell(self, sense, initial))

    def channel(self, size: int) -> DriverChannel:
        """``Channel.for_pilot``: each node's slots forwarded to the driver."""
        return self._register(DriverChannel(self, size))

    def node_array(self, shape, dtype, fill) -> NodeArray:
        """``SharedArray.per_node``: each node makes its own copy."""
        return NodeArray(self, shape, dtype, fill)

    def _on_event(self, event) -> None:
        """A node published an improvement (runs on the client's event-loop thread)."""
        msg = event[1]
        if "ping" in msg:
            self._pinged.set()
            return
        if "started" in msg:
            if self.on_started is not None:
                self.on_started(msg["started"])
            return
        if "ended" in msg:
            if self.on_ended is not None:
                self.on_ended(msg["ended"])
            return
        if "lent" in msg:
            if self.on_lent is not None:
                self.on_lent(msg)
            return
        cell = self._cells.get(msg.get("cell"))
        if "join" in msg:  # a new replica: tell it (and the others) the best so far
            if isinstance(cell, ClusterCell):
                coro = self.client.run(cell_offer, cell.token, cell.value, wait=False,
                                       asynchronous=True, on_error="ignore")
                asyncio.ensure_future(coro)
            return
        if "blob" in msg:  # a Channel message
            if cell is not None:
                cell._inbox.put(msg["blob"])
            return
        if cell is not None and cell._from_node(float(msg["value"])):
            coro = self.client.run(cell_offer, cell.token, float(msg["value"]), wait=False,
                                   asynchronous=True, on_error="ignore")
            asyncio.ensure_future(coro)

    def broadcast(self, token: str, value: float) -> None:
        """Send ``value`` to every node's replica (driver threads, not the event loop)."""
        try:
            self.client.run(cell_offer, token, value, wait=False, on_error="ignore")
        except Exception:  # the cluster is going away: nothing left to tell
            pass

    def forget(self, token: str) -> None:
        with self._lock:
            self._cells.pop(token, None)
        try:
            if self.client.status == "running":
                self.client.run(drop, token, wait=False, on_error="ignore")
        except Exception:  # pragma: no cover - the cluster is going away
            pass

    def close(self) -> None:
        with self._lock:
            subscribed, self._subscribed = self._subscribed, False
            self._cells.clear()
        if subscribed:
            try:
                self.client.unsubscribe_topic(topic(self.pilot_token))
            except Exception:  # pragma: no cover
                pass


# ---------------------------------------------------------------------------
# node side (dask worker processes)
# ---------------------------------------------------------------------------


class _Replica:
    __slots__ = ("pilot", "cell", "array", "channel", "last")

    def __init__(self, pilot: str, cell: BestCell | None = None, array: SharedArray | None = None,
                 channel: Channel | None = None):
        self.pilot, self.cell, self.array, self.channel = pilot, cell, array, channel
        self.last = None if cell is None else cell.value  # last value published


_lock = threading.Lock()
_replicas: OrderedDict[str, _Replica] = OrderedDict()
_workers: dict[str, object] = {}  # pilot token -> this process's dask Worker (for log_event)
_sync: threading.Thread | None = None


def register_worker(pilot_token: str, worker) -> None:
    """Remember the dask worker of this process for pilot ``pilot_token`` (plugin setup)."""
    if worker is not None:
        _workers[pilot_token] = worker


def _keep(token: str, rep: _Replica) -> None:
    _replicas[token] = rep  # until drop / drop_pilot: a running task may hold it


def _close(rep: _Replica) -> None:
    obj = rep.cell or rep.array or rep.channel
    forget_portable(obj)
    obj.close()


def _start_sync() -> None:
    global _sync
    if _sync is None or not _sync.is_alive():
        _sync = threading.Thread(target=_sync_loop, name="shoal-cell-sync", daemon=True)
        _sync.start()


class _Unplaced:
    """A handle unpickled outside a dask worker (the scheduler deserialises task
    arguments too): pickles back to itself, makes no replica there."""

    __slots__ = ("call",)

    def __init__(self, *call):
        self.call = call

    def __reduce__(self):
        return self.call


def node_cell(pilot_token: str, token: str, sense: str, value: float) -> BestCell:
    """Unpickling a ClusterCell here: this process's replica (made on first use)."""
    if pilot_token not in _workers:
        return _Unplaced(node_cell, (pilot_token, token, sense, value))
    with _lock:
        rep = _replicas.get(token)
        new = rep is None
        if new:
            # slot 0: values from other nodes; slots 1..: this node's workers (by endpoint)
            cell = BestCell((os.cpu_count() or 1) + 2, sense, initial=value)
            rep = _Replica(pilot_token, cell=cell)
            portable_as(cell, _cell_handle(pilot_token, token, cell))
            _keep(token, rep)
            _start_sync()
        else:
            _replicas.move_to_end(token)
            a = rep.cell.slots  # the value it brings (a task lent from another machine)
            if a is not None and _better(rep.cell.sense, value, a[REMOTE]):
                a[REMOTE] = value
    if new:  # the driver answers with its best: nothing broadcast before now is lost
        publish(pilot_token, {"cell": token, "join": 1})
    return rep.cell


def _cell_handle(pilot_token: str, token: str, cell: BestCell):
    return lambda: (node_cell, (pilot_token, token, cell.sense.value, cell.value))


def node_array(pilot_token: str, token: str, shape, dtype, fill) -> SharedArray:
    """Unpickling a NodeArray here: this process's own array (made on first use)."""
    if pilot_token not in _workers:
        return _Unplaced(node_array, (pilot_token, token, shape, dtype, fill))
    with _lock:
        rep = _replicas.get(token)
        if rep is None:
            array = SharedArray(tuple(shape), dtype, fill=fill)
            call = (node_array, (pilot_token, token, shape, dtype, fill))
            portable_as(array, lambda: call)
            rep = _Replica(pilot_token, array=array)
            _keep(token, rep)
        else:
            _replicas.move_to_end(token)
        return rep.array


def node_channel(pilot_token: str, token: str, size: int) -> Channel:
    """Unpickling a DriverChannel here: this node's slots (made on first use)."""
    if pilot_token not in _workers:
        return _Unplaced(node_channel, (pilot_token, token, size))
    with _lock:
        rep = _replicas.get(token)
        if rep is None:
            chan = Channel((os.cpu_count() or 1) + 2, size)
            call = (node_channel, (pilot_token, token, size))
            portable_as(chan, lambda: call)
            rep = _Replica(pilot_token, channel=chan)
            _keep(token, rep)
            _start_sync()
        else:
            _replicas.move_to_end(token)
        return rep.channel


async def cell_offer(token: str, value: float) -> None:
    """A better value from elsewhere (``client.run``, on the dask worker's event loop)."""
    with _lock:
        rep = _replicas.get(token)
        if rep is None or rep.cell is None:
            return
        a = rep.cell.slots
        if a is not None and _better(rep.cell.sense, value, a[REMOTE]):
            a[REMOTE] = value


async def drop(token: str) -> None:
    """The driver closed this cell or array (``client.run``)."""
    with _lock:
        rep = _replicas.pop(token, None)
    if rep is not None:
        _close(rep)


def drop_pilot(pilot_token: str) -> None:
    """The pilot closed: drop all its replicas in this process."""
    _workers.pop(pilot_token, None)
    with _lock:
        gone = [t for t, r in _replicas.items() if r.pilot == pilot_token]
        reps = [_replicas.pop(t) for t in gone]
    for rep in reps:
        _close(rep)


def publish(pilot_token: str, msg: dict) -> None:
    """Send ``msg`` (msgpack-able) to the pilot's driver on its topic (any thread)."""
    worker = _workers.get(pilot_token)
    if worker is not None:
        try:
            worker.log_event(topic(pilot_token), msg)
        except Exception:  # pragma: no cover - the worker is closing
            pass


def _sync_loop() -> None:
    """Publish this node's cell improvements and Channel messages (daemon thread; exits
    when idle)."""
    global _sync
    idle_since = time.monotonic()
    while True:
        time.sleep(SYNC_S)
        with _lock:
            live = [(t, r) for t, r in _replicas.items() if r.array is None]
            if not live:
                if time.monotonic() - idle_since > SYNC_IDLE_EXIT_S:
                    _sync = None
                    return
                continue
            idle_since = time.monotonic()
            news = []
            for token, rep in live:
                if rep.channel is not None:
                    news += [(rep.pilot, {"cell": token, "blob": b}) for b in rep.channel.get()]
                    continue
                a = rep.cell.slots
                mine = float(a[1:].max() if rep.cell.sense is Sense.MAX else a[1:].min())
                if _better(rep.cell.sense, mine, rep.last) and _better(rep.cell.sense, mine,
                                                                       float(a[REMOTE])):
                    rep.last = mine
                    news.append((rep.pilot, {"cell": token, "value": mine}))
        for pilot, msg in news:
            publish(pilot, msg)
