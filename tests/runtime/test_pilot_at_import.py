"""A script that starts a pilot at import time, imported again by the workers to unpickle its
functions (no ``if __name__ == "__main__":`` guard): the workers refuse to start a pilot
while they load a task, so the driver gets a clear error instead of waiting forever.

Before: ``python -c "import script"`` hung (the worker imported the script to
unpickle ``children``, ran its ``main()``, started a pilot of its own inside the worker, and
the driver waited for the task for good).  multiprocessing raises in the same situation."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPTS = {
    "submit": """
        import shoal

        def double(x):
            return 2 * x

        with shoal.Pilot(2) as p:
            print("result", p.submit(double, 21).result())
    """,
    "search": """
        import shoal
        from shoal.patterns import backtracking

        def kids(n):
            return [n + 1, n + 2] if n < 10 else []

        def main():
            with shoal.Pilot(2) as p:
                print("count", backtracking.count(p, 0, kids))

        main()
    """,
}


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_a_script_that_starts_a_pilot_when_imported_fails_clearly(tmp_path, kind):
    (tmp_path / "unguarded.py").write_text(textwrap.dedent(SCRIPTS[kind]))
    try:
        proc = subprocess.run([sys.executable, "-c", "import unguarded"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the driver waited forever for a worker that started a pilot of its own")
    assert proc.returncode != 0, proc.stdout
    assert "shoal.Pilot() was called while a shoal worker was loading" in proc.stderr, proc.stderr
    assert "if __name__ == '__main__':" in proc.stderr


def test_the_same_script_run_as_main_with_a_guard_works(tmp_path):
    """The advice works: the guarded script runs (workers import it without starting a pilot)."""
    body = textwrap.dedent(SCRIPTS["search"]).replace("\nmain()\n", '\nif __name__ == "__main__":\n    main()\n')
    (tmp_path / "guarded.py").write_text(body)
    proc = subprocess.run([sys.executable, "-c", "import runpy; runpy.run_path('guarded.py', run_name='__main__')"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "count " in proc.stdout
