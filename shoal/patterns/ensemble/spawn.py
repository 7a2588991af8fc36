"""Starting one executable with glibc's ``posix_spawn``: the child sets itself up, no Python in between.

Data flow (one call, on a runner thread; runners.py)::

    argv, envp, sandbox, stdin/stdout/stderr paths
      -> file actions: fd 0 <- stdin file or /dev/null, fd 1/2 <- <sandbox>/stdout|stderr
         (created, truncated), close every fd >= 3, chdir(sandbox)
      -> attributes: new session (setsid: kill() reaches its process group), SIGPIPE and
         SIGXFSZ back to their defaults (Python ignores them, and ignored signals survive
         exec), an empty signal mask
      -> posix_spawn -> pid, or the errno of the step that failed (exec included: glibc's
         clone(CLONE_VFORK) reports it), raised as OSError

Why: ``subprocess.Popen`` does the same with a Python layer around ``_posixsubprocess``
(an error pipe, fd bookkeeping, 64 signal resets in the child) and costs the spawning
thread ~120-140 us of CPU per ``/bin/true`` against ~85-100 us here (1,000 serial spawns,
same run); the ctypes call releases the GIL while the child execs, so the driver's loop
keeps running.  The child
inherits the calling thread's CPU mask (the runner's pin).

Availability: glibc >= 2.34 (``addchdir_np``, ``addclosefrom_np``).  Elsewhere ``Spawner``
is None and the launcher uses ``subprocess.Popen`` (same behaviour, slower).

Rejected alternatives: ``os.posix_spawn`` (no chdir action before Python 3.13: it would need
a process-wide ``chdir`` around each spawn, visible to other threads); calling the private
``_posixsubprocess.fork_exec`` (its signature changes between Python versions).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

_SETSIGDEF, _SETSIGMASK, _SETSID = 0x04, 0x08, 0x80  # glibc's <spawn.h>
_BUF = 1024  # bytes for one posix_spawn_file_actions_t / posix_spawnattr_t / sigset_t (glibc: 80/336/128)


class Spawner:
    """``spawn(exe, argv, envp, cwd, stdin, stdout, stderr) -> pid``; thread-safe."""

    def __init__(self, libc: ctypes.CDLL, null_fd: int):
        self._c = libc
        self._null = null_fd
        self._local = threading.local()  # one attribute object per thread, built once

    @classmethod
    def load(cls, null_fd: int) -> Spawner | None:
        """A Spawner on this platform's glibc, or None (Popen is used then)."""
        if os.environ.get("SHOAL_ENSEMBLE_POPEN"):  # a way back to Popen, for comparisons
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            for name in ("posix_spawn", "posix_spawn_file_actions_init", "posix_spawn_file_actions_destroy",
                         "posix_spawn_file_actions_addopen", "posix_spawn_file_actions_adddup2",
                         "posix_spawn_file_actions_addchdir_np", "posix_spawn_file_actions_addclosefrom_np",
                         "posix_spawnattr_init", "posix_spawnattr_setflags", "posix_spawnattr_setsigdefault",
                         "posix_spawnattr_setsigmask", "sigemptyset", "sigaddset"):
                getattr(libc, name)
        except (OSError, AttributeError):
            return None
        c_void_p, c_char_p, c_int = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        libc.posix_spawn.argtypes = [ctypes.POINTER(ctypes.c_int), c_char_p, c_void_p, c_void_p,
                                     c_void_p, c_void_p]
        libc.posix_spawn_file_actions_addopen.argtypes = [c_void_p, c_int, c_char_p, c_int, ctypes.c_uint]
        libc.posix_spawn_file_actions_adddup2.argtypes = [c_void_p, c_int, c_int]
        libc.posix_spawn_file_actions_addchdir_np.argtypes = [c_void_p, c_char_p]
        libc.posix_spawn_file_actions_addclosefrom_np.argtypes = [c_void_p, c_int]
        for name in ("posix_spawn_file_actions_init", "posix_spawn_file_actions_destroy", "posix_spawnattr_init",
                     "sigemptyset"):
            getattr(libc, name).argtypes = [c_void_p]
        libc.posix_spawnattr_setflags.argtypes = [c_void_p, ctypes.c_short]
        libc.posix_spawnattr_setsigdefault.argtypes = [c_void_p, c_void_p]
        libc.posix_spawnattr_setsigmask.argtypes = [c_void_p, c_void_p]
        libc.sigaddset.argtypes = [c_void_p, c_int]
        return cls(libc, null_fd)

    def _attr(self):
        attr = getattr(self._local, "attr", None)
        if attr is None:
            c = self._c
            attr = ctypes.create_string_buffer(_BUF)
            default, mask = ctypes.create_string_buffer(_BUF), ctypes.create_string_buffer(_BUF)
            _check(c.posix_spawnattr_init(attr))
            _check(c.sigemptyset(default))
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                _check(c.sigaddset(default, int(sig)))
            _check(c.sigemptyset(mask))
            _check(c.posix_spawnattr_setsigdefault(attr, default))
            _check(c.posix_spawnattr_setsigmask(attr, mask))
            _check(c.posix_spawnattr_setflags(attr, _SETSID | _SETSIGDEF | _SETSIGMASK))
            self._local.attr = attr
        return attr

    def spawn(self, exe: str, argv: list[str], envp: list[bytes], cwd: str, stdin: str | None,
              stdout: str, stderr: str) -> int:
        """Start ``exe``; its pid.  OSError (errno and the culprit's name) if any step failed."""
        c = self._c
        fa = ctypes.create_string_buffer(_BUF)
        _check(c.posix_spawn_file_actions_init(fa))
        try:
            wflags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            if stdin is None:
                _check(c.posix_spawn_file_actions_adddup2(fa, self._null, 0))
            else:
                _check(c.posix_spawn_file_actions_addopen(fa, 0, _b(stdin), os.O_RDONLY, 0))
            _check(c.posix_spawn_file_actions_addopen(fa, 1, _b(stdout), wflags, 0o644))
            _check(c.posix_spawn_file_actions_addopen(fa, 2, _b(stderr), wflags, 0o644))
            _check(c.posix_spawn_file_actions_addclosefrom_np(fa, 3))
            _check(c.posix_spawn_file_actions_addchdir_np(fa, _b(cwd)))
            args = (ctypes.c_char_p * (len(argv) + 1))(*[_b(a) for a in argv], None)
            env = (ctypes.c_char_p * (len(envp) + 1))(*envp, None)
            pid = ctypes.c_int(0)
            err = c.posix_spawn(ctypes.byref(pid), _b(exe), fa, self._attr(), args, env)
        finally:
            c.posix_spawn_file_actions_destroy(fa)
        if err:
            culprit = exe if os.path.isdir(cwd) else cwd  # a step before the exec failed: name the sandbox
            raise OSError(err, os.strerror(err), culprit)
        return pid.value


def _b(text: str) -> bytes:
    """``os.fsencode`` for str, without its Python-level dispatch (called ~10 times a spawn)."""
    return text.encode(_FS_ENCODING, "surrogateescape")


_FS_ENCODING = sys.getfilesystemencoding()


def _check(rc: int) -> None:
    if rc:
        raise OSError(rc, os.strerror(rc))


def envp(env: dict[str, str]) -> list[bytes]:
    """``KEY=value`` entries for ``execve``."""
    return [_b(k) + b"=" + _b(v) for k, v in env.items()]
