"""The same shoal program on a dask.distributed cluster (here a LocalCluster on this machine).

Run:  python examples/dask_cluster.py [tcp://scheduler:8786]
"""

import sys

from distributed import LocalCluster

import shoal


def fib(n):
    if n < 20:
        return n if n < 2 else fib(n - 1) + fib(n - 2)
    a = shoal.spawn(fib, n - 1)      # stays on this dask worker's node runtime; its workers steal
    return fib(n - 2) + a.result()


def load(i):
    return list(range(i * 1000, (i + 1) * 1000))


def total(xs):
    return sum(xs)


def run(pilot):
    print(pilot.submit(fib, 27).result())                         # 196418
    parts = [pilot.submit(total, pilot.submit(load, i)) for i in range(4)]
    print(pilot.submit(sum, parts).result())                      # 7998000 (resolved on workers)
    print(sum(pilot.map(abs, range(-10**5, 10**5))))              # 10000000000 (batched)
    print(sorted(pilot.stats()["driver"]))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        with shoal.Pilot(backend="dask", address=sys.argv[1]) as pilot:
            run(pilot)
    else:
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
            with shoal.Pilot(backend="dask", cluster=cluster, workers=1) as pilot:
                run(pilot)
