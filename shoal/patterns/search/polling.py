"""When a running search task looks up from its loop: the polling protocol.

A task's hot loop (loops.py, bnb.py, shapes.py, ticked.py) spends almost all its time on
the user's nodes; now and then it must *poll*: read Control (control.py) to learn whether
the search stopped, the incumbent improved or a peer is hungry.  Deciding *when* is paid
per node, so it is split into a cheap check and a rarer poll.  Each task's loop (worker
thread only) is in one of these states::

    RUNNING --countdown runs out (every TICK nodes; the recursions of
              shapes.py adapt that window, 1 .. WMAX nodes)----------> CLOCK
    RUNNING --armed: a tick (every TICK_S) or a thief's poke
              (ticked count loop only: no countdown at all)----------> POLL
    CLOCK   --perf_counter() < next_poll--------------------------> RUNNING
    CLOCK   --next_poll passed------------------------------------> POLL
    POLL    --a STOP row of Control, or the StopFlag
              (read every STOP_CELL_EVERY polls)-------------------> UNWIND
    POLL    --otherwise: (several machines, with the StopFlag read)
              top up the balancer's reserve (Explorer.keep_reserve);
              new limits from the incumbent cell; split_decision();
              next_poll = now + POLL_S-----------------------------> RUNNING
    UNWIND  terminal: the loop raises _Stopped; the task reports its nodes and joins

A split happens only in POLL (or at a BUDGET backtrack), so a split always sees the
loop's state whole.  The POLL state's split policy is ``split_decision``: pure, with its
own two counters (``stale``, ``barren``), tested apart from any loop
(tests/patterns/test_search_polling.py)::

    hungry == 0                    -> Split.NONE   (stale := 0)
    barren > 0                     -> Split.WAIT   (barren := barren - 1)
    offered < hungry               -> Split.SPLIT  max(2, hungry - offered) units, stale := 0
    offered >= hungry, stale + 1 < STALE_POLLS -> Split.NONE (stale := stale + 1)
    offered >= hungry, stale + 1 = STALE_POLLS -> Split.POKE one unit, stale := 0

(``offered``: tasks spawned and not yet started on this machine, from Control; ``barren``
is set by the caller after a split that found nothing to ship on a deep stack.)  The
two-unit minimum: the runtime wakes a parked thief when a deque reaches two.

Every value here is read as ``polling.NAME`` at the time of use, so tests may patch
them (``POLL_S = 0``: poll at every countdown; ``TICK = 1``: a countdown of one node).

Alternatives rejected: a clock read per node (dearer than a light node's
countdown); polling on every countdown without the clock (a heavy node's loop would poll
every few nodes, a light one's too rarely); a helper thread setting a flag per poll (a
GIL hand-over each time); the poke alone without a timer (a stopped search would wait for
a thief).
"""

from __future__ import annotations

import enum

POLL_S = 0.0002  # seconds between two reads of Control by a running task (CLOCK -> POLL)
TICK = 16  # nodes between two clock reads (RUNNING -> CLOCK) of the countdown loops
TICK_S = 0.005  # seconds between two ticks arming the ticked count loop (ticked.py)
STOP_CELL_EVERY = 4  # polls between two reads of the stop flag (the cross-machine one)
STALE_POLLS = 8  # polls (~1.6 ms) a hungry worker may leave work on offer before a poke


class Split(enum.Enum):
    """What a poll does about hungry peers (``split_decision``)."""

    NONE = "none"  # nobody hungry, or enough on offer (for now)
    WAIT = "wait"  # the last split found nothing on a deep stack: skip this poll
    SPLIT = "split"  # ship ``want`` units
    POKE = "poke"  # work on offer is not taken: ship one more to wake a thief


def split_decision(hungry: int, offered: int, stale: int, barren: int) -> tuple[Split, int, int, int]:
    """``(action, want, stale, barren)`` for one poll with ``hungry`` idle peers and
    ``offered`` tasks on offer; ``stale``/``barren``: the counters as the previous poll
    left them (see the module docstring's table)."""
    if not hungry:
        return Split.NONE, 0, 0, barren
    if barren:
        return Split.WAIT, 0, stale, barren - 1
    if offered < hungry:
        return Split.SPLIT, max(2, hungry - offered), 0, barren
    stale += 1
    if stale >= STALE_POLLS:
        return Split.POKE, 1, 0, barren
    return Split.NONE, 0, stale, barren
