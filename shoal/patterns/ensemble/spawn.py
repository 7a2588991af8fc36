"""Starting one executable with vfork + execve in C: the child sets itself up, no Python in between.

Data flow (one call, on a runner thread; runners.py)::

    argv, envp, sandbox, stdin/stdout/stderr paths
      -> the child (vfork: it borrows the parent's memory until execve): setsid (kill() reaches
         its process group), SIGPIPE and SIGXFSZ back to their defaults (Python ignores them,
         and ignored signals survive exec), fd 0 <- stdin file or /dev/null, fd 1/2 <-
         <sandbox>/stdout|stderr (created, truncated), close every fd >= 3, chdir(sandbox), an
         empty signal mask, execve
      -> pid, or the errno of the step that failed (the exec included: the child stores it in
         the parent's memory before it _exits), raised as OSError
      -> wait up to ``quick_ms`` for the child: a child that exited by then has its group
         killed and is reaped in the same call (``wait4``) -> (pid, wait status, (user s,
         system s, peak RSS KiB)); else (pid, None, None)

All of it is one call into the optional C helper ``_spawn`` (``_spawn.c``, built by setup.py;
its header has the vfork safety rules), which releases the GIL once for the spawn and the quick
wait; the child inherits the calling thread's CPU mask (the runner's pin).

Why: ``subprocess.Popen`` does the same with a Python layer around ``_posixsubprocess``
(an error pipe, fd bookkeeping, 64 signal resets in the child) and costs the spawning
thread ~120-140 us of CPU per ``/bin/true``; the same posix_spawn steps through ctypes
(an earlier version of this module) cost ~75-110 us plus a pidfd round from Python
for the quick wait; glibc's ``posix_spawn`` called from C (an earlier version of ``_spawn.c``) ~55-70 us of the
thread plus ~20 us in the child, which reset all 64 signal handlers one by one (execve resets
the handled ones anyway) and mapped a fresh stack per call; this vfork child ~40 us less per
task, thread and child together (1,000 serial spawns, old and new helper alternating).

Availability: Linux and a C compiler at install time.  Elsewhere ``Spawner.load`` returns None
and the launcher uses ``subprocess.Popen`` (same behaviour, slower);
``SHOAL_ENSEMBLE_POPEN=1`` forces that path (tests, comparisons).

Rejected alternatives: ``os.posix_spawn`` (no chdir action before Python 3.13: it would need
a process-wide ``chdir`` around each spawn, visible to other threads); calling the private
``_posixsubprocess.fork_exec`` (its signature changes between Python versions); ctypes (above:
a third of the runner's CPU per task went to the foreign-call layer); ``clone3`` with
``CLONE_CLEAR_SIGHAND`` (no glibc wrapper: the child would need a hand-made stack switch).
"""

from __future__ import annotations

import os
import sys

try:
    from . import _spawn as _native
except ImportError:  # pragma: no cover - built without a C compiler or an old glibc
    _native = None


class Spawner:
    """``spawn(exe, argv, envp, cwd, stdin, stdout, stderr, quick_ms) -> (pid, wait status | None,
    rusage | None)``; thread-safe.  The status and the rusage (user s, system s, peak RSS KiB)
    are there when the child exited within ``quick_ms`` (its group was killed and it was
    reaped then); None: it runs and the caller reaps it."""

    def __init__(self, null_fd: int):
        self._null = null_fd

    @classmethod
    def load(cls, null_fd: int) -> Spawner | None:
        """A Spawner on the C helper, or None (subprocess.Popen is used then)."""
        if _native is None or os.environ.get("SHOAL_ENSEMBLE_POPEN"):
            return None
        return cls(null_fd)

    def spawn(self, exe: str, argv: list[str], envp: list[bytes], cwd: str, stdin: str | None,
              stdout: str, stderr: str, quick_ms: int = 0) -> tuple[int, int | None, tuple | None]:
        """Start ``exe``.  OSError (errno and the culprit's name) if any step failed."""
        try:
            out = _native.spawn(exe, argv, envp, cwd, stdin, stdout, stderr, self._null, quick_ms)
            return out if len(out) == 3 else (*out, None)  # a helper built before it gave rusage
        except OSError as exc:
            culprit = exe if os.path.isdir(cwd) else cwd  # a step before the exec failed: name the sandbox
            raise OSError(exc.errno, os.strerror(exc.errno), culprit) from None


def _b(text: str) -> bytes:
    """``os.fsencode`` for str, without its Python-level dispatch."""
    return text.encode(_FS_ENCODING, "surrogateescape")


_FS_ENCODING = sys.getfilesystemencoding()


def envp(env: dict[str, str]) -> list[bytes]:
    """``KEY=value`` entries for ``execve``."""
    return [_b(k) + b"=" + _b(v) for k, v in env.items()]
