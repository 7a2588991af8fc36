"""``fit(..., checkpoint=path)``: what the file holds, what it belongs to, and what a call trains.

Semantics (the contract of ``Trainer.fit``): ``epochs`` counts the epochs *of
this call*.  The file records the call that wrote it (``epochs`` asked,
``done`` so far) besides the model, the optimizer state and the history:

* the recorded call is **unfinished** (a crash, a SIGKILL, an exception from
  a callback): the next ``fit`` with the checkpoint *continues that call*
  and trains ``epochs - done`` more, so rerunning a killed script ends where
  an uninterrupted one would;
* the recorded call **finished**: the next ``fit`` is a new call and trains
  ``epochs`` more, so ``for _ in range(5): fit(epochs=1, checkpoint=p)`` trains
  five epochs, in one process or in five.

Rejected: ``epochs`` as the total over all calls (a loop of ``epochs=1``
calls would train once, silently: it did), and ``epochs`` per call without
the record of an unfinished call (a rerun after a crash would train the
whole count again).

What it belongs to: the run's fingerprint (model, plan, optimizer, loss,
batch size, shuffle, seed, a hash of the data) and two hashes of parameters:
``start``, those the model had when the checkpoint's first call began, and
``latest``, those it saved.  A model whose parameters are neither (fine-tuning
from ``set_parameters(pretrained)`` with an old checkpoint still there, which
used to discard the pretrained weights silently) is refused unless the call
passes ``resume=True``, which takes the checkpoint's weights.

The file is a checked container (``shoal._durable``): the header (and
its body checksum) is verified before the ``.npz`` body is opened (without
pickle); then every field is validated against the run: the parameter count,
shapes and dtypes, the optimizer's slots, the call's epoch range, the history's
length and numbering, the step.  Writes are atomic through temporaries no
planted link can redirect; one driver at a time holds ``<path>.lock``; the
folder is probed (a test write, the free space one save needs) before the
first epoch.
"""

from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np

import shoal._durable as durable

KIND = "dl.fit"
WHAT = "dl checkpoint"


def parameters_hash(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.view(np.uint8).data)
    return h.hexdigest()


class Saved:
    """What a checkpoint file held, validated: the state to resume and the call it records."""

    __slots__ = ("params", "state", "history", "step", "start", "call_epochs", "call_done")

    def __init__(self, params, state, history, step, start, call_epochs, call_done):
        self.params, self.state, self.history, self.step = params, state, history, step
        self.start, self.call_epochs, self.call_done = start, call_epochs, call_done

    @property
    def finished(self) -> bool:
        return self.call_done >= self.call_epochs


