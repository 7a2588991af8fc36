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


def locate(keys, claimed, client, dask_scheduler=None):
    """For each of ``keys``: TAKEN (cancelled now, atomically), STARTED, MISSING, or the
    address of the dask worker it is processing on (whose claims decide); and under
    ``WORKERS`` every connected worker's address.  ``claimed``: ``{key: [addresses]}`` of
    the workers that have taken a key back (a tombstone or the node queue's own cancel);
    such a key is cancelled if it is still on one of them, or in memory there (its value
    is the refusal), and asked again where it moved to otherwise."""
    sched = dask_scheduler
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
