"""``shoal run workflow.py`` and ``shoal status run.db``: the ensemble's two subcommands.

Registrars in the style of shoal/cli.py (``add_run(subparsers)``, ``add_status``),
listed in its ``COMMANDS``.  A workflow file is a Python file that defines
``workflow``: a Pipeline, a list or iterable of them, or a function returning
one of those.  It is executed with ``__name__ == "__shoal_workflow__"``, so an
``if __name__ == "__main__":`` block in it does not run.

Exit status of ``shoal run``: 0 every task done (or skipped), 1 some failed,
3 stopped at the walltime (resume to finish), 2 usage error / bad workflow.

``--dask tcp://host:8786`` runs the workflow on a dask pilot connected to that
scheduler (executables run on its nodes; the journal stays here); ``--workers``
is then the number of shoal workers per dask worker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import time

import shoal

from . import parse_walltime, run
from .model import EnsembleError
from .report import Report

EXIT_FAILED, EXIT_DRAINED = 1, 3


def load_workflow(path: str):
    if not os.path.isfile(path):
        raise EnsembleError(f"workflow file {path} does not exist")
    if path.endswith((".yaml", ".yml")):
        from .yamlfile import load_yaml

        return load_yaml(path)
    if not path.endswith(".py"):
        raise EnsembleError(f"workflow file {path}: expected a Python (.py) or YAML (.yaml, .yml) workflow file")
    namespace = runpy.run_path(path, run_name="__shoal_workflow__")
    if "workflow" not in namespace:
        raise EnsembleError(f"{path} defines no 'workflow' (a Pipeline, a list of them, or a function)")
    return namespace["workflow"]


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds + 0.5)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def progress_line(p: dict, width: int = 20) -> str:
    """``[#####.....] 120/400  running 2  failed 1  310.2 tasks/s  ETA 0:01`` (``?`` when unknown)."""
    total, done, failed = p.get("total"), p["done"], p["failed"]
    finished = done + failed + p.get("skipped", 0)
    if total:
        filled = min(width, width * finished // total)
        head = f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{total}"
    else:
        head = f"{finished}/?"
    return (f"{head}  done {done}  running {p['running']}  failed {failed}  "
            f"{p['rate']:.1f} tasks/s  elapsed {_clock(p['elapsed'])}  ETA {_clock(p.get('eta'))}")


class Progress:
    """The ``shoal run`` progress display on ``stream`` (stderr).

    On a terminal: one line redrawn in place (the engine calls at most every
    0.5 s).  Elsewhere (a log file, a pipe): one plain line every ``interval``
    seconds at most, and one at the end.
    """

    def __init__(self, stream, interval: float = 10.0, clock=time.monotonic):
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval
        self.clock = clock
        self.last: float | None = None
        self.drawn = False

    def __call__(self, p: dict) -> None:
        try:
            shoal.publish("ensemble", p)  # for the dashboard of ``shoal run --dashboard``
        except (TypeError, ValueError):
            pass  # a progress display never stops the run
        line = progress_line(p)
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if p.get("final") else ""))
            self.drawn = not p.get("final")
        else:
            now = self.clock()
            if not p.get("final") and self.last is not None and now - self.last < self.interval:
                return
            if self.last is None and not p.get("final"):
                self.last = now  # the first line only after one interval: short runs print one line
                return
            self.last = now
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _run(args: argparse.Namespace) -> int:
    workflow = load_workflow(args.workflow)
    progress = Progress(sys.stderr)
    with contextlib.ExitStack() as stack:
        pilot = None
        if args.dask:
            import shoal

            pilot = stack.enter_context(
                shoal.Pilot(args.workers, backend=shoal.BackendKind.DASK, address=args.dask))
        try:
            report = run(workflow, pilot=pilot, journal=args.journal, resume=args.resume,
                         workers=None if pilot else args.workers, gpus=args.gpus,
                         walltime=parse_walltime(args.walltime), sandbox=args.sandbox, progress=progress)
        finally:
            progress.end()
    print(report)
    if report.drained:
        print(f"stopped at the walltime; finish with: shoal run {args.workflow} --journal {args.journal} --resume")
        return EXIT_DRAINED
    return 0 if report.ok else EXIT_FAILED


def add_run(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run an ensemble workflow file",
        description="Run the Pipelines a workflow.py defines as `workflow`, journaled to an SQLite file.",
    )
    parser.add_argument("workflow", help="a Python file defining `workflow`")
    parser.add_argument("--journal", default="run.db", help="SQLite journal (default run.db)")
    parser.add_argument("--resume", action="store_true", help="finish the run the journal holds")
    parser.add_argument("--workers", type=int, default=None,
                        help="cores to use (default: all usable); with --dask: shoal workers per dask worker")
    parser.add_argument("--dask", default=None, metavar="ADDRESS",
                        help="run on the dask cluster whose scheduler is at ADDRESS (tcp://host:8786)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to hand out via CUDA_VISIBLE_DEVICES")
    parser.add_argument("--walltime", default=None, help="e.g. 90s, 30m, 2h, 1:30:00")
    parser.add_argument("--sandbox", default=None, help="task directories root (default <journal>.sandbox)")
    parser.set_defaults(handler=_run)


def _status(args: argparse.Namespace) -> int:
    report = Report.load(args.journal)
    print(report.table())
    return 0


def add_status(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="print task states recorded in an ensemble journal",
        description="Per-stage task counts and failures from a journal (works while a run writes it).",
    )
    parser.add_argument("journal", help="the run's SQLite journal, e.g. run.db")
    parser.set_defaults(handler=_status)
