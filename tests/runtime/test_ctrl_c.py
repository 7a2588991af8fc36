"""Ctrl-C in a driver (issue 35): leaving a Pilot's ``with`` block on KeyboardInterrupt
cancels the pending work and stops the running tasks at once, instead of waiting out the
5-second close grace for tasks that run for minutes (it took ~5 s to leave the block, ~7 s to
exit).  ``close(wait=True)`` inside the block keeps the old behaviour for those who want the
running tasks to finish.

A real driver subprocess in a session of its own, a real SIGINT sent to its process group
(what a terminal's Ctrl-C does: the workers get it too), real worker processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil

from shoal.backends.local.lifecycle import CLOSE_GRACE_S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = r"""
import json, os, signal, sys, time
import shoal

def on_sigint(signum, frame):  # Python's own handler, plus the moment the signal came
    sent.append(time.monotonic())
    raise KeyboardInterrupt

sent = []
signal.signal(signal.SIGINT, on_sigint)
FINISH = sys.argv[1] == "finish"

def nap(path, seconds):
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write("finished\n")
    return seconds

if __name__ == "__main__":
    marks = sys.argv[2]
    futs = []
    try:
        with shoal.Pilot(2) as pilot:
            futs = [pilot.submit(nap, marks, 2.0 if FINISH else 60) for _ in range(6)]
            while sum(f.running() for f in futs) < 2:
                time.sleep(0.01)
            try:  # "ready" inside the try: a SIGINT right after it must land in this handler
                print("ready", flush=True)
                for f in futs:
                    f.result()
            except KeyboardInterrupt:
                if not FINISH:
                    raise
                pilot.close(cancel_pending=True)  # the knob: running tasks finish first
                raise
    except KeyboardInterrupt:
        left = time.monotonic() - sent[0]
        states = ["cancelled" if f.cancelled() else type(f.exception()).__name__ if f.exception()
                  else "done" for f in futs]
        print(json.dumps({"left_s": left, "states": states}), flush=True)
"""


def _drive(tmp_path, mode: str):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    marks = tmp_path / "marks"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH")] if p))
    proc = subprocess.Popen([sys.executable, str(script), mode, str(marks)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        workers = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)  # to the process group, as a terminal's Ctrl-C
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return json.loads(out.strip().splitlines()[-1]), marks, workers


def test_ctrl_c_leaves_the_with_block_at_once_stopping_running_tasks(tmp_path):
    result, marks, workers = _drive(tmp_path, "stop")
    print(f"left the with block {result['left_s']:.2f} s after SIGINT")
    # the two running tasks were stopped, the four pending ones never started
    assert sorted(result["states"]) == ["PilotClosed"] * 2 + ["cancelled"] * 4, result
    assert not marks.exists()
    assert not [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    # it did not wait out the grace a close gives running tasks (the goal is about 1 s; the
    # bound is loose because the machine running the tests may be loaded)
    assert result["left_s"] < CLOSE_GRACE_S, result


def test_close_wait_true_inside_the_block_lets_running_tasks_finish(tmp_path):
    result, marks, _ = _drive(tmp_path, "finish")
    done = result["states"].count("done")
    # the two running tasks finished (a task already handed to a worker's queue may run too);
    # the rest were cancelled, none stopped
    assert done >= 2 and result["states"].count("cancelled") == 6 - done, result
    assert marks.read_text() == "finished\n" * done
