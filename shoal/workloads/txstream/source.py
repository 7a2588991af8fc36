"""Event files: JSON lines or msgpack, read lazily (constant memory however long the file).

A record is ``{"fn": "package.module:function", "ev": <plain data>}``; with
``read_events(path, fn=f)`` records are the bare ``ev`` payloads.  The format
follows the extension (``.jsonl``/``.json``/``.ndjson`` or ``.msgpack``/
``.mpk``/``.msgpack.gz`` is not supported) or ``format=``.  Functions are
resolved once per name with importlib: a file names code, it does not carry it
(no pickle).  Reading one still imports the modules it names and calls the named
functions with ``(txn, ev)``: read files whose writers you trust to name functions,
or pass ``fn=`` (then no name in the file is resolved).  Names with a part that starts
with ``__`` are refused (``mod:__class__.__subclasses__`` and the like reach far past
the module's functions); ``__main__`` as the module is allowed.
"""

from __future__ import annotations

import importlib
import json
import os

from .txn import Event

_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".msgpack": "msgpack",
            ".mpk": "msgpack"}


def _format(path, format):
    if format is not None:
        if format not in ("jsonl", "msgpack"):
            raise ValueError(f"format must be 'jsonl' or 'msgpack', got {format!r}")
        return format
    ext = os.path.splitext(os.fspath(path))[1].lower()
    try:
        return _FORMATS[ext]
    except KeyError:
        raise ValueError(f"cannot tell the format of {path!r} from its extension; "
                         "pass format='jsonl' or format='msgpack'") from None


def resolve(name: str):
    mod, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"an event's fn must be 'module:function', got {name!r}")
    parts = [*([] if mod == "__main__" else mod.split(".")), *attr.split(".")]
    if not all(part.isidentifier() and not part.startswith("__") for part in parts):
        raise ValueError(f"an event's fn must name a function, 'package.module:function' "
                         f"(no part starting with '__'), got {name!r}")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{name!r} is not callable")
    return obj


def fn_name(fn) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def read_events(path, *, fn=None, format: str | None = None):
    """Yield ``Event`` objects from a file, one record at a time."""
    fmt = _format(path, format)
    cache: dict = {}

    def event(rec, where):
        if fn is not None:
            return Event(fn, rec)
        if not isinstance(rec, dict) or "fn" not in rec or "ev" not in rec:
            raise ValueError(f"{path}: {where}: a record must be {{'fn': 'module:function', "
                             f"'ev': ...}} (or pass fn=), got {str(rec)[:80]}")
        f = cache.get(rec["fn"])
        if f is None:
            f = cache[rec["fn"]] = resolve(rec["fn"])
        return Event(f, rec["ev"])

    if fmt == "jsonl":
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except (json.JSONDecodeError, RecursionError) as exc:  # (nested too deep)
                        raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from None
                    yield event(rec, f"line {lineno}")
    else:
        import msgpack

        with open(path, "rb") as f:
            for i, rec in enumerate(msgpack.Unpacker(f, raw=False, strict_map_key=False)):
                yield event(rec, f"record {i}")


def write_events(path, events, *, format: str | None = None) -> int:
    """Write ``Event``s (module-level functions) to a file ``read_events`` reads; returns the count."""
    fmt = _format(path, format)
    n = 0
    if fmt == "jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for fn, ev in events:
                f.write(json.dumps({"fn": fn_name(fn), "ev": ev}) + "\n")
                n += 1
    else:
        import msgpack

        with open(path, "wb") as f:
            pack = msgpack.Packer()
            for fn, ev in events:
                f.write(pack.pack({"fn": fn_name(fn), "ev": ev}))
                n += 1
    return n
