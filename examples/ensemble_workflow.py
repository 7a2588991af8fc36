"""A workflow file for the command line:  shoal run examples/ensemble_workflow.py --journal run.db

``shoal run`` executes this file and runs what it calls ``workflow``; after a
crash or a walltime stop, add ``--resume`` to finish without re-running what
completed.  ``shoal status run.db`` prints per-stage counts and failures.
"""

from shoal.ensemble import Pipeline, Stage, Task


def square(x):
    return x * x


def workflow():
    """A pipeline of ensembles: 8 executables, then 8 functions, then one summary."""
    make = Stage([Task(executable="/bin/sh", arguments=["-c", f"echo {i} > n.txt"], outputs=["n.txt"])
                  for i in range(8)], name="make")
    work = Stage([Task(function=square, args=(i,)) for i in range(8)], name="square")
    summary = Stage([Task(executable="/bin/sh", name="cat",
                          arguments=["-c", "cat " + " ".join(f"$p0.make.t{i}/n.txt" for i in range(8))])],
                    name="summary")
    return [Pipeline([make, work, summary])]
