"""``shoal run workflow.py`` and ``shoal status run.db``: the ensemble's two subcommands.

Registrars in the style of shoal/cli.py (``add_run(subparsers)``, ``add_status``),
listed in its ``COMMANDS``.  A workflow file is a YAML file (yamlfile.py) or a
Python file that defines ``workflow``: a Pipeline, a list or iterable of them,
or a function returning one of those; a Python file is executed with
``__name__ == "__shoal_workflow__"``, so an ``if __name__ == "__main__":`` block
in it does not run.

Exit status of ``shoal run``: 0 every task done (or skipped), 1 some failed,
3 stopped at the walltime (resume to finish), 130 stopped by Ctrl-C/SIGTERM
(drained like the walltime: resume to finish), 2 usage error / bad workflow /
journal error.  Every stop with work left prints the exact resume command.

``--dask tcp://host:8786`` runs the workflow on a dask pilot connected to that
scheduler (executables run on its nodes; the journal stays here); ``--workers``
is then the number of shoal workers per dask worker.

``--slurm [--nodes N --cores C --partition P --account A --walltime T]`` (or a
YAML file's ``resource:`` block) runs it in a batch allocation of its own
(resource.py); started inside an allocation (``sbatch``/``salloc``) without
``--walltime``, the run drains before that allocation ends.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import runpy
import shlex
import sys
import time

from ..._json import dumps as json_dumps
from .config import EngineConfig
from .drive import run_workflow
from .model import EnsembleError
from .progress import Progress, progress_callback, progress_line  # noqa: F401 - re-exported
from .report import printable
from .resource_args import add_resource_arguments, resource_from_args

EXIT_FAILED, EXIT_DRAINED, EXIT_INTERRUPTED = 1, 3, 130


def load_workflow(path: str):
    if not os.path.isfile(path):
        raise EnsembleError(f"workflow file {path} does not exist")
    if path.endswith((".yaml", ".yml")):
        from .yamlfile import load_yaml

        return load_yaml(path)
    if not path.endswith(".py"):
        raise EnsembleError(f"workflow file {path}: expected a Python (.py) or YAML (.yaml, .yml) workflow file")
    here = os.path.dirname(os.path.abspath(path))
    if here not in sys.path:  # as `python workflow.py` does: modules beside it import
        sys.path.insert(0, here)
    namespace = runpy.run_path(path, run_name="__shoal_workflow__")
    if "workflow" not in namespace:
        raise EnsembleError(f"{path} defines no 'workflow' (a Pipeline, a list of them, or a function)")
    return namespace["workflow"]


def _whole(least: int):
    """An argparse type: a whole number >= ``least``, or a usage error naming the text."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}")
        return value
    return parse


