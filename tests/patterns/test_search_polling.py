"""The polling protocol (patterns/search/polling.py): its split policy as a pure state
machine, and a real Explorer's poll following it."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.patterns.search import control as C
from shoal.patterns.search import engine as E
from shoal.patterns.search import model as M
from shoal.patterns.search import polling as P
from shoal.patterns.search.polling import Split, split_decision


@pytest.mark.parametrize(
    "hungry, offered, stale, barren, want",
    [
        (0, 0, 5, 3, (Split.NONE, 0, 0, 3)),  # nobody hungry: stale resets, barren kept
        (2, 0, 5, 3, (Split.WAIT, 0, 5, 2)),  # a barren split on a deep stack: wait it out
        (1, 0, 4, 0, (Split.SPLIT, 2, 0, 0)),  # two at least: a parked thief wakes at two
        (5, 1, 0, 0, (Split.SPLIT, 4, 0, 0)),  # what the hungry lack
        (1, 1, 0, 0, (Split.NONE, 0, 1, 0)),  # enough on offer: count the poll
        (1, 3, P.STALE_POLLS - 1, 0, (Split.POKE, 1, 0, 0)),  # on offer, untaken: poke
    ],
)
def test_the_split_policy_table(hungry, offered, stale, barren, want):
    assert split_decision(hungry, offered, stale, barren) == want


def test_work_left_on_offer_is_poked_after_stale_polls():
    stale, actions = 0, []
    for _ in range(2 * P.STALE_POLLS):
        action, _, stale, _ = split_decision(1, 1, stale, 0)
        actions.append(action)
    pokes = [k for k, a in enumerate(actions) if a is Split.POKE]
    assert pokes == [P.STALE_POLLS - 1, 2 * P.STALE_POLLS - 1]
    assert set(actions) == {Split.NONE, Split.POKE}


def test_a_barren_wait_ends_and_the_next_poll_splits():
    state = (0, 3)  # (stale, barren)
    seen = []
    for _ in range(4):
        action, want, *state = split_decision(2, 0, *state)
        seen.append((action, want))
    assert seen == [(Split.WAIT, 0)] * 3 + [(Split.SPLIT, 2)]


def test_an_explorers_poll_follows_the_protocol(monkeypatch):
    """A real Explorer over a real tree: a poll with a hungry row splits (SPLIT, two
    units); with both units still on offer the next STALE_POLLS - 1 polls split nothing and
    the one after pokes; a STOP row unwinds the loop (UNWIND)."""
    monkeypatch.setattr(P, "POLL_S", 0.0)
    ctl = np.zeros((2, C.CONTROL_COLUMNS), dtype=np.int64)
    spec = M.SearchSpec(root=(), children=lambda n: [n + (i,) for i in range(3)] if len(n) < 4 else [],
                        goal=M.Goal.COUNT, control=None,
                        coordination=M.Coordination.STACK_STEALING)
    ex = E.Explorer(spec, (), ctl, 0, split=True)
    ex.hungry = lambda: 1
    calls = []
    monkeypatch.setattr(E.Explorer, "split_for", lambda self, frontier, want: calls.append(want))
    ex.poll(None)
    assert calls == [2]
    ctl[0, C.SPAWNED] += 2  # what that split put on offer, not taken
    for _ in range(P.STALE_POLLS - 1):
        ex.poll(None)
    assert calls == [2]
    ex.poll(None)
    assert calls == [2, 1]
    ctl[1, C.STOP] = 1
    with pytest.raises(M._Stopped):
        ex.poll(None)
