"""Starting, closing and leaking: pilots must leave nothing behind, whatever happens.

close() waiting for the work, close(cancel_pending=True) and an exception in the ``with``
body are tested on every backend in tests/conformance/test_executor_conformance.py."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import psutil
import pytest
import rt_tasks as t
from conftest import run_script

import shoal


def test_bad_worker_counts():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="workers"):
            shoal.Pilot(workers=bad)
    with pytest.raises(TypeError, match="workers"):
        shoal.Pilot(workers="2")
    with pytest.raises(ValueError, match="backend"):
        shoal.Pilot(backend="nope")


def test_default_workers_follow_usable_cpus():
    with shoal.Pilot() as pilot:
        assert pilot.workers == len(shoal.topology().usable_cpus)
        assert pilot.submit(t.inc, 1).result(30) == 2


def test_synthetic_topology_pins_and_groups():
    with shoal.Pilot(workers=4, topology="2x2") as pilot:
        infos = {pilot.submit(t.where).result(30).id: None for _ in range(1)}
        assert infos
        nodes = sorted((w["worker"], w["node"]) for w in pilot.stats()["workers"])
        assert nodes == [(1, 0), (2, 0), (3, 1), (4, 1)]


def test_functions_defined_in_main_script():
    code = textwrap.dedent("""
        import shoal
        def square(x):
            return x * x
        if __name__ == "__main__":
            with shoal.Pilot(workers=2) as p:
                print(p.submit(square, 7).result(30), sum(p.map(lambda x: x + 1, range(10))))
    """)
    out = run_script(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["49", "55"]


def test_main_classes_as_arguments_and_results():
    code = textwrap.dedent("""
        import shoal
        from dataclasses import dataclass
        @dataclass
        class Point:
            x: int
            y: int
        def norm1(p):
            return Point(abs(p.x), abs(p.y))
        if __name__ == "__main__":
            with shoal.Pilot(workers=2) as p:
                print(p.submit(norm1, Point(-3, 4)).result(30))
    """)
    out = run_script(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Point(x=3, y=4)"


def test_driver_with_threads_running():
    """Works while the driver runs other threads (e.g. a dask Client's event loop)."""
    import threading

    stop = threading.Event()
    spinners = [threading.Thread(target=lambda: [time.sleep(0.001) for _ in iter(stop.is_set, True)])
                for _ in range(3)]
    for s in spinners:
        s.start()
    try:
        with shoal.Pilot(workers=2) as pilot:
            assert sum(pilot.map(t.inc, range(1000))) == sum(range(1, 1001))
    finally:
        stop.set()
        for s in spinners:
            s.join()


def test_with_dask_client_in_driver():
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address="127.0.0.1:0") as client:
        assert client.submit(lambda: 1).result() == 1
        with shoal.Pilot(workers=2) as pilot:
            assert pilot.submit(t.inc, 1).result(30) == 2


def test_idle_pilot_uses_no_cpu():
    with shoal.Pilot(workers=2) as pilot:
        pilot.submit(t.inc, 1).result(30)
        pids = [w["pid"] for w in pilot.stats()["workers"]]
        time.sleep(0.3)  # let workers finish spinning and park
        procs = [psutil.Process(p) for p in pids]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(1.0)
        after = [sum(p.cpu_times()[:2]) for p in procs]
        used = [a - b for a, b in zip(after, before, strict=True)]
        assert all(u < 0.1 for u in used), f"idle workers used {used} CPU seconds in 1 s"


@pytest.mark.no_leak_check
def test_driver_sigkill_leaves_nothing(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    code = textwrap.dedent("""
        import os, sys, time, shoal
        def wpid():
            return os.getpid()
        p = shoal.Pilot(workers=2)
        pids = {p.submit(wpid).result(30) for _ in range(50)}
        p.submit(time.sleep, 60)
        print(" ".join(map(str, pids)), flush=True)
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT)
    shm_before = set(os.listdir("/dev/shm"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert pids, "the script printed no worker pids"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
            time.sleep(0.05)
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        assert not alive, f"workers {alive} outlived their SIGKILLed driver"
        new = {n for n in set(os.listdir("/dev/shm")) - shm_before if not n.startswith("sem.")}
        assert new == set(), "segments left in /dev/shm"  # (sem.* belong to other processes' locks)
    finally:
        proc.kill()
        proc.stdout.close()



def test_a_closed_pilot_does_not_close_fds_in_later_forked_children():
    """A closed pilot still referenced (so still in the at-fork registry) closed its old
    lifeline fd number again in every later forked child.  ``subprocess`` runs the at-fork
    hooks in its child when given a ``preexec_fn``; when that number was the child's
    stdout pipe by then, the child failed with EBADF before exec ('[Errno 9] Bad file
    descriptor: <cwd>'): an ensemble executable or a shoal CLI run failed at random."""
    pilot = shoal.Pilot(1)
    pilot.submit(abs, -1).result(60)
    stale = pilot._backend.lifeline_w
    pilot.close()
    r, w = os.pipe()
    os.dup2(w, stale)  # someone else's file has that number now
    try:
        pid = os.fork()
        if pid == 0:  # the at-fork hooks ran: is the number still open?
            try:
                os.fstat(stale)
                os._exit(0)
            except OSError:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's copy of another file was closed"
    finally:
        for fd in (r, w, stale):
            os.close(fd)
    del pilot
