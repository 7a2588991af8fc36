"""Command-line entry point: ``shoal <command>`` (``python -m shoal`` works too).

Each subcommand is one ``_add_<name>(subparsers)`` registrar that builds its
parser and sets ``handler`` to a function ``(args) -> int``; :data:`COMMANDS`
lists the registrars.  ``main`` turns a :class:`~shoal._errors.ShoalError` into
one ``shoal: error: ...`` line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence

from shoal._errors import ShoalError
from shoal.dashboard.commands import add_dashboard, add_trace, with_dashboard
from shoal.patterns.ensemble.commands import add_report, add_run, add_status
from shoal.patterns.ensemble.graph_command import add_graph
from shoal.runtime.allocation import current as allocation
from shoal.runtime.topology import Topology, format_cpulist, topology

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # as a program killed by SIGPIPE, which a shell pipeline expects


def shoal_version() -> str:
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def native_ring_built() -> bool:
    """Whether the optional C ring helper ``shoal.queues._native`` is importable."""
    try:
        return importlib.util.find_spec("shoal.queues._native") is not None
    except ImportError:
        return False


# -- shoal info ---------------------------------------------------------------
def info_dict(topo: Topology) -> dict:
    return {
        "shoal_version": shoal_version(),
        "python_version": platform.python_version(),
        "native_ring": native_ring_built(),
        **topo.to_dict(),
        "allocation": alloc.to_dict() if (alloc := allocation()) is not None else None,
    }


def _format_info(info: dict) -> str:
    rows = [
        ("shoal", info["shoal_version"]),
        ("python", info["python_version"]),
        ("native ring helper", "built" if info["native_ring"] else "not built (pure Python)"),
        ("topology source", info["source"]),
        ("logical CPUs", str(info["logical_cpus"])),
        ("physical cores", str(info["physical_cores"])),
        ("usable CPUs", format_cpulist(info["usable_cpus"])),
    ]
    if info["synthetic"]:
        rows.append(("mapped onto host CPUs", format_cpulist(info["host_cpus"])))
    if info.get("limited_by"):
        rows.append(("limited by", info["limited_by"]))
    if info.get("allocation"):
        a = info["allocation"]
        rows.append(("batch job", f"{a['scheduler']} {a['job_id']}, nodes {','.join(a['nodes']) or '?'}"))
    width = max(len(key) for key, _ in rows)
    lines = [f"{key:<{width}}  {value}" for key, value in rows]
    lines += ["", f"{'NUMA node':<10}  {'CPUs':<16}  count"]
    for node in info["nodes"]:
        lines.append(f"{node['id']:<10}  {format_cpulist(node['cpus']):<16}  {len(node['cpus'])}")
    return "\n".join(lines)


def _run_info(args: argparse.Namespace) -> int:
    info = info_dict(topology())
    print(json.dumps(info, indent=2) if args.json else _format_info(info))
    return 0


def _add_info(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="show CPUs, NUMA nodes and build details",
        description="Show the topology shoal places workers on (honours SHOAL_TOPOLOGY).",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_run_info)


# Subcommand registrars, in help order.  A new command adds an ``_add_<name>``
# function here (or imports one from its own module, as run and status do).
def _add_run(subparsers: argparse._SubParsersAction) -> None:
    add_run(subparsers)
    with_dashboard(subparsers.choices["run"])  # shoal run --dashboard


COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_info, _add_run, add_status, add_report, add_graph, add_dashboard, add_trace)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal", description="shoal: task-parallel Python runtime"
    )
    parser.add_argument("--version", action="version", version=f"shoal {shoal_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``shoal`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:  # `shoal status run.db | head`: the reader left; no traceback
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return args.handler(args)
    except ShoalError as exc:
        print(f"shoal: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit does not fail again
    on the closed pipe (the recipe of Python's signal module documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's StringIO)
        pass
