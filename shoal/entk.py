"""``shoal.entk``: the RADICAL-EnTK vocabulary on shoal — change one import line to migrate.

::

    from shoal.entk import AppManager, Pipeline, Stage, Task   # was: from radical.entk import ...

    t = Task(); t.executable = "/bin/echo"; t.arguments = ["hi"]
    s = Stage(); s.add_tasks(t)
    p = Pipeline(); p.add_stages(s)
    appman = AppManager(resource_desc={"resource": "local.localhost", "walltime": 10, "cpus": 2})
    appman.workflow = [p]
    appman.run()

Pipeline/Stage/Task are subclasses of ``shoal.ensemble``'s classes with EnTK's identity
(uids at construction, EnTK's names, duplicates allowed) and EnTK's execution (the command
runs in a shell); see entk_model.py.  docs/entk.md is the migration guide.
"""

from __future__ import annotations

from shoal.patterns.ensemble import EnsembleError, Report, TaskState
from shoal.patterns.ensemble import entk_states as states
from shoal.patterns.ensemble.entk import AppManager
from shoal.patterns.ensemble.entk_model import Pipeline, PipelineState, Stage, Task

__all__ = ["AppManager", "Pipeline", "Stage", "Task", "TaskState", "PipelineState", "Report", "EnsembleError",
           "states"]
