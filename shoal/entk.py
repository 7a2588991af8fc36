"""``shoal.entk``: the RADICAL-EnTK vocabulary on shoal — change one import line to migrate.

::

    from shoal.entk import AppManager, Pipeline, Stage, Task   # was: from radical.entk import ...

    t = Task(); t.executable = "/bin/echo"; t.arguments = ["hi"]
    s = Stage(); s.add_tasks(t)
    p = Pipeline(); p.add_stages(s)
    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 10, "cpus": 2})
    appman.workflow = [p]
    appman.run()

Pipeline/Stage/Task are ``shoal.ensemble``'s classes (one model, two styles);
docs/entk.md is the migration guide.
"""

from __future__ import annotations

from shoal.patterns.ensemble import EnsembleError, Pipeline, Report, Stage, Task, TaskState
from shoal.patterns.ensemble.entk import AppManager

__all__ = ["AppManager", "Pipeline", "Stage", "Task", "TaskState", "Report", "EnsembleError"]
