"""The functions the workers know: a bounded table of DEFINEs, and quarantined functions.

A function travels to each worker once (a ``DEFINE`` message: id, name, cloudpickle)
and tasks then name it by id (``shoal.runtime.wire``).  This table decides which
functions get an id, keeps the DEFINE messages for replacement workers, and
remembers the functions that may never be sent again.

Rules (what issue 11 found without them):
* **Bounded.** At most ``limit`` functions are defined; later ones travel inline
  with each task.  A lambda or closure (``<`` in its qualname: possibly made per
  call) is defined only when it is submitted a *second* time; ``seen`` remembers
  the last few seen once.  Before, 2,000 lambdas made 2,000 DEFINEs, each sent to
  every worker and to every replacement forever.
* **Quarantine.** A function that killed a worker while being unpickled there
  (its module's import calls ``os._exit``, a segfault in ``__setstate__``) is
  dropped: its DEFINE is not sent to replacements (each one died of it before:
  ~200 deaths in 15 s), its queued tasks fail, and submitting it again fails at
  once with ``SerializationError``.  A worker *SIGKILLed* while loading it counts
  only at the second such death (the first SIGKILL may be a user's or another
  task's force cancel; an OOM kill repeats).  A replacement gets a stand-in DEFINE instead
  (``wire.Unloadable.quarantined``): a task of it stolen from a worker that had
  loaded it fails there with that error (it waited forever for the DEFINE).
* A function's entry keeps it alive, so its ``id()`` is not reused by another.

Owner: the driver; ``define`` and ``quarantine`` run under the backend's lock,
the hot path only reads ``ids`` (a dict lookup).
"""

from __future__ import annotations

from collections import OrderedDict

from .._errors import SerializationError
from . import wire

LIMIT = 4096  # functions defined on the workers at most
SEEN = 256  # lambdas/closures seen once, remembered so a second use defines them


def qualified(fn) -> str:
    """``module.qualname`` of a function, for messages."""
    mod = getattr(fn, "__module__", None)
    name = wire.describe(fn)
    return f"{mod}.{name}" if mod else name


class FunctionTable:
    def __init__(self, limit: int = LIMIT, seen: int = SEEN):
        self.limit = limit
        self.seen_max = seen
        self.ids: dict[int, tuple[int, object]] = {}  # id(fn) -> (fn id, fn kept alive)
        self.seen: OrderedDict = OrderedDict()  # id(fn) -> fn, lambdas seen once
        self.defines: dict[int, bytes] = {}  # fn id -> DEFINE message (for replacements)
        self.quarantined: dict[int, tuple[object, str]] = {}  # id(fn) -> (fn, why)
        self.struck: set[int] = set()  # fn ids a worker was SIGKILLed loading, once
        self.next_id = 1

    def check(self, fn) -> None:
        """Raise the SerializationError of a quarantined function."""
        entry = self.quarantined.get(id(fn)) if self.quarantined else None
        if entry is not None and entry[0] is fn:
            raise SerializationError(entry[1])

    def wants(self, fn) -> bool:
        """Whether ``fn`` (not yet defined) should be defined now (else: send it inline)."""
        self.check(fn)
        if len(self.ids) >= self.limit:
            return False
        if "<" in getattr(fn, "__qualname__", "<"):
            key = id(fn)
            if self.seen.get(key) is not fn:
                self.seen[key] = fn
                if len(self.seen) > self.seen_max:
                    self.seen.popitem(last=False)
                return False
        return True

    def define(self, fn, blob: bytes) -> tuple[int, bytes]:
        """Give ``fn`` an id: (fn id, the DEFINE message to send to every worker)."""
        key = id(fn)
        self.seen.pop(key, None)
        fn_id, self.next_id = self.next_id, self.next_id + 1
        msg = wire.encode_define(fn_id, blob, qualified(fn))
        self.defines[fn_id] = msg
        self.ids[key] = (fn_id, fn)
        return fn_id, msg

    def function_of(self, fn_id: int):
        for fid, fn in list(self.ids.values()):
            if fid == fn_id:
                return fn
        return None

    def strike(self, fn_id: int) -> bool:
        """A worker was SIGKILLed while loading ``fn_id``: True the second time (then
        quarantine it; the first kill may have been somebody else's signal)."""
        if fn_id in self.struck:
            return True
        self.struck.add(fn_id)
        return False

    def quarantine(self, fn_id: int, why) -> str | None:
        """Drop function ``fn_id`` for good; ``why(name)`` says what it did.  Returns the
        message its tasks fail with (None when the id is unknown or already dropped)."""
        self.defines.pop(fn_id, None)
        for key, (fid, fn) in list(self.ids.items()):
            if fid == fn_id:
                del self.ids[key]
                name = qualified(fn)
                message = why(name)
                self.quarantined[key] = (fn, message)
                # Replacements get a stand-in instead: a task of it stolen from a worker
                # that had loaded it must fail there, not wait for this DEFINE forever.
                stub = wire.pickle.dumps(wire.Unloadable.quarantined(name, message))
                self.defines[fn_id] = wire.encode_define(fn_id, stub, name)
                return message
        return None

    def is_quarantined(self, fn) -> bool:
        entry = self.quarantined.get(id(fn)) if self.quarantined else None
        return entry is not None and entry[0] is fn
