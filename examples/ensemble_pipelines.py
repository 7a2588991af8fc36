"""An ensemble of pipelines: each pipeline simulates (an executable) then analyses (a function).

Run: python examples/ensemble_pipelines.py   (journal and sandboxes under a temporary directory)
"""

import os
import tempfile

from shoal.ensemble import Pipeline, Stage, Task, run


def analyse(path):
    with open(path) as f:
        return sum(int(x) for x in f.read().split())


def pipeline(k):
    simulate = Task(executable="/bin/sh", name="sim", outputs=["out.dat"],
                    arguments=["-c", f"seq 1 {k + 10} > out.dat"])
    # "$pipeline.stage.task/file" names a file in an earlier task's sandbox
    analysis = Task(function=analyse, name="ana", args=(f"$member{k}.simulate.sim/out.dat",))
    return Pipeline([Stage([simulate], name="simulate"), Stage([analysis], name="analyse")], name=f"member{k}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        report = run([pipeline(k) for k in range(4)], journal=os.path.join(tmp, "run.db"))
        print(report.done, "tasks done")                       # 8
        print(report.result("member2.analyse.ana"))             # 78
