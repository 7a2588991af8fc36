"""shoal draws one progress-line format (shoal/patterns/_progress.py ``progress_text``):
the search skeletons' ``progress=``, ``all_pairs.compute``'s terminal line and the
ensemble line of ``shoal run`` all read ``<topic>: <count> <unit>  <rate> <unit>/s
<fields>  elapsed M:SS[  ETA M:SS][ (done|failed)]``, with a bar when there is a total.
Before, the search wrote ``search: 9 nodes, 5 nodes/s, incumbent 3, 0.1 s``, all_pairs
``all_pairs: tiles 3  pairs per s 12``, the ensemble ``[###...] 4/10  done 3 ...``."""

from __future__ import annotations

import functools
import io
import re

import pytest

import shoal
from shoal.ensemble import Pipeline, Stage, Task, run
from shoal.patterns import all_pairs, backtracking, branch_and_bound
from shoal.patterns._progress import State, progress_text
from shoal.patterns.all_pairs import _line as all_pairs_line
from shoal.patterns.ensemble.progress import Progress
from shoal.runtime.progress import BOARD

LINE = re.compile(
    r"^(?P<topic>\w+): (?:\[[#.]{20}\] )?(?P<count>[\d,]+)(?:/(?P<total>[\d,]+|\?))? (?P<unit>\w+)"
    r"  (?P<rate>[\d.,]+) (?P=unit)/s(?:  [a-z][\w ]* [^ ]+)*  elapsed \d+:\d\d(?::\d\d)?"
    r"(?:  ETA (?:\d+:\d\d(?::\d\d)?|\?))?(?: \((?P<state>done|failed)\))?$")


@pytest.fixture(scope="module")
def pilot2():
    with shoal.Pilot(workers=2) as p:
        yield p


def _queens(n, board):
    row, cols, ld, rd = board
    full = (1 << n) - 1
    avail = full & ~(cols | ld | rd) if row < n else 0
    while avail:
        bit = avail & -avail
        avail ^= bit
        yield (row + 1, cols | bit, ((ld | bit) << 1) & full, (rd | bit) >> 1)


def _full(n, board):
    return board[0] == n


def _tree(node):
    return [node + (i,) for i in range(3)] if len(node) < 4 else []


def _value(node):
    return sum(node)


def _bound(node):
    return sum(node) + 2 * (4 - len(node))


def _dist(a, b):
    return float(abs(a - b))


def _square(x):
    return x * x


def test_the_formatter_draws_one_shape():
    assert progress_text("search", 1234567, "nodes", rate=456789.4, fields=(("incumbent", 34),),
                         elapsed=3.2) == "search: 1,234,567 nodes  456,789 nodes/s  incumbent 34  elapsed 0:03"
    line = progress_text("ensemble", 4, "tasks", total=10, rate=2.0, fields=(("running", 2),),
                         elapsed=2.0, eta=3.0, state=State.DONE)
    assert line == "ensemble: [########............] 4/10 tasks  2.0 tasks/s  running 2  elapsed 0:02  ETA 0:03 (done)"
    assert progress_text("ensemble", 4, "tasks", bounded=True, rate=0.5, elapsed=1,
                         eta=None).endswith("4/? tasks  0.5 tasks/s  elapsed 0:01  ETA ?")


def test_search_all_pairs_and_ensemble_lines_share_the_format(pilot2, tmp_path):
    lines = {}
    out = io.StringIO()
    n = backtracking.count(pilot2, (0, 0, 0, 0), functools.partial(_queens, 8),
                           accept=functools.partial(_full, 8), progress=out)
    assert n == 92
    lines["count"] = out.getvalue().splitlines()[-1]
    out = io.StringIO()
    best = branch_and_bound.maximise(pilot2, (), _tree, _value, _bound, progress=out)
    lines["maximise"] = out.getvalue().splitlines()[-1]
    assert f"  incumbent {best.value}  " in lines["maximise"]

    all_pairs.compute(pilot2, list(range(40)), _dist, tile=8)
    lines["all_pairs"] = all_pairs_line(BOARD.records("all_pairs")[-1])

    stream = io.StringIO()
    report = run(Pipeline([Stage([Task(executable="/bin/true") for _ in range(3)]),
                           Stage([Task(function=_square, args=(i,)) for i in range(3)])]),
                 journal=str(tmp_path / "run.db"), progress=Progress(stream))
    assert report.ok
    lines["ensemble"] = stream.getvalue().splitlines()[-1]

    parsed = {k: LINE.match(v) for k, v in lines.items()}
    assert all(parsed.values()), lines
    assert {k: m["topic"] for k, m in parsed.items()} == {
        "count": "search", "maximise": "search", "all_pairs": "all_pairs", "ensemble": "ensemble"}
    assert parsed["count"]["count"] == "2,057" and parsed["count"]["state"] == "done"
    assert parsed["all_pairs"]["count"] == parsed["all_pairs"]["total"] == f"{40 * 41 // 2:,}"
    assert parsed["ensemble"]["count"] == parsed["ensemble"]["total"] == "6"
    assert parsed["ensemble"]["state"] == "done", lines["ensemble"]
