"""The scheduler's part of a cancel (claims.py): where each key is, and, atomically, cancel
the keys no dask worker can start any more.

``client.run_on_scheduler(locate, ...)`` runs ``locate`` on the scheduler's event loop,
which is single-threaded: between reading a task's state and ``stimulus_cancel`` no other
handler runs, so a key that is on no worker when it is read never reaches one.  This
module imports only the standard library and is pickled *by value* (backend.py registers
it with cloudpickle): a user's ``dask scheduler`` need not have shoal installed.
"""

from __future__ import annotations

# Scheduler states of a task that no dask worker has been sent (or that it was taken from).
UNASSIGNED = frozenset(("released", "waiting", "queued", "no-worker"))
TAKEN = "taken"  # cancelled here: never runs
STARTED = "started"  # ran (erred) or may run: cancel() says False
MISSING = "missing"  # not known to the scheduler (yet, or no more)
WORKERS = "shoal:workers"  # locate's extra entry: the addresses of every connected dask worker
CHUNK = 32  # keys per stimulus_cancel call
REASON = "shoal: cancel() before any shoal worker started it"


VOID_KEEP = 4096  # (key, round) pairs a holder voided here (``arbitrate``), newest kept


def locate(keys, claimed, client, rid=None, dask_scheduler=None):
    """For each of ``keys``: TAKEN (cancelled now, atomically), STARTED, MISSING, or the
    address of the dask worker it is processing on (whose claims decide); and under
    ``WORKERS`` every connected worker's address.  ``claimed``: ``{key: [addresses]}`` of
    the workers that have taken a key back (a tombstone or the node queue's own cancel);
    such a key is cancelled if it is still on one of them, or in memory there (its value
    is the refusal), and asked again where it moved to otherwise.  ``rid``: the claim
    round asking; a take its holder voided here (``arbitrate``) counts for nothing."""
    sched = dask_scheduler
    void = getattr(sched, "_shoal_void", None) or {}
    out, cancel = {}, []
    for key in keys:
        ts = sched.tasks.get(key)
        if ts is None:
            out[key] = MISSING
            continue
        if not any(cs.client_key == client for cs in ts.who_wants or ()):
            # our client released it: another round cancelled it (the task state lingers
            # while its worker lets go).  The driver decides (cancel.py ``_missing``);
            # STARTED here made a concurrent cancel() say False for a cancelled future
            out[key] = MISSING
            continue
        state, mine = ts.state, claimed.get(key) or ()
        if (key, rid) in void:
            mine = ()  # the holder ran it after all: ask it (it answers STARTED to rid)
        if state in UNASSIGNED:
            out[key] = TAKEN
        elif state == "processing":
            where = ts.processing_on.address if ts.processing_on is not None else None
            out[key] = TAKEN if where is not None and where in mine else (where or MISSING)
        elif state == "memory" and ts.who_has:
            holders = [ws.address for ws in ts.who_has]
            if any(a in mine for a in holders):
                out[key] = TAKEN  # its value is the node's refusal (claims.CANCELLED)
            else:
                # a value, or the refusal of a tombstone another round (thread) planted:
                # only that worker's claims know which (F6: STARTED here made one thread's
                # cancel() say False while the other's said True for the same future)
                out[key] = holders[0]
        else:
            out[key] = STARTED
        if out[key] == TAKEN:
            cancel.append(key)
    for i in range(0, len(cancel), CHUNK):
        # (stimulus_cancel releases its whole key list once per key given: quadratic, so
        # 1,600 keys in one call held the scheduler's loop for seconds)
        part = cancel[i:i + CHUNK]
        try:
            sched.stimulus_cancel(part, client, False, REASON, "")
        except TypeError:  # pragma: no cover - distributed before 2024: (keys, client, force)
            sched.stimulus_cancel(part, client, False)
    out[WORKERS] = list(sched.workers)
    return out


def where(keys, dask_scheduler=None):
    """``{key: address}`` of the dask worker each of ``keys`` is processing on (read only;
    ``pilot.cancel(fut, force=True)`` asks only that worker)."""
    out = {}
    for key in keys:
        ts = dask_scheduler.tasks.get(key)
        if ts is not None and ts.state == "processing" and ts.processing_on is not None:
            out[key] = ts.processing_on.address
    return out


def arbitrate(key, rids, addr, dask_scheduler=None):
    """A holder (``addr``) took ``key`` back for the claim rounds ``rids`` and heard no
    verdict in time (a lost ``give_up``, or a release still on its way; claims.py
    ``settle_taken``).  Decided here, atomically, as ``locate`` decides: False if dask no
    longer runs the key there (a round confirmed the take and cancelled it, or it moved:
    the holder's release is on its way); else True, and those rounds' takes are void here,
    so their confirming ``locate`` no longer cancels the key (their ``cancel()`` says False)
    and the holder runs it."""
    sched = dask_scheduler
    ts = sched.tasks.get(key)
    where = getattr(ts, "processing_on", None)
    if ts is None or ts.state != "processing" or where is None or where.address != addr:
        return False
    void = getattr(sched, "_shoal_void", None)
    if void is None:
        void = {}
        sched._shoal_void = void
    for rid in rids:
        void[(key, rid)] = True
    while len(void) > VOID_KEEP:
        del void[next(iter(void))]
    return True


QUEUED = frozenset(("queued", "no-worker"))  # ready to run, and no dask worker has room for it


def load(dask_scheduler=None):
    """What the elastic pilot's scaler reads (scaling.py): the keys of tasks that are ready
    and wait for a dask worker, and per dask worker (by name, which is its batch job's name
    under dask-jobqueue) how many tasks it is processing.

    Waiting: those the scheduler holds (``QUEUED``), and those sent to a worker that is not
    running them: tasks with ``resources=`` (an ensemble's) skip the scheduler's queue and
    all go to the one worker there is, beyond its threads.  A worker runs what its last
    heartbeat said it executes, plus its seceded tasks; until a heartbeat says so, as many as
    it has threads (the smallest keys, so a task's age is read on the same key each time)."""
    sched = dask_scheduler
    waiting = [str(key) for key, ts in sched.tasks.items() if ts.state in QUEUED]
    busy = {}
    for ws in sched.workers.values():
        processing = sorted(str(ts.key) for ts in ws.processing)
        busy[str(ws.name)] = len(processing)
        running = {str(ts.key) for ts in getattr(ws, "executing", {})}
        running |= {str(ts.key) for ts in getattr(ws, "long_running", ())}
        idle = [k for k in processing if k not in running]
        room = max(0, int(ws.nthreads) - (len(processing) - len(idle)))
        waiting += idle[room:]
    return {"waiting": waiting, "busy": busy}
