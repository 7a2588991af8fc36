"""``shoal.ensemble``: Pipeline/Stage/Task workflows of executables and functions on a pilot.

::

    from shoal.ensemble import Pipeline, Stage, Task, run

    report = run([Pipeline([Stage([Task(executable="/bin/echo", arguments=["hi"])])])],
                 journal="run.db")
    print(report)            # counts by state, failures with exit codes and stderr tails

The implementation lives in ``shoal.patterns.ensemble``; docs/ensemble.md has the guide.
"""

from __future__ import annotations

from shoal.patterns.ensemble import (
    DriverState,
    EnsembleError,
    Failure,
    FailureKind,
    Input,
    Pipeline,
    Report,
    Results,
    RunStatus,
    Stage,
    StageContext,
    Staging,
    Task,
    TaskKind,
    TaskState,
    explain,
    parse_walltime,
    run,
)

__all__ = [
    "Task", "Stage", "Pipeline", "run", "Report", "Results", "StageContext", "TaskState",
    "TaskKind", "FailureKind", "Failure", "Staging", "Input", "EnsembleError", "parse_walltime",
    "RunStatus", "DriverState", "explain",
]
