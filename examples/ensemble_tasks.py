"""Python functions that the YAML examples (examples/ensemble_*.yaml) name as "module:function".

``shoal run`` puts the workflow file's directory first on sys.path, so a
``function: "ensemble_tasks:analyse"`` next to this file imports it (and the
pilot's workers, which inherit sys.path, import it too).
"""


def analyse(path):
    """Sum the integers in a file (the output of a simulation step)."""
    with open(path) as f:
        return sum(int(x) for x in f.read().split())


def square(x):
    return x * x
