"""A pipeline of ensembles: each stage is an ensemble of independent tasks; stages run in order.

Stage 1 runs 8 simulations (executables, each writing its own output file),
stage 2 analyses each of them (functions reading the files by reference),
stage 3 reduces the 8 analyses into one value.

Run: python examples/ensemble_pipeline_of_ensembles.py   (journal and sandboxes under a temporary directory)
"""

import os
import tempfile

from shoal.ensemble import Pipeline, Stage, Task, run

N = 8


def energy(path):
    with open(path) as f:
        return sum(int(x) ** 2 for x in f.read().split())


def total(*values):
    return sum(values)


def reduce_stage(ctx):
    """post_exec of the analysis stage: add the reduction once every analysis is known."""
    values = [ctx.results[f"ens.analyse.a{i}"] for i in range(N)]
    ctx.append(Stage([Task(function=total, args=tuple(values), name="sum")], name="reduce"))


def workflow():
    simulate = Stage([Task(executable="/bin/sh", arguments=["-c", f"seq 1 {i + 1} > out.dat"],
                           outputs=["out.dat"], name=f"m{i}") for i in range(N)], name="simulate")
    analyse = Stage([Task(function=energy, args=(f"$ens.simulate.m{i}/out.dat",), name=f"a{i}")
                     for i in range(N)], name="analyse", post_exec=reduce_stage)
    return Pipeline([simulate, analyse], name="ens")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        report = run(workflow(), journal=os.path.join(tmp, "run.db"))
        print(report.done, "tasks done")                  # 17 tasks done
        print("total energy", report.result("ens.reduce.sum"))   # total energy 540
