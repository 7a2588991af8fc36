"""Durable progress: the store and the stream offset, committed at each punctuation.

Layout of the checkpoint directory::

    state.npz          the store (flat int64), offset, batches, layout fingerprint
    out-00000007.npz   batch 7's outputs: txn_start, vals, committed, errors

Commit protocol (one batch): write the batch's output segment (temp file,
fsync, rename), then the state (temp file, fsync, rename, fsync the
directory).  The rename of ``state.npz`` is the commit point.  After a crash
(SIGKILL of the driver anywhere), ``load`` trusts ``state.npz`` and only the
segments it counts; a segment of a batch whose state never landed is
deleted, and that batch is re-run from the stream — its effects were only in
the dead driver's shared memory, so every event takes effect exactly once.
Rejected: a write-ahead log of operations (replaying it needs the UDFs; the
source is replayable anyway) and SQLite (one more moving part for two files).

Every file is a checked container (``shoal._durable``): a header with
the format, what it belongs to (the store's layout; a segment also its batch
number) and the SHA-256 of its body, verified before the body (an ``.npz``
read with ``allow_pickle=False``) is decoded; the body is then validated
against the run (the store's size, the offset, every segment's lengths), so a
damaged or crafted file is one ``ValueError`` naming it.  Writes go through
``durable.write_atomic`` (``O_EXCL|O_NOFOLLOW`` temporaries: a link planted in
the folder is never written through), the folder itself must be a real folder
(``lstat``), and one driver at a time holds ``<checkpoint>/.lock``: a second
one is refused before it touches a file (it used to delete the segment the
first was about to commit).  The folder's writability is checked when the
engine is built, before any event runs.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

import shoal._durable as durable

STATE = "state.npz"
LOCK = ".lock"
KIND_STATE, KIND_SEGMENT = "txstream.state", "txstream.segment"
WHAT = "txstream checkpoint"


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getbuffer()


class Checkpoint:
    """One engine's checkpoint folder; ``lock`` .. ``unlock`` bracket a run."""

    def __init__(self, path, fingerprint: list):
        self.path = os.fspath(path)
        self.fingerprint = fingerprint
        self.size = sum(int(size) for _, _, size in fingerprint)
        try:
            exists = durable.check_target(self.path, WHAT, directory=True)
        except durable.DurableIOError as exc:
            if os.path.isfile(self.path) and not os.path.islink(self.path):
                raise ValueError(f"checkpoint={self.path!r} is a file; a txstream checkpoint is a "
                                 "directory (state.npz and one out-*.npz per batch): give a "
                                 "directory path") from None
            raise ValueError(str(exc)) from None
        if not exists:
            try:
                os.mkdir(self.path)
            except FileExistsError:
                durable.check_target(self.path, WHAT, directory=True)
            except OSError as exc:
                raise durable.explain(WHAT, self.path, exc, "creating the folder") from None
        # before any event runs: a read-only or full folder fails here, not at the first commit
        durable.probe_writable(os.path.join(self.path, STATE), WHAT)
        self._lock = durable.WriterLock(os.path.join(self.path, LOCK), WHAT,
                                        f"{WHAT} {self.path}")

    def lock(self) -> None:
        """Hold the folder for this driver (a second live driver is refused, files untouched)."""
        self._lock.acquire()
        durable.sweep_folder(self.path, _legacy_tmp)

    def unlock(self) -> None:
        self._lock.release()

    def _seg(self, batch: int) -> str:
        return os.path.join(self.path, f"out-{batch:08d}.npz")

    def commit(self, batch: int, offset: int, flat: np.ndarray, seq0: int, txn_start, vals,
               committed, errors: dict) -> None:
        """Batch ``batch`` (events up to ``offset``) is done: make it durable."""
        body = _npz(seq0=np.int64(seq0), txn_start=np.asarray(txn_start, np.int64),
                    vals=np.asarray(vals, np.int64), committed=np.asarray(committed, bool),
                    errors=np.frombuffer(json.dumps({str(k): v for k, v in errors.items()}).encode(),
                                         np.uint8))
        seg = self._seg(batch)
        durable.write_atomic(seg, durable.pack(KIND_SEGMENT, {"layout": self.fingerprint, "batch": batch},
                                               body), WHAT)
        meta = {"offset": int(offset), "batches": batch + 1}
        body = _npz(flat=np.asarray(flat, np.int64), meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        durable.write_atomic(os.path.join(self.path, STATE),
                             durable.pack(KIND_STATE, {"layout": self.fingerprint, **meta}, body), WHAT)

    def _body(self, path: str, kind: str):
        blob = durable.read_file(path, WHAT)
        if blob is None:
            raise self._damaged(path, "it is missing")
        try:
            belongs, body = durable.unpack(blob, path, kind, WHAT)
        except durable.CheckpointError as exc:
            raise self._damaged(path, str(exc).split("(", 1)[1].rsplit(")", 1)[0]) from None
        if belongs.get("layout") != self.fingerprint:
            raise ValueError(f"checkpoint {self.path!r} was written for tables {belongs.get('layout')}, "
                             f"not {self.fingerprint}: use a fresh checkpoint path")
        try:
            z = np.load(io.BytesIO(body), allow_pickle=False)  # a checkpoint file runs no code
            return belongs, {k: z[k] for k in z.files}
        except Exception as exc:  # noqa: BLE001 - BadZipFile, ValueError(pickled), EOFError...
            raise self._damaged(path, f"{type(exc).__name__}: {exc}") from None

    def _damaged(self, path: str, reason: str) -> ValueError:
        return ValueError(f"{WHAT} {self.path!r}: {os.path.basename(path)} cannot be read ({reason}); "
                          "it is damaged or not a shoal checkpoint: restore it or use a fresh "
                          "checkpoint path (the run then starts from the stream's start)")

    def load(self):
        """``None`` (fresh) or ``(flat, offset, batches, segments)``; segments are
        ``(seq0, txn_start, vals, committed, errors)`` in order.  Call with the lock held."""
        state = os.path.join(self.path, STATE)
        if not durable.check_target(state, WHAT):
            return None
        belongs, z = self._body(state, KIND_STATE)
        try:
            meta = json.loads(z["meta"].tobytes())
            flat = z["flat"]
            offset, batches = meta["offset"], meta["batches"]
        except (KeyError, ValueError, TypeError) as exc:
            raise self._damaged(state, f"no valid meta record: {exc!r:.80}") from None
        if set(z) != {"flat", "meta"}:
            raise self._damaged(state, f"fields {sorted(z)}, expected flat and meta")
        if not (type(offset) is int and type(batches) is int and 0 <= batches <= offset
                and (offset == 0) == (batches == 0)) or                 (belongs.get("offset"), belongs.get("batches")) != (offset, batches):
            raise self._damaged(state, f"offset {offset!r} after {batches!r} batches is not a "
                                "position a run reaches")
        if flat.dtype != np.int64 or flat.shape != (self.size,):
            raise self._damaged(state, f"a store of shape {flat.shape} {flat.dtype}; this store "
                                f"is ({self.size},) int64")
        segs, seq = [], 0
        for b in range(batches):
            path = self._seg(b)
            head, z = self._body(path, KIND_SEGMENT)
            segs.append(self._segment(path, head, z, b, seq))
            seq += len(segs[-1][3])
        if seq != offset:
            raise self._damaged(state, f"offset {offset} but its segments hold {seq} events")
        for name in os.listdir(self.path):  # segments of batches that never committed
            if name.startswith("out-") and name.endswith(".npz") and name[4:12].isdigit():
                if int(name[4:12]) >= batches:
                    os.unlink(os.path.join(self.path, name))
        return flat.copy(), offset, batches, segs

    def _segment(self, path, head, z, batch: int, seq: int):
        """One segment's fields, validated: (seq0, txn_start, vals, committed, errors)."""
        if head.get("batch") != batch:
            raise self._damaged(path, f"it is batch {head.get('batch')!r}'s segment")
        if set(z) != {"seq0", "txn_start", "vals", "committed", "errors"}:
            raise self._damaged(path, f"fields {sorted(z)}")
        seq0, start, vals, committed = z["seq0"], z["txn_start"], z["vals"], z["committed"]
        n = len(committed) if committed.ndim == 1 else -1
        ok = (seq0.shape == () and seq0.dtype == np.int64 and int(seq0) == seq
              and committed.dtype == bool and n >= 1 and start.dtype == np.int64
              and start.shape == (n + 1,) and vals.dtype == np.int64 and vals.ndim == 1
              and start[0] == 0 and start[-1] == len(vals) and bool(np.all(np.diff(start) >= 0)))
        if not ok:
            raise self._damaged(path, "its arrays are not one batch's outputs (shapes, dtypes, "
                                "offsets or its first event)")
        try:
            errors = {int(k): v for k, v in json.loads(z["errors"].tobytes()).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise self._damaged(path, f"its error record: {exc!r:.80}") from None
        if not all(0 <= k < n and isinstance(v, str) for k, v in errors.items()):
            raise self._damaged(path, "its error record names events outside the batch")
        return int(seq0), start, vals, committed, errors


def _legacy_tmp(name: str) -> int | None:
    """Temporaries of older shoals (``state.npz.tmp``): no pid, never in use at lock time."""
    return 0 if name.endswith(".npz.tmp") else None
