"""``shoal graph WORKFLOW|JOURNAL (--svg OUT | --dot OUT)``: the workflow drawn (graph.py).

A registrar in the style of shoal/cli.py.  The positional is a workflow file (``.yaml``,
``.yml``, ``.py``: everything it says, ``after=`` and data references included; states
from ``--journal`` when given) or a run's journal (what the journal knows: the plan and
the states; stage barriers only).  ``--svg`` lays it out with Graphviz's ``dot``; ``--dot``
writes the DOT text (``-`` for stdout) for users without Graphviz or with their own
tools.  The file is replaced atomically (``_durable.write_atomic``); a folder, a FIFO or a
symbolic link planted at the output path is refused (``_durable.check_target``).
"""

from __future__ import annotations

import argparse
import os
import sys

from ..._durable import check_target, write_atomic
from .commands import _count
from .graph import (
    MAX_TASKS,
    GraphError,
    from_journal,
    from_workflow,
    journal_states,
    render_svg,
    to_dot,
)
from .journal import check_journal_file

WORKFLOW_SUFFIXES = (".yaml", ".yml", ".py")


def _graph(args: argparse.Namespace) -> int:
    from .commands import load_workflow

    if not args.svg and not args.dot:
        raise GraphError("say where the picture goes: --svg OUT.svg (needs Graphviz) or --dot OUT.dot "
                         "(- for stdout)")
    source = args.source
    if source.endswith(WORKFLOW_SUFFIXES):
        states = journal_states(_journal(args.journal)) if args.journal else None
        graph = from_workflow(load_workflow(source), states, max_tasks=args.max_tasks)
    else:
        if args.journal:
            raise GraphError(f"{source} is read as a journal (not .yaml/.yml/.py); --journal goes with "
                             "a workflow file")
        graph = from_journal(_journal(source), max_tasks=args.max_tasks)
    dot = to_dot(graph, title=os.path.basename(source))
    if args.dot == "-":
        sys.stdout.write(dot)
    elif args.dot:
        _write(args.dot, dot.encode())
    if args.svg:
        _write(args.svg, render_svg(dot))
        print(f"shoal graph: wrote {args.svg}", file=sys.stderr)
    return 0


def _journal(path: str) -> str:
    if not os.path.lexists(path):
        raise GraphError(f"no journal at {path}; run a workflow with --journal {path} first, or give "
                         "a workflow file (.yaml, .yml, .py)")
    check_journal_file(path)  # a folder, a FIFO, a YAML file: refused, naming it
    return path


def _write(path: str, data: bytes) -> None:
    check_target(path, "graph output")  # a folder, a FIFO or a device: refused, naming it
    write_atomic(path, [data], "graph output")


def add_graph(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "graph", help="draw a workflow's pipelines, stages and tasks (SVG via Graphviz, or DOT)",
        description="Draw a workflow file (all its edges) or a run's journal (its plan and states): "
                    "pipelines, stages and tasks coloured by state, a stage of more than --max-tasks "
                    "tasks as one node with its counts. --svg needs Graphviz's dot; --dot does not.")
    parser.add_argument("source", help="a workflow file (.yaml, .yml, .py) or a run's journal (run.db)")
    parser.add_argument("--svg", metavar="OUT", help="write the picture as SVG (laid out by Graphviz)")
    parser.add_argument("--dot", metavar="OUT", help="write the DOT text (- for stdout)")
    parser.add_argument("--journal", metavar="DB",
                        help="with a workflow file: colour its tasks by their states in this journal")
    parser.add_argument("--max-tasks", type=_count, default=MAX_TASKS,
                        help=f"a stage with more tasks is drawn as one node (default {MAX_TASKS})")
    parser.set_defaults(handler=_graph)
