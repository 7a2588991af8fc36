"""``multiprocessing.Manager()`` proxies passed to tasks, as with ``ProcessPoolExecutor``.

A proxy reconnects to the manager's server when it is unpickled and
authenticates with ``multiprocessing.current_process().authkey``; the stdlib's
pool children inherit the parent's key, so shoal's workers must carry the
driver's too.  The reference is ``ProcessPoolExecutor`` run on the same tasks.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing

import pytest

import shoal

# The driver's proxies keep their connections to the manager in a per-thread cache
# (multiprocessing's BaseProxy._address_to_local) that outlives the manager; a few fds remain
# until those proxies are collected, whoever runs the tasks (ProcessPoolExecutor too).
pytestmark = pytest.mark.fd_slack(6)


def append(shared_list, i):
    shared_list.append(i)
    return i


def put(queue, i):
    queue.put(i * i)
    return i


def add_under_lock(lock, counter, n):
    for _ in range(n):
        with lock:
            counter.value += 1
    return n


@pytest.fixture
def manager():
    with multiprocessing.Manager() as m:
        yield m


def _run_all(executor, manager):
    shared_list, queue = manager.list(), manager.Queue()
    lock, counter = manager.Lock(), manager.Value("i", 0)
    list(executor.map(append, [shared_list] * 8, range(8)))
    list(executor.map(put, [queue] * 5, range(5)))
    futs = [executor.submit(add_under_lock, lock, counter, 50) for _ in range(4)]
    cf.wait(futs)
    for f in futs:
        f.result()
    return sorted(shared_list), sorted(queue.get(timeout=10) for _ in range(5)), counter.value


def test_list_queue_and_lock_proxies_work_as_in_process_pool(manager):
    with cf.ProcessPoolExecutor(2) as pool:
        reference = _run_all(pool, manager)
    assert reference == (list(range(8)), [i * i for i in range(5)], 200)
    with shoal.Pilot(2) as pilot:
        assert _run_all(pilot, manager) == reference


def test_a_replaced_worker_carries_the_key_too(manager):
    """A worker started after a death (a replacement) gets the key as the first ones did."""
    import os
    import signal

    shared_list = manager.list()
    with shoal.Pilot(1) as pilot:
        pid = pilot.submit(os.getpid).result()
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):  # the replacement answers with another pid
            if pilot.submit(os.getpid).result() != pid:
                break
        assert pilot.submit(append, shared_list, 7).result() == 7
    assert list(shared_list) == [7]


def test_the_key_is_not_on_the_workers_command_line():
    """The key authenticates to every manager of the driver: it must not be readable by other
    users (a process's argv is world-readable in /proc)."""
    import psutil

    key = multiprocessing.current_process().authkey
    with shoal.Pilot(1) as pilot:
        pid = pilot.submit(__import__("os").getpid).result()
        cmdline = " ".join(psutil.Process(pid).cmdline())
    assert key.hex() not in cmdline and repr(key) not in cmdline
