"""``shoal dashboard run.db``, ``shoal run --dashboard`` and ``shoal trace run.json --html out.html``.

Registrars in the style of ``shoal.cli``: each builds its parser and sets
``handler``.  ``with_dashboard`` wraps the ensemble's ``shoal run`` handler: it
serves the run's journal (and the progress the run publishes) while the run
goes on, and keeps serving the finished journal until Ctrl-C when ``--wait``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from .._errors import ShoalError


class DashboardError(ShoalError):
    """A dashboard command got something it cannot serve (message names it)."""


def _serve_forever(dash, stop: threading.Event | None = None) -> None:
    """Serve until SIGTERM, Ctrl-C or ``stop`` is set (by another thread).

    The SIGTERM handler only raises a flag that the loop reads every 0.5 s.  It used to call
    ``stop.set()``, which takes the Event's lock -- a plain Lock that the main thread itself
    holds for a moment inside every ``stop.wait``: a SIGTERM landing there deadlocked the
    handler on its own thread's lock."""
    stop = stop or threading.Event()
    terminated: list = []
    previous = signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))
    try:
        while not terminated and not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        dash.close()


def _dashboard(args: argparse.Namespace) -> int:
    from ..patterns.ensemble.model import EnsembleError
    from .journal import check_journal

    try:
        check_journal(args.journal)
    except EnsembleError as exc:
        raise DashboardError(str(exc)) from None
    dash = _start(journal=args.journal, address=_address(args), max_streams=args.max_streams,
                  flag="--port/--host")
    print(f"shoal dashboard: {dash.url}journal  (journal {os.path.abspath(args.journal)}; Ctrl-C stops)",
          file=sys.stderr, flush=True)
    _serve_forever(dash)
    return 0


def _start(*, flag: str, **kwargs):
    """A Dashboard, or one DashboardError line (exit status 2) for a port or host that cannot
    be served: taken, out of range, not a number, not an address of this machine."""
    from . import Dashboard

    try:
        return Dashboard(**kwargs)
    except (OSError, ValueError, TypeError) as exc:
        text = (exc.strerror if isinstance(exc, OSError) and exc.strerror else None) or str(exc)
        if not text.startswith("dashboard"):
            text = f"dashboard: {text}"
        raise DashboardError(f"{text} ({flag})") from None


def _streams(text: str) -> int:
    from .broadcast import max_streams_from

    try:
        return max_streams_from(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of live pages >= 1") from None


def _address(args) -> int | str:
    return f"{args.host}:{args.port}" if args.host else args.port


def add_dashboard(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="serve the live page of an ensemble journal",
        description="Serve a page with the journal's pipelines, stages and tasks by state, the ETA "
                    "and failures with their stderr tails; works while a run writes the journal "
                    "and on a finished one.",
    )
    parser.add_argument("journal", help="the run's SQLite journal, e.g. run.db")
    parser.add_argument("--port", type=int, default=8787, help="port (default 8787; 0: any free one)")
    parser.add_argument("--host", default=None,
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--max-streams", type=_streams, default=None, metavar="N",
                        help="live pages served at once (default $SHOAL_DASHBOARD_MAX_STREAMS, "
                             "else 256); past it a page refreshes every 5 s instead")
    parser.set_defaults(handler=_dashboard)


def with_dashboard(run_parser: argparse.ArgumentParser) -> None:
    """Add ``--dashboard [PORT|HOST:PORT]`` to ``shoal run``."""
    inner = run_parser.get_default("handler")
    run_parser.add_argument("--dashboard", nargs="?", const="0", default=None, metavar="PORT",
                            help="serve the run's live page (journal and progress) on PORT "
                                 "(default: a free port), 127.0.0.1 unless HOST:PORT")

    def handler(args: argparse.Namespace) -> int:
        if args.dashboard is None:
            return inner(args)
        value = args.dashboard
        address = int(value) if value.isdigit() else value
        dash = _start(journal=args.journal, address=address, flag="--dashboard")
        print(f"shoal run: dashboard at {dash.url}journal", file=sys.stderr, flush=True)
        try:
            return inner(args)
        finally:
            dash.close()

    run_parser.set_defaults(handler=handler)


def _trace(args: argparse.Namespace) -> int:
    from .report import TraceError, load, summarise, write

    try:
        if args.html:
            write(args.trace, args.html)
            print(f"wrote {args.html}", file=sys.stderr)
            return 0
        s = summarise(load(args.trace))
    except TraceError as exc:
        raise DashboardError(str(exc)) from None
    print(f"{s['spans']:,} spans over {(s['t1'] - s['t0']) / 1e6:.3f} s")
    print(f"{'worker':<12} {'tasks':>8} {'busy s':>9} {'util %':>7} {'stole':>6} {'gave':>6}")
    for w in s["workers"]:
        print(f"{w['name']:<12} {w['tasks']:>8} {w['busy_s']:>9.3f} {100 * w['utilisation']:>7.1f} "
              f"{w['stole']:>6} {w['gave']:>6}")
    return 0


def add_trace(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "trace", help="summarise a trace, or write a self-contained HTML report of it",
        description="Per-worker utilisation and steals of a trace written by shoal.Pilot(trace=...); "
                    "--html writes one static file (timeline, utilisation, steals) to open anywhere.",
    )
    parser.add_argument("trace", help="the trace file, e.g. run.json")
    parser.add_argument("--html", default=None, metavar="OUT", help="write the HTML report to OUT")
    parser.set_defaults(handler=_trace)
