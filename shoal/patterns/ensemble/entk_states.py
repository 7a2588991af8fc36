"""EnTK's state names (``radical.entk.states``), as ``shoal.entk.states``.

The strings EnTK's objects report: ``Pipeline.state`` and ``Task.state`` use these values, so a
script that compares against ``re.states.DONE`` or keys a dict by them works unchanged."""

INITIAL = "DESCRIBED"
SCHEDULING = "SCHEDULING"
SUSPENDED = "SUSPENDED"
SCHEDULED = "SCHEDULED"
SUBMITTING = "SUBMITTING"
COMPLETED = "EXECUTED"
DONE = "DONE"
FAILED = "FAILED"
CANCELED = "CANCELED"
FINAL = [DONE, FAILED, CANCELED]
