"""One meaning of a walltime, for every part of shoal that reads one (leaf module: stdlib only).

A walltime is a number of seconds, ``"90s"``/``"30m"``/``"2h"``/``"1d"``, or a clock in the
forms SLURM's ``--time`` writes: ``"MM:SS"``, ``"HH:MM:SS"``, ``"D-HH"``, ``"D-HH:MM"``,
``"D-HH:MM:SS"``.  With a day in front, the clock starts at hours (SLURM's reading: ``"1-12"``
is a day and 12 hours); without one, a two-part clock is minutes and seconds.  A bare number
is seconds (shoal's unit everywhere), not SLURM's minutes.

Why one module: the ensemble engine (its walltime drain) and the batch-job providers (the
``--time`` they submit, the drain margin) each had their own parser, and they disagreed:
the provider read ``"1-12"`` as a day and 12 *seconds*, so ``Pilot(provider="slurm",
walltime="1-12")`` asked SLURM for 24 hours instead of 36.
"""

from __future__ import annotations

import math
import re

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_HINT = "use seconds, '90s', '30m', '2h', 'MM:SS', 'HH:MM:SS' or 'D-HH:MM:SS'"


def walltime_seconds(walltime) -> float:
    """Seconds in ``walltime`` (the forms are in the module docstring); ValueError naming the
    value otherwise, and for anything not > 0 (NaN and infinity included)."""
    if isinstance(walltime, int | float) and not isinstance(walltime, bool):
        seconds = float(walltime)
    else:
        seconds = _parse_text(str(walltime).strip(), walltime)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"walltime must be > 0 seconds, got walltime={walltime!r}")
    return seconds


def _parse_text(text: str, original) -> float:
    unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text)
    if unit:
        return float(unit[1]) * _UNITS[unit[2]]
    dated = re.fullmatch(r"(\d+)-(\d+(?::\d+){0,2})", text)
    if dated:  # D-HH, D-HH:MM, D-HH:MM:SS: the clock starts at hours
        parts = [int(p) for p in dated[2].split(":")]
        parts += [0] * (3 - len(parts))
        return float(int(dated[1]) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2])
    clock = re.fullmatch(r"\d+(?::\d+){1,2}", text)
    if clock:  # MM:SS or HH:MM:SS
        seconds = 0
        for part in text.split(":"):
            seconds = seconds * 60 + int(part)
        return float(seconds)
    raise ValueError(f"walltime {original!r}: {_HINT}")
