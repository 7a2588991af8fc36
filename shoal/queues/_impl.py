"""Choice between the native helper (``_native``, C11 atomics) and pure Python.

Called once at import: ``NATIVE`` tells whether the C helper is importable and
not disabled by ``SHOAL_PURE=1``.  Objects take ``native=None`` (use the
default), ``True`` (require the helper) or ``False`` (force the fallback), so
tests can run both implementations side by side in one process.
"""
from __future__ import annotations

import os
import platform

try:  # pragma: no cover - depends on the build
    from . import _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None

#: Whether the native helper is built and importable.
NATIVE_AVAILABLE: bool = _native is not None
#: Whether objects use the native helper by default.
NATIVE: bool = NATIVE_AVAILABLE and os.environ.get("SHOAL_PURE", "") not in ("1", "true", "yes")

#: CPUs with total store order: stores are not reordered with stores, loads not
#: with loads, so the pure-Python ring is correct there (see DESIGN.md).
_TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i486", "i586", "i686", "x86"})


def is_tso() -> bool:
    """Whether this CPU is x86 (total store order)."""
    return platform.machine().lower() in _TSO_MACHINES


def resolve(native: bool | None):
    """Return the ``_native`` module to use, or None for the pure fallback."""
    if native is None:
        native = NATIVE
    if not native:
        return None
    if _native is None:
        raise RuntimeError(
            "shoal.queues._native is not built; install a C compiler and reinstall "
            "shoal (pip install -e .), or pass native=False"
        )
    return _native


def check_pure_allowed() -> None:
    """Refuse the pure-Python ring on a weakly ordered CPU (called at Ring creation)."""
    if is_tso() or os.environ.get("SHOAL_UNSAFE_PURE_RINGS", "") == "1":
        return
    raise RuntimeError(
        f"the pure-Python shared-memory ring is only correct on x86 (total store order); "
        f"this CPU is {platform.machine()!r}.  Install a C compiler and reinstall shoal "
        f"(pip install -e .) so shoal.queues._native is built, or set "
        f"SHOAL_UNSAFE_PURE_RINGS=1 to run anyway"
    )
