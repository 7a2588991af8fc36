"""Task functions of tests/attack/test_contract_dask.py (imported by name in the dask worker
processes: pytest puts tests/attack on the path, which LocalCluster's workers inherit)."""

from __future__ import annotations

import os
import time


def started(marks: str) -> list[str]:
    """The names ``rt_tasks.marked_gate`` started, in order (one entry per run)."""
    if not os.path.exists(marks):
        return []
    with open(marks) as f:
        return [line.split()[1] for line in f if line.startswith("start ")]


def queued_in_node(token: str, keys: list[str]) -> list[str]:
    """``client.run``: the keys among ``keys`` waiting in this dask worker's node runtime
    (claimed by ``run_task``, a local future no shoal worker started)."""
    from shoal.backends.dask import node

    claims = node._claims.get(token)
    if claims is None:
        return []
    with claims.lock:
        entries = [(k, claims.entries.get(k)) for k in keys]
    return [k for k, e in entries if e is not None and hasattr(e, "running")
            and not e.running() and not e.done()]


def known(keys: list[str], dask_worker=None) -> list[str]:
    """``client.run``: the keys among ``keys`` this dask worker still has a task state for
    (a task whose thread is still inside ``run_task`` keeps one)."""
    return [k for k in keys if k in dask_worker.state.tasks]


def slow_replies(delay_s: float) -> None:
    """``client.run``: this dask worker answers every claim round ``delay_s`` late, after
    it has taken the keys back (a GC pause, a SIGSTOP, a slow link on the reply path)."""
    from shoal.backends.dask import node

    real = getattr(node, "_real_cancel_keys", node.cancel_keys)
    node._real_cancel_keys = real

    def late(*args, **kwargs):
        out = real(*args, **kwargs)
        time.sleep(delay_s)
        return out

    node.cancel_keys = late


def prompt_replies() -> None:
    """``client.run``: undo ``slow_replies``."""
    from shoal.backends.dask import node

    real = getattr(node, "_real_cancel_keys", None)
    if real is not None:
        node.cancel_keys = real


def state_on_scheduler(key: str, dask_scheduler=None) -> str | None:
    """``client.run_on_scheduler``: the scheduler's state of ``key`` (None: unknown)."""
    ts = dask_scheduler.tasks.get(key)
    return None if ts is None else ts.state


def lose_verdicts(wait_s: float, give_ups: bool = True, releases: bool = False) -> None:
    """``client.run``: this dask worker loses the driver's verdicts on the tasks a claim
    round took back here: ``give_ups`` (the driver answered False: run it) are dropped, and
    with ``releases`` a waiting ``run_task`` never sees dask release the key (the driver
    confirmed: cancelled).  A taken task then asks the scheduler after ``wait_s`` past its
    round's deadline (claims.py ``settle_taken``)."""
    from shoal.backends.dask import claims, node

    node.__dict__.setdefault("_real_give_up_round", node.give_up_round)
    node.__dict__.setdefault("_real_executing", node._executing)
    node.__dict__.setdefault("_real_verdict_wait", getattr(claims, "VERDICT_WAIT_S", None))
    claims.VERDICT_WAIT_S = wait_s
    if give_ups:
        node.give_up_round = lambda *args, **kwargs: None
    if releases:
        node._executing = lambda worker, key: True


def keep_verdicts() -> None:
    """``client.run``: undo ``lose_verdicts``."""
    from shoal.backends.dask import claims, node

    for name, attr in (("_real_give_up_round", "give_up_round"), ("_real_executing", "_executing")):
        if name in node.__dict__:
            setattr(node, attr, node.__dict__.pop(name))
    if node.__dict__.get("_real_verdict_wait") is not None:
        claims.VERDICT_WAIT_S = node.__dict__.pop("_real_verdict_wait")