class FitCheckpoint:
    """One ``fit`` call's checkpoint file: checked, locked and probed before the first epoch."""

    def __init__(self, path, fingerprint: dict, need_bytes: int):
        self.path = os.fspath(path)
        self.fingerprint = fingerprint
        durable.check_target(self.path, WHAT)
        self.lock = durable.WriterLock(self.path + ".lock", WHAT, f"{WHAT} {self.path}")
        self.need_bytes = need_bytes

    def open(self) -> None:
        self.lock.acquire()
        try:
            durable.sweep(self.path, self._legacy_tmp)
            durable.probe_writable(self.path, WHAT, self.need_bytes)
        except BaseException:
            self.lock.release()
            raise

    def close(self) -> None:
        self.lock.release()

    def _legacy_tmp(self, name: str) -> int | None:
        """Older shoals' temporaries, ``fit.npz.tmp<pid>`` (63 MiB each, left by SIGKILLs)."""
        stem = os.path.basename(self.path) + ".tmp"
        return int(name[len(stem):]) if name.startswith(stem) and name[len(stem):].isdigit() else None

    # -- writing ---------------------------------------------------------------------------
    def save(self, params, state, history, step: int, start: str, call_epochs: int, call_done: int) -> None:
        arrays = {f"param_{i}": p for i, p in enumerate(params)}
        for j, slot in enumerate(state or []):
            for i, a in enumerate(slot):
                arrays[f"state_{j}_{i}"] = a
        buf = io.BytesIO()
        np.savez(buf, history=np.frombuffer(json.dumps(history).encode(), np.uint8), **arrays)
        belongs = {"fingerprint": self.fingerprint, "start": start, "latest": parameters_hash(params),
                   "call": {"epochs": int(call_epochs), "done": int(call_done)},
                   "epochs_total": len(history), "step": int(step)}
        durable.write_atomic(self.path, durable.pack(KIND, belongs, buf.getbuffer()), WHAT)

    # -- reading ---------------------------------------------------------------------------
    def _bad(self, reason: str) -> ValueError:
        return durable.CheckpointError(f"checkpoint {self.path!r} cannot be read ({reason}); it is "
                                       "damaged or not this run's: restore it, or remove it to start afresh")

    def load(self, model_params: list[np.ndarray], slots: int, resume: bool) -> Saved | None:
        """The validated contents, or None when there is no file yet."""
        blob = durable.read_file(self.path, WHAT)
        if blob is None:
            return None
        try:
            belongs, body = durable.unpack(blob, self.path, KIND, WHAT)
        except durable.CheckpointError as exc:
            raise self._bad(str(exc).split("(", 1)[1].rsplit(")", 1)[0]) from None
        mine = belongs.get("fingerprint")
        if not isinstance(mine, dict):
            raise self._bad("no run fingerprint in its header")
        differ = [k for k in self.fingerprint if mine.get(k) != self.fingerprint[k]]
        if differ:
            raise ValueError(f"checkpoint {self.path!r} was written by a different run: "
                             f"{', '.join(differ)} differ (remove it to start afresh)")
        call, start, latest = belongs.get("call"), belongs.get("start"), belongs.get("latest")
        total, step = belongs.get("epochs_total"), belongs.get("step")
        if not (isinstance(call, dict) and type(call.get("epochs")) is int and type(call.get("done")) is int
                and 1 <= call["done"] <= call["epochs"] <= 1 << 40 and type(total) is int
                and call["done"] <= total <= 1 << 40 and type(step) is int and 0 <= step <= 1 << 62
                and isinstance(start, str) and isinstance(latest, str)):
            raise self._bad(f"its epochs or step are not a position a run reaches ({call!r:.80}, "
                            f"{total!r:.20} epochs, step {step!r:.20})")
        current = parameters_hash(model_params)
        if current not in (start, latest) and not resume:
            raise ValueError(f"checkpoint {self.path!r} was written from other starting parameters than "
                             "the model's (set_parameters, another seed or another model's weights): "
                             "pass resume=True to continue from the checkpoint's weights, or remove it "
                             "(or give another checkpoint path) to train from the model's")
        return self._decode(body, model_params, slots, total, step, start, latest, call)

    def _decode(self, body, model_params, slots, total, step, start, latest, call) -> Saved:
        try:
            z = np.load(io.BytesIO(body), allow_pickle=False)  # a checkpoint runs no code
            data = {k: z[k] for k in z.files}
        except Exception as exc:  # noqa: BLE001 - BadZipFile, ValueError(pickled), EOFError
            raise self._bad(f"its body: {type(exc).__name__}: {exc}") from None
        n = len(model_params)
        want = {"history", *(f"param_{i}" for i in range(n)),
                *(f"state_{j}_{i}" for j in range(slots) for i in range(n))}
        if set(data) != want:
            extra, missing = sorted(set(data) - want)[:4], sorted(want - set(data))[:4]
            raise self._bad(f"it holds other arrays than this model's {n} parameters and "
                            f"{slots} optimizer slots (extra {extra}, missing {missing})")
        params = [data[f"param_{i}"] for i in range(n)]
        for i, (got, ref) in enumerate(zip(params, model_params, strict=True)):
            if got.shape != ref.shape or got.dtype != ref.dtype:
                raise self._bad(f"parameter {i} is {got.shape} {got.dtype}, the model's is "
                                f"{ref.shape} {ref.dtype}")
        state = [[data[f"state_{j}_{i}"] for i in range(n)] for j in range(slots)] or None
        for j, slot in enumerate(state or []):
            for i, (got, ref) in enumerate(zip(slot, model_params, strict=True)):
                if got.shape != ref.shape or got.dtype.kind != "f":
                    raise self._bad(f"optimizer state {j} of parameter {i} is {got.shape} {got.dtype}, "
                                    f"expected {ref.shape} floats")
        if parameters_hash(params) != latest:
            raise self._bad("its parameters are not those its header names")
        try:
            history = json.loads(data["history"].tobytes())
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._bad(f"its history: {exc}") from None
        if not (isinstance(history, list) and len(history) == total
                and all(isinstance(r, dict) and r.get("epoch") == i for i, r in enumerate(history))):
            raise self._bad(f"its history is not {total} epoch records numbered 0..{total - 1}")
        return Saved(params, state, history, step, start, call["epochs"], call["done"])
