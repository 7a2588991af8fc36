"""A simulation-analysis loop whose iteration count is decided at run time.

Each iteration: an ensemble of 4 "simulations" (function tasks here;
executables work the same), then one analysis task.  Stage callbacks
(``post_exec``) carry the values on: the simulation stage's callback builds the
analysis from the simulations' results, and the analysis stage's callback
appends the next iteration until the estimate has converged.
"""

import os
import random
import tempfile

from shoal.ensemble import Pipeline, Stage, Task, run


def simulate(seed, x):
    rng = random.Random(seed)
    return (x + 2.0 / x) / 2 + rng.uniform(-1e-12, 1e-12)  # a noisy Newton step towards sqrt(2)


def analyse(values):
    x = sum(values) / len(values)
    return {"x": x, "converged": abs(x * x - 2) < 1e-9}


def simulations(i, x):
    return Stage([Task(function=simulate, args=(i * 10 + k, x)) for k in range(4)], name=f"sim{i}",
                 post_exec=to_analysis)


def to_analysis(ctx):
    i = ctx.stage_index // 2
    values = [ctx.results[f"loop.sim{i}.t{k}"] for k in range(4)]
    ctx.append(Stage([Task(function=analyse, args=(values,), name="check")], name=f"ana{i}",
                     post_exec=decide))


def decide(ctx):
    i = ctx.stage_index // 2
    out = ctx.results[f"loop.ana{i}.check"]
    if not out["converged"]:
        ctx.append(simulations(i + 1, out["x"]))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        report = run(Pipeline([simulations(0, 1.0)], name="loop"), journal=os.path.join(tmp, "run.db"))
        print("iterations:", len([s for s in report.stages if ".sim" in s]))   # 4
        print("ok:", report.ok)                                                # True
        print(round(report.result("loop.ana3.check")["x"], 6))                 # 1.414214
