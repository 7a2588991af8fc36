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
"""

from __future__ import annotations

import json
import os

import numpy as np

STATE = "state.npz"


def _atomic_save(path: str, **arrays) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Reading:
    """``with _Reading(file, checkpoint)``: ``np.load`` whose failures (a truncated or
    overwritten file, a missing segment, a wrong field) are one ValueError naming the file
    and the checkpoint, instead of BadZipFile / "contains pickled data" / KeyError."""

    def __init__(self, path: str, checkpoint: str):
        self.path, self.checkpoint = path, checkpoint
        self.z = None

    def __enter__(self):
        try:
            self.z = np.load(self.path)  # allow_pickle=False: a checkpoint file runs no code
        except Exception as exc:  # noqa: BLE001 - BadZipFile, OSError, ValueError(pickled), EOFError
            raise self._error(exc) from None
        return self.z

    def __exit__(self, kind, exc, tb):
        self.z.close()
        if exc is not None and isinstance(exc, (KeyError, ValueError, OSError, EOFError,
                                                json.JSONDecodeError)) and \
                not str(exc).startswith("txstream checkpoint"):
            raise self._error(exc) from None
        return False

    def _error(self, exc: BaseException) -> ValueError:
        return ValueError(f"txstream checkpoint {self.checkpoint!r}: "
                          f"{os.path.basename(self.path)} cannot be read ({type(exc).__name__}: "
                          f"{exc}); it is damaged or not a shoal checkpoint: restore it or use a "
                          "fresh checkpoint path (the run then starts from the stream's start)")


class Checkpoint:
    def __init__(self, path: str, fingerprint: list):
        self.path = os.fspath(path)
        self.fingerprint = fingerprint
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"checkpoint={self.path!r} is a file; a txstream checkpoint is a "
                             "directory (state.npz and one out-*.npz per batch): give a directory path")
        os.makedirs(self.path, exist_ok=True)

    def _seg(self, batch: int) -> str:
        return os.path.join(self.path, f"out-{batch:08d}.npz")

    def commit(self, batch: int, offset: int, flat: np.ndarray, seq0: int, txn_start, vals,
               committed, errors: dict) -> None:
        """Batch ``batch`` (events up to ``offset``) is done: make it durable."""
        _atomic_save(self._seg(batch), seq0=np.int64(seq0), txn_start=txn_start, vals=vals,
                     committed=committed,
                     errors=np.frombuffer(json.dumps({str(k): v for k, v in errors.items()})
                                          .encode(), np.uint8))
        meta = json.dumps({"offset": offset, "batches": batch + 1, "layout": self.fingerprint})
        _atomic_save(os.path.join(self.path, STATE), flat=flat,
                     meta=np.frombuffer(meta.encode(), np.uint8))
        _fsync_dir(self.path)

    def _open(self, path: str) -> _Reading:
        return _Reading(path, self.path)

    def load(self):
        """``None`` (fresh) or ``(flat, offset, batches, segments)``; segments are
        ``(seq0, txn_start, vals, committed, errors)`` in order."""
        state = os.path.join(self.path, STATE)
        if not os.path.exists(state):
            return None
        with self._open(state) as z:
            flat = z["flat"].copy()
            meta = json.loads(z["meta"].tobytes())
            if not isinstance(meta, dict) or not {"offset", "batches", "layout"} <= set(meta):
                raise ValueError(f"its meta record is {meta!r:.80}")
        if meta["layout"] != self.fingerprint:
            raise ValueError(f"checkpoint {self.path!r} was written for tables {meta['layout']}, "
                             f"not {self.fingerprint}: use a fresh checkpoint path")
        segs = []
        for b in range(meta["batches"]):
            with self._open(self._seg(b)) as z:
                errors = {int(k): v for k, v in json.loads(z["errors"].tobytes()).items()}
                segs.append((int(z["seq0"]), z["txn_start"].copy(), z["vals"].copy(),
                             z["committed"].copy(), errors))
        for name in os.listdir(self.path):  # segments of batches that never committed
            if name.startswith("out-") and name.endswith(".npz") and name[4:12].isdigit():
                if int(name[4:12]) >= meta["batches"]:
                    os.unlink(os.path.join(self.path, name))
        return flat, meta["offset"], meta["batches"], segs