_positive_int, _count = _whole(1), _whole(0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.1 <= value < math.inf:  # 0 or less would spin (or raise in time.sleep); nan never compares
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0.1, got {text!r}")
    return value


BACKOFF_KEYS = ("base", "factor", "cap", "jitter")


def _retry_delay(text: str):
    """An argparse type: ``--retry-delay 5`` (seconds before every retry) or
    ``--retry-delay base=1,factor=2,cap=60,jitter=0.1`` (exponential backoff, shoal.Backoff;
    any of the keys, the others at their defaults)."""
    from shoal._backoff import Backoff

    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not 0 <= seconds < math.inf:
            raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
        return seconds
    fields = {}
    for part in text.split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or key not in BACKOFF_KEYS:
            raise argparse.ArgumentTypeError(
                f"expected seconds (5) or backoff fields ({','.join(k + '=...' for k in BACKOFF_KEYS)}), "
                f"got {text!r}")
        try:
            fields[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}={value!r} in {text!r} is not a number") from None
    try:
        return Backoff(**fields)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _retry_delay_text(delay) -> str:
    """``--retry-delay``'s text for ``delay``: what ``_retry_delay`` reads back as the same value."""
    def number(v) -> str:
        short = f"{v:g}"
        return short if float(short) == v else repr(float(v))

    if isinstance(delay, int | float):
        return number(delay)
    return ",".join(f"{k}={number(getattr(delay, k))}" for k in BACKOFF_KEYS)


def resume_command(args: argparse.Namespace) -> str:
    """The exact ``shoal run ... --resume`` that finishes this run: every option it used."""
    argv = ["shoal", "run", args.workflow, "--journal", args.journal, "--resume"]
    for flag, value in (("--dask", args.dask), ("--workers", args.workers), ("--walltime", args.walltime),
                        ("--sandbox", args.sandbox)):
        if value is not None:
            argv += [flag, str(value)]
    if args.gpus:
        argv += ["--gpus", str(args.gpus)]
    if args.retries:
        argv += ["--retries", str(args.retries)]
    if args.retry_delay is not None:
        argv += ["--retry-delay", _retry_delay_text(args.retry_delay)]
    if args.pickle_values:
        argv.append("--pickle-values")
    if getattr(args, "reuse", False):  # a resume of a reuse run reads the same old journal
        argv.append("--reuse")
    if getattr(args, "cache", None) is not None:
        argv += ["--cache", args.cache]
    for flag, value in getattr(args, "extra_resume", ()):  # options other commands add (e.g. --slurm)
        argv += [flag] + ([str(value)] if value is not None else [])
    return shlex.join(argv)


def config_from_args(args: argparse.Namespace, walltime, progress, pilot) -> EngineConfig:
    """``shoal run``'s options as the run's ``EngineConfig`` (``--workers`` sizes the dask pilot
    when ``--dask`` opened one, not the run)."""
    return EngineConfig.for_run(
        journal=args.journal, resume=args.resume, new=args.new, retry_failed=args.retry_failed,
        workers=None if pilot else args.workers, gpus=args.gpus, walltime=walltime,
        sandbox=args.sandbox, progress=progress, values="pickle" if args.pickle_values else "data",
        launcher=args.launcher, resume_command=resume_command(args), retries=args.retries,
        retry_delay=args.retry_delay, reuse=args.reuse, cache=args.cache)


def _run(args: argparse.Namespace) -> int:
    workflow = load_workflow(args.workflow)
    if args.explain:
        from .reuse import explain

        for uid, verdict in explain(workflow, args.journal, args.cache,
                                    "pickle" if args.pickle_values else "data"):
            print(printable(f"{uid}: {verdict}"))
        return 0
    resource, walltime = resource_from_args(args)  # --slurm & co., or inside an allocation
    progress = Progress(sys.stderr)
    with contextlib.ExitStack() as stack:
        pilot = None
        if args.dask:
            import shoal

            pilot = stack.enter_context(
                shoal.Pilot(args.workers, backend=shoal.BackendKind.DASK, address=args.dask))
        try:
            report = run_workflow(workflow, config_from_args(args, walltime, progress, pilot),
                                  pilot=pilot, resource=resource)
        except KeyboardInterrupt:  # a second Ctrl-C: stopped at once, the journal is resumable
            progress.end()
            print(f"shoal: interrupted; the journal is resumable; finish with: {resume_command(args)}",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            progress.end()
    print(report)
    if report.drained:
        print(f"{report.drain_reason or 'stopped'}; finish with: {resume_command(args)}")
        if report.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_DRAINED
    return 0 if report.ok else EXIT_FAILED


def add_run(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="run an ensemble workflow file (YAML or Python)",
        description="Run the pipelines of a workflow file, journaled to an SQLite file: a YAML file "
                    "(.yaml/.yml: pipelines, stages, tasks; docs/ensemble.md) or a Python file (.py) "
                    "that defines `workflow` (a Pipeline, a list of them, or a function returning one). "
                    "Ctrl-C drains and prints the command that resumes; `shoal status` shows it too.",
    )
    parser.add_argument("workflow", help="a YAML workflow file (.yaml, .yml) or a Python file (.py) "
                                         "defining `workflow`")
    parser.add_argument("--journal", default="run.db", help="SQLite journal (default run.db)")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="finish the run the journal holds")
    again.add_argument("--new", action="store_true",
                       help="start a fresh run; a journal already there is kept as <name>.<date>.db")
    parser.add_argument("--reuse", action="store_true",
                        help="start afresh (the old journal is kept as <name>.<date>.db) and reuse every "
                             "task whose code, arguments, environment and input files' contents match "
                             "a finished task of the old journal (or of --cache): its outputs are staged "
                             "back, it does not run")
    parser.add_argument("--cache", default=None, metavar="DIR",
                        help="a folder shared between runs: every finished task's key and outputs are "
                             "kept there and reused by a later run whose task has the same key")
    parser.add_argument("--explain", action="store_true",
                        help="print per task whether --reuse/--cache would reuse it or why it runs "
                             "(changed argument, input file, code, environment, new); runs nothing")
    parser.add_argument("--retry-failed", action="store_true",
                        help="with --resume: run FAILED and CANCELED tasks (and those skipped for them) again")
    parser.add_argument("--workers", type=_positive_int, default=None,
                        help="cores to use (default: all usable); with --dask: shoal workers per dask worker")
    parser.add_argument("--dask", default=None, metavar="ADDRESS",
                        help="run on the dask cluster whose scheduler is at ADDRESS (tcp://host:8786)")
    parser.add_argument("--gpus", type=_count, default=0, help="GPUs to hand out via CUDA_VISIBLE_DEVICES")
    parser.add_argument("--walltime", default=None, help="e.g. 90s, 30m, 2h, 1:30:00")
    parser.add_argument("--sandbox", default=None, help="task directories root (default <journal>.sandbox)")
    parser.add_argument("--launcher", choices=["srun", "mpirun", "none"], default=None,
                        help="how MPI tasks (ranks=) start their ranks (default: srun inside a "
                             "SLURM job, else mpirun; docs/hpc.md)")
    parser.add_argument("--retries", type=_count, default=0, metavar="N",
                        help="retry each failed task up to N times (default 0); a task's or its "
                             "stage's own retries= come first")
    parser.add_argument("--retry-delay", type=_retry_delay, default=None, metavar="SPEC",
                        help="wait before each retry: seconds (5), or exponential backoff "
                             "base=1,factor=2,cap=60,jitter=0.1 (any of the keys); a task's or its "
                             "stage's own retry_delay= comes first")
    parser.add_argument("--pickle-values", action="store_true",
                        help="store function results with pickle (any type); reading such a journal runs "
                             "code its author chose: only for journals you trust")
    add_resource_arguments(parser)
    parser.set_defaults(handler=_run)


def _state(text: str):
    """An argparse type: a task state by its name (``failed``), or a usage error listing them."""
    from .model import TaskState

    try:
        return TaskState(text.lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"no task state {text!r}; choose one of {', '.join(s.value for s in TaskState)}") from None


def _status_tasks(args: argparse.Namespace) -> int:
    """``shoal status run.db --tasks``: one line (or JSON object) per attempt, with what it used."""
    from .attempts import attempts, table
    from .journal import open_readonly

    if args.watch is not None:
        raise EnsembleError("--tasks lists the attempts once; drop --watch (or use it without --tasks)")
    db = open_readonly(args.journal)
    try:
        items = list(attempts(db, state=args.state, stage=args.stage))
    finally:
        db.close()
    if args.json:
        print(json_dumps([a.to_dict() for a in items], indent=2))
    elif items:
        print(printable(table(items, lambda t: time.strftime("%H:%M:%S", time.localtime(t)))))
    else:
        print(f"no attempts in {args.journal}" + (f" with state {args.state.value}" if args.state else "")
              + (f" in stage {args.stage}" if args.stage else ""))
    return 0


def _status(args: argparse.Namespace) -> int:
    from .status import RunStatus

    if args.tasks:
        return _status_tasks(args)
    if args.state is not None or args.stage is not None:
        raise EnsembleError("--state and --stage filter the attempts that --tasks lists; add --tasks")
    while True:
        status = RunStatus.load(args.journal)
        text = json_dumps(status.to_dict(), indent=2) if args.json else status.table()
        if args.watch is None:
            print(text)
            return 0
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[H\x1b[2J")
        print(time.strftime("%H:%M:%S"), text, sep="\n", flush=True)
        if status.driver.state.value in ("ended", "dead"):
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def add_status(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="print the state of an ensemble run from its journal",
        description="Every pipeline and stage (also those not started), totals, ETA, failures with "
                    "their stderr tails, and whether the run's driver is alive (works while a run writes).",
    )
    parser.add_argument("journal", help="the run's SQLite journal, e.g. run.db")
    parser.add_argument("--watch", nargs="?", type=_seconds, const=2.0, default=None, metavar="SECONDS",
                        help="refresh every SECONDS (default 2) until the run ends")
    parser.add_argument("--json", action="store_true",
                        help="machine-readable (RunStatus.to_dict(); with --tasks a list of attempts)")
    parser.add_argument("--tasks", action="store_true",
                        help="one line per task attempt: host, node, start, seconds, exit status, CPU "
                             "time, peak RSS, bytes read and written (docs/ensemble.md, 'What a run used')")
    parser.add_argument("--state", type=_state, default=None, metavar="STATE",
                        help="with --tasks: only attempts in this state (done, failed, running, ...)")
    parser.add_argument("--stage", default=None, metavar="UID",
                        help="with --tasks: only attempts of this stage (its uid, e.g. p.sim)")
    parser.set_defaults(handler=_status)


def _report(args: argparse.Namespace) -> int:
    from .run_report import write

    write(args.journal, args.html)
    print(f"shoal report: wrote {args.html}", file=sys.stderr)
    return 0


def add_report(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="write a self-contained HTML report of an ensemble run from its journal",
        description="One HTML file (inline CSS and SVG, nothing fetched): a timeline of the attempts "
                    "per host, the slowest tasks, the failures with their stderr, and CPU time, peak "
                    "RSS and bytes read and written per stage and per host (works while a run writes).",
    )
    parser.add_argument("journal", help="the run's SQLite journal, e.g. run.db")
    parser.add_argument("--html", required=True, metavar="OUT", help="write the HTML report to OUT")
    parser.set_defaults(handler=_report)
