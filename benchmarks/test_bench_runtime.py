"""pytest-benchmark suite for the runtime: ``pytest benchmarks/`` (never part of bare ``pytest``).

The default test path is ``tests/``, so these run only when asked for.  Each
benchmark checks its answer, so a broken runtime fails instead of looking fast.
Compare runs with ``pytest benchmarks/ --benchmark-autosave`` and
``pytest-benchmark compare``; for shoal-vs-peer ratios use ``benchmarks/run.py``.

Pilots are module-scoped: worker start-up is not what is measured.
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest

import shoal
from shoal.workloads import fib, nqueens, uts

pytest.importorskip("pytest_benchmark")

N_TINY = 2_000
N_MAP = 20_000


def inc(x):
    return x + 1


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        p.submit(inc, 0).result()
        yield p


@pytest.fixture(scope="module")
def pilot1():
    with shoal.Pilot(workers=1) as p:
        p.submit(inc, 0).result()
        yield p


def test_submit_tiny_tasks(benchmark, pilot2):
    def run():
        return sum(f.result() for f in [pilot2.submit(inc, i) for i in range(N_TINY)])

    assert benchmark.pedantic(run, rounds=5, warmup_rounds=1) == sum(range(1, N_TINY + 1))


def test_submit_tiny_tasks_ppe(benchmark):
    """The peer for test_submit_tiny_tasks, to read the two side by side."""
    with cf.ProcessPoolExecutor(2) as ex:
        list(ex.map(inc, range(8)))

        def run():
            return sum(f.result() for f in [ex.submit(inc, i) for i in range(N_TINY)])

        assert benchmark.pedantic(run, rounds=3) == sum(range(1, N_TINY + 1))


def test_map(benchmark, pilot2):
    assert benchmark.pedantic(lambda: sum(pilot2.map(inc, range(N_MAP))), rounds=5,
                              warmup_rounds=1) == sum(range(1, N_MAP + 1))


def test_nested_spawn_overhead(benchmark, pilot1):
    """2,000 empty children spawned and joined inside one task, on 1 worker."""
    assert benchmark.pedantic(lambda: fib.empty_tree(pilot1, 2_000), rounds=10,
                              warmup_rounds=1) == 2_000


def test_uts_t3xs_sequential(benchmark):
    assert benchmark.pedantic(lambda: uts.count_sequential(uts.T3XS), rounds=3) == \
        uts.DERIVED["T3XS"].nodes


def test_uts_t3xs_parallel(benchmark, pilot2):
    assert benchmark.pedantic(lambda: uts.count_parallel(pilot2, uts.T3XS, cutoff=1024),
                              rounds=5, warmup_rounds=1) == uts.DERIVED["T3XS"].nodes


def test_nqueens_10_parallel(benchmark, pilot2):
    assert benchmark.pedantic(lambda: nqueens.count_parallel(pilot2, 10, spawn_depth=2),
                              rounds=5, warmup_rounds=1) == 724


def test_fib_24_parallel(benchmark, pilot2):
    assert benchmark.pedantic(lambda: fib.fib_parallel(pilot2, 24, cutoff=16), rounds=5,
                              warmup_rounds=1) == fib.fib_value(24)
