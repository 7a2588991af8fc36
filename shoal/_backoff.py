"""How long to wait before a retry: ``retry_delay=`` of ensemble tasks and ``Pilot.options``.

Pure: no clock, no I/O; the jitter's randomness comes from a seed the caller passes
(a task's uid and attempt in the ensemble, so a resume waits what the first run would
have), which is what makes the property tests (tests/runtime/test_backoff.py) exact.

A number means a fixed delay (``retry_delay=5``: five seconds before every retry);
``Backoff(base=1, factor=2, cap=60, jitter=0.1)`` means ``base * factor**(attempt-1)``
seconds before retry ``attempt`` (1, 2, 4, ... capped at 60), each stretched by up to
±10% so that many tasks failing together do not retry in lockstep.  The cap holds
after jitter: no delay ever exceeds ``cap``.

Rejected alternatives: a callable ``attempt -> seconds`` (it would have to be pickled
into the journal's spec and shipped to the pump thread; a frozen dataclass is data);
full jitter (uniform in ``[0, delay]``, AWS's advice for contended services): a retry
here is a scientific task rerun after, typically, a node or file-system hiccup, and
a delay of ~0 would defeat the point of waiting; ``jitter`` bounds the spread instead.
"""

from __future__ import annotations

import dataclasses
import math
import random


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``base * factor**(attempt-1)`` seconds, at most ``cap``, each
    delay stretched by a random fraction in ``[-jitter, +jitter]`` (then capped again)."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 60.0
    jitter: float = 0.0

    def __post_init__(self):
        for name, low in (("base", 0.0), ("factor", 1.0), ("cap", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < low:
                raise ValueError(f"Backoff({name}={v!r}): {name} must be a finite number >= {low:g}")
        j = self.jitter
        if isinstance(j, bool) or not isinstance(j, int | float) or not 0.0 <= j < 1.0:
            raise ValueError(f"Backoff(jitter={j!r}): jitter is a fraction in [0, 1), e.g. 0.1 for ±10%")
        if self.cap < self.base:
            raise ValueError(f"Backoff(base={self.base!r}, cap={self.cap!r}): the cap must be >= the base")

    def delay(self, attempt: int, seed=None) -> float:
        """Seconds to wait before retry ``attempt`` (1 = the first retry)."""
        if attempt < 1:
            raise ValueError(f"attempt counts retries from 1, got {attempt!r}")
        try:
            d = min(self.cap, self.base * self.factor ** (attempt - 1))
        except OverflowError:  # factor**(attempt-1) past a float: far past the cap
            d = self.cap
        if self.jitter:
            d *= 1.0 + self.jitter * (2.0 * random.Random(repr((seed, attempt))).random() - 1.0)
        return min(self.cap, max(0.0, d))


RetryDelay = float | int | Backoff | None


def check_retry_delay(value, who: str) -> RetryDelay:
    """``value`` if it is a valid ``retry_delay`` (None, seconds >= 0, or a Backoff); else a
    ValueError naming ``who``."""
    if value is None or isinstance(value, Backoff):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{who}: retry_delay must be seconds >= 0 or shoal.Backoff(base=, factor=, "
                         f"cap=, jitter=), got {value!r}")
    return value


def retry_delay(policy: RetryDelay, attempt: int, seed=None) -> float:
    """Seconds before retry ``attempt`` (1 = the first retry) under ``policy``: 0 for None,
    the number itself for a number, ``Backoff.delay`` for a Backoff."""
    if policy is None:
        return 0.0
    if isinstance(policy, Backoff):
        return policy.delay(attempt, seed)
    return float(policy)
