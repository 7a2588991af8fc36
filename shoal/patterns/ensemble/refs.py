"""A task's references, resolved to paths: ``$SHARED/...`` and ``$pipeline.stage.task/path``.

Arguments, stdin, inputs and ``stage_out`` destinations may name the run's shared area
(``$SHARED``, EnTK's ``appman.shared_data``) or a file of an earlier task's sandbox; the
``Refs`` of a run turns them into absolute paths with its ``Launcher`` (which knows the
sandboxes).  The engine (function arguments) and both launches (launch.py: executables'
arguments, stdin and inputs, local or on a dask node) use the same one.
"""

from __future__ import annotations

import os

from .launcher import Launcher
from .model import EMBEDDED_REF_RE, Task, parse_ref


class Refs:
    """Resolves references against one run's sandboxes (thread-safe: reads only)."""

    def __init__(self, launcher: Launcher):
        self.launcher = launcher

    def resolve(self, text: str) -> str:
        """A whole-string reference (an input's source, stdin) -> its path; other text as is."""
        if not text.startswith("$"):
            return text
        if text == "$SHARED" or text.startswith("$SHARED/"):
            return self.launcher.shared + text[len("$SHARED"):]
        return self.launcher.resolve(text, parse_ref(text))

    def resolve_all(self, text: str) -> str:
        """Every ``$p.s.t/path`` inside ``text`` (an executable's argument) -> an absolute path."""
        if "$" not in text:
            return text
        return EMBEDDED_REF_RE.sub(
            lambda m: self.launcher.resolve("", (f"{m[1]}.{m[2]}.{m[3]}", m[4].lstrip("/"))), text)

    def stdin(self, task: Task, sandbox: str | None) -> str | None:
        """The file an executable reads on standard input (relative: in its sandbox), or None."""
        stdin = self.resolve(task.stdin) if task.stdin else None
        if stdin is not None and not os.path.isabs(stdin):
            stdin = os.path.join(sandbox, stdin)
        return stdin

    def shared_outputs(self, pairs):
        """EnTK's ``copy_output_data = ['file > $SHARED/file']``: the destination in the shared area."""
        return [(src, self.resolve(dst)) for src, dst in pairs]


__all__ = ["Refs"]
