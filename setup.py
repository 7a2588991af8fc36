"""Build hook for the optional native ring helper.

The extension gives C11 atomics (acquire/release, seq_cst fences) for the
shared-memory rings.  It is optional: without a C compiler the pure-Python
fallback in shoal.queues is used (correct on x86-64; see shoal/queues/DESIGN.md).
The ensemble's spawn helper is optional too (without it: subprocess.Popen, slower;
shoal/patterns/ensemble/spawn.py), and so is the search's ticker (without it the count
loop counts down to its polls at every node, ~4-7% slower on N-Queens; shoal/_tick.py).
Optional means a failed compile is silent here: tests/patterns/test_search_ticked.py
fails when the ring helper was built and the ticker was not.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shoal.queues._native",
            ["shoal/queues/_native.c"],
            extra_compile_args=["-O2", "-std=c11"],
            optional=True,
        ),
        Extension(  # a periodic pending call without the GIL (shoal/_tick.py)
            "shoal._ticker",
            ["shoal/_ticker.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # vfork + exec + a short wait without the GIL (ensemble/spawn.py)
            "shoal.patterns.ensemble._spawn",
            ["shoal/patterns/ensemble/_spawn.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
