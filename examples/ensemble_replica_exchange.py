"""Replica exchange: replicas run an MD-like step per stage; between stages neighbours swap states.

Each cycle is one stage with a task per replica; after each cycle a
post_exec callback decides swaps between neighbouring temperatures
(Metropolis criterion, seeded) and appends the next cycle with the
exchanged states.
"""

import math
import os
import random
import tempfile

from shoal.ensemble import Pipeline, Stage, Task, run

TEMPS = [1.0, 1.5, 2.25, 3.4]
CYCLES = 5


def md_step(state, temperature, seed):
    rng = random.Random(seed)
    x = state + rng.gauss(0, math.sqrt(temperature))
    return {"x": x, "energy": x * x}


def cycle(c, states):
    tasks = [Task(function=md_step, args=(states[r], TEMPS[r], c * 100 + r), name=f"r{r}")
             for r in range(len(TEMPS))]
    return Stage(tasks, name=f"c{c}", post_exec=exchange)


def exchange(ctx):
    c = ctx.stage_index
    out = [ctx.results[f"rex.c{c}.r{r}"] for r in range(len(TEMPS))]
    rng = random.Random(c)
    xs = [o["x"] for o in out]
    for r in range(c % 2, len(TEMPS) - 1, 2):  # even/odd neighbour pairs alternate
        delta = (1 / TEMPS[r] - 1 / TEMPS[r + 1]) * (out[r + 1]["energy"] - out[r]["energy"])
        if delta >= 0 or rng.random() < math.exp(delta):
            xs[r], xs[r + 1] = xs[r + 1], xs[r]
    if c + 1 < CYCLES:
        ctx.append(cycle(c + 1, xs))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        report = run(Pipeline([cycle(0, [0.0] * len(TEMPS))], name="rex"), journal=os.path.join(tmp, "run.db"))
        print("cycles:", len(report.stages))                    # 5
        print("tasks:", report.done)                            # 20
