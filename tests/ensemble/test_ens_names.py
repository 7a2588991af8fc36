"""Default names (p<i>, t<i>) against explicit ones (walker.py ``_takes_default``): two tasks or
pipelines may never share a uid, and an explicit name that only looks like a default is fine
when that position has a name of its own."""

from __future__ import annotations

import pytest

from shoal.ensemble import EnsembleError, Pipeline, Stage, Task, run


def _true(name=None):
    return Task(executable="/bin/true", name=name)


@pytest.mark.parametrize("tasks", [
    [_true(), _true(), _true(), _true(), _true("t3")],  # explicit after the unnamed t3
    [_true("t1"), _true()],  # explicit before the unnamed t1
])
def test_an_explicit_task_name_equal_to_an_unnamed_sibling_s_default_is_refused(tmp_path, tasks):
    with pytest.raises(EnsembleError, match="is used twice"):
        run(Pipeline([Stage(tasks)], name="p"), journal=str(tmp_path / "run.db"))


def test_default_looking_names_at_named_positions_are_fine(tmp_path):
    """t0..t7 named explicitly with 'long' inserted at position 5: position 5's default t5 is
    not used (it has a name), so the explicit t5 at position 6 clashes with nothing (the dask
    SIGKILL test's workflow; an earlier version of the check refused it)."""
    tasks = [_true(f"t{i}") for i in range(8)]
    tasks.insert(5, _true("long"))
    pipes = [Pipeline([Stage(tasks)], name="p0"), Pipeline([Stage([_true()])], name="x"),
             Pipeline([Stage([_true()])], name="p1")]  # p1 explicit at position 2; position 1 is named
    report = run(pipes, journal=str(tmp_path / "run.db"))
    assert report.ok and report.done == 11, report


def test_an_explicit_pipeline_name_equal_to_an_unnamed_pipeline_s_default_is_refused(tmp_path):
    with pytest.raises(EnsembleError, match="is used twice"):
        run([Pipeline([Stage([_true()])]), Pipeline([Stage([_true()])], name="p0")],
            journal=str(tmp_path / "run.db"))
