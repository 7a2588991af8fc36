"""The command that finishes an interrupted run, as ``shoal status`` prints it ("finish with:").

``shoal run`` records its own ``shoal run ... --resume`` (commands.resume_command); a run
started by a script (``run()``, EnTK's ``AppManager.run()``) records the script's command
line with ``SHOAL_RESUME=1`` before it (config.RESUME_ENV: the run then resumes without an
edit), or a sentence when the command line does not hold the code.
"""

from __future__ import annotations

import sys


def script_resume_command() -> str:
    """How to finish a run started by a script that calls ``run()`` (or EnTK's
    ``AppManager.run()``): the same command line again with ``SHOAL_RESUME=1``, which makes
    ``run()`` resume the journal instead of refusing it or starting afresh.  ``shoal run``
    passes its own ``shoal run ... --resume`` instead."""
    import shlex

    if not script_can_rerun():
        return NO_COMMAND_TO_REPEAT
    try:
        import psutil

        argv = psutil.Process().cmdline()
    except Exception:  # pragma: no cover - psutil is a dependency
        argv = [sys.executable, *sys.argv]
    return "SHOAL_RESUME=1 " + shlex.join(argv)


# what ``shoal status`` prints after "finish with:" for a driver whose command line does not
# hold its code (`python - < driver.py`, the interactive prompt, a notebook)
NO_COMMAND_TO_REPEAT = ("run the code that started it again with resume=True (or with SHOAL_RESUME=1 "
                        "in its environment); it ran from standard input, a prompt or a notebook, "
                        "so there is no command to repeat")


def script_can_rerun() -> bool:
    """Whether this process's command line runs its code again: not for a script read from
    standard input (``python -``), the interactive prompt or a notebook kernel."""
    if sys.argv[:1] in ([""], ["-"]):  # the prompt (argv ['']), a script on stdin (['-'])
        return False
    return not sys.argv[0].endswith("ipykernel_launcher.py")  # a Jupyter kernel


__all__ = ["script_resume_command", "script_can_rerun", "NO_COMMAND_TO_REPEAT"]
