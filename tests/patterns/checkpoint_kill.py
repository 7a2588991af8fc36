"""The SIGKILL-and-resume procedure shared by the local and dask checkpoint tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(HERE, "checkpoint_driver.py")


def _start(args: list, env_extra: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH")] if p)
    env.update(env_extra or {})
    return subprocess.Popen([sys.executable, DRIVER, *map(str, args)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _wait_saves(proc, ck: str, saves: int, timeout: float) -> None:
    """Until the checkpoint has been written ``saves`` times (mtime changes) or ``proc`` ends."""
    seen, last = 0, None
    deadline = time.monotonic() + timeout
    while seen < saves:
        if proc.poll() is not None:
            raise AssertionError(f"the driver ended before it was killed (rc {proc.returncode}, "
                                 f"{seen} checkpoints seen): {proc.stdout.read().decode()[-2000:]}"
                                 " -- make the search bigger")
        if time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint at {ck} after {timeout} s")
        try:
            m = os.stat(ck).st_mtime_ns
        except FileNotFoundError:
            m = None
        if m is not None and m != last:
            seen, last = seen + 1, m
        time.sleep(0.01)


def kill_after_saves(proc, ck: str, saves: int, timeout: float) -> list:
    """SIGKILL the driver ``proc`` (and nothing else) once it has written ``ckpt`` ``saves``
    times; the processes that were below it (to check that they die with it)."""
    try:
        _wait_saves(proc, ck, saves, timeout)
        below = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return below


def kill_and_resume(tmp_path, app: str, size: int, address: str = "-", extra=(),
                    saves: int = 3, timeout: float = 300) -> dict:
    """Run the driver, SIGKILL it after ``saves`` checkpoints, check its shoal workers die
    with it, run it again to the end; the second run's result (asserting it resumed)."""
    ck, out = str(tmp_path / f"{app}.ckpt"), str(tmp_path / f"{app}.json")
    first = _start([app, size, ck, out, address, *extra])
    below = kill_after_saves(first, ck, saves, timeout)
    assert first.returncode == -signal.SIGKILL
    assert not os.path.exists(out), "the killed run finished before the kill"
    assert os.path.exists(ck)
    _, alive = psutil.wait_procs(below, timeout=20)
    assert not alive, f"processes outlived the killed driver: {alive}"
    second = _start([app, size, ck, out, address, *extra])
    try:
        output, _ = second.communicate(timeout=timeout)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert second.returncode == 0, output.decode()[-3000:]
    with open(out) as f:
        res = json.load(f)
    assert res["resumed"] and not res["checkpoint_left"]
    return res
