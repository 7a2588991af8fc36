"""JSON that every parser accepts: NaN and ±Infinity go out as ``null``.

Python's ``json.dumps`` writes ``NaN``/``Infinity`` by default, which is not JSON:
``JSON.parse`` in a browser throws on it (a page fed by ``/events`` silently stops
updating) and strict parsers (jq, Go, Rust) refuse the whole document.  A number
shoal did not compute itself — a journal cell anyone may have written, a loss that
diverged — can be non-finite, so every JSON shoal hands out (the dashboard's state
and events, ``shoal status --json``) is written through :func:`dumps`.

The fast path is the plain encoder with ``allow_nan=False``; only when it refuses is
the object walked once and each non-finite float replaced.  ``null`` was chosen over
the strings ``"NaN"``/``"Infinity"``: a consumer that expects a number or nothing
keeps working, where a string in a numeric field would break it.  Where a bad value
matters to the reader (a malformed journal row), the producer says so in words
alongside (``RunStatus.malformed``).
"""

from __future__ import annotations

import json
import math

__all__ = ["dumps", "finite"]


def finite(obj):
    """``obj`` with every non-finite float (also as a dict value or list item) as ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj, *, indent: int | None = None, compact: bool = False) -> str:
    """``json.dumps`` that never writes NaN/Infinity; unknown types as ``str()``."""
    seps = (",", ":") if compact else None
    try:
        return json.dumps(obj, default=str, allow_nan=False, indent=indent, separators=seps)
    except ValueError:  # "Out of range float values are not JSON compliant"
        return json.dumps(finite(obj), default=str, allow_nan=False, indent=indent,
                          separators=seps)
