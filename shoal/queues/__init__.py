"""Lock-free SPSC rings in anonymous shared memory, with parking.

See DESIGN.md for the data flow, layout, memory ordering and the parking
protocol.  ``NATIVE`` tells whether the C helper (``_native``) is in use by
default (set ``SHOAL_PURE=1`` to force the pure-Python fallback).
"""
from ._impl import NATIVE
from .matrix import RingMatrix
from .parking import Doorbell
from .results import EMPTY, Empty, Push
from .ring import Ring
from .segment import Segment

__all__ = ["Ring", "Segment", "Doorbell", "RingMatrix", "Push", "Empty", "EMPTY", "NATIVE"]
