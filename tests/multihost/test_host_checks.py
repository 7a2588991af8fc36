"""Host-local handles and the dask pilot's liveness policy, without a test bed (default run):
a SharedArray handle unpickled on another host (its recorded hostname differs) fails on use
with both host names, and never at unpickling (dask unpickles task arguments in its comms,
where an exception takes the whole dask worker down: every worker the task was retried on
died, one after the other, on the test bed); ``liveness.silent``; WorkerLost's host."""

from __future__ import annotations

import pickle
import socket

import pytest

import shoal
from shoal.backends.dask import errors, liveness
from shoal.runtime import shared


def test_a_handle_from_another_host_unpickles_and_fails_on_use_naming_both_hosts():
    with shoal.SharedArray((4,), fill=2.0) as arr:
        pid, fd = arr._origin
        there = shared._attach(arr._token, pid, fd, (4,), "<f8", "far-host")
        with pytest.raises(OSError, match=rf"made on host 'far-host'.*task on host '{socket.gethostname()}'"):
            there.array  # noqa: B018
        there.close()  # nothing to release
        back = pickle.loads(pickle.dumps(there))  # still names its home host
        with pytest.raises(OSError, match="far-host"):
            back.array  # noqa: B018


def test_a_handle_on_its_own_host_maps_the_same_memory():
    with shoal.SharedArray((4,), fill=2.0) as arr:
        copy = pickle.loads(pickle.dumps(arr))  # same process: the same pages
        assert copy.array.tolist() == [2.0] * 4


def test_silent_workers_policy():
    seen = {"a": 100.0, "b": 69.0, "c": 70.5}
    assert liveness.silent(seen, now=100.0, after_s=30.0) == ["b"]
    assert liveness.silent(seen, now=100.0, after_s=40.0) == []
    assert liveness.period(30.0) == 7.5 and liveness.period(1.0) == liveness.MIN_EVERY_S


@pytest.mark.parametrize("bad", [0, -1, True, "30"])
def test_silent_after_s_is_checked(bad):
    with pytest.raises((ValueError, TypeError), match="silent_after_s"):
        liveness.LivenessWatch(None, bad)


def test_worker_lost_names_the_host():
    class WS:
        address, name, host = "tcp://198.18.0.13:4711", "h3", "198.18.0.13"

    class Killed(Exception):
        last_worker = WS()

    assert errors.last_worker(Killed()) == "dask worker h3 at tcp://198.18.0.13:4711 (host 198.18.0.13)"
