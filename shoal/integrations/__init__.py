"""shoal under other tools: a dask scheduler (``dask_get``, ``Pilot.get``) and a joblib backend.

Each integration uses only the public API (``shoal.Pilot``, its futures) and
imports its tool lazily, so ``import shoal`` never imports dask or joblib.
"""
