"""``rayguard events RUN_DIR [--follow] [--kind K] [--rank R] [--json] [--goodput]`` and
``rayguard report RUN_DIR [-o FILE.html] [--metric NAME]`` (without ``-o``: into the run
directory)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rayguard.events.read import follow, iter_events, locate
from rayguard.inert import inert
from rayguard.observe.table import Filter, format_event, header


def register(subparsers: Any) -> None:
    p_events = subparsers.add_parser(
        "events", help="print a run's (or sweep's) event log as a table; --follow tails a live run")
    add_events_arguments(p_events)
    p_events.set_defaults(func=cmd_events)

    p_report = subparsers.add_parser(
        "report", help="write one self-contained HTML report (timeline, loss, summary) of a run")
    p_report.add_argument("run_dir", help="run directory (Result.path), sweep directory, or URI")
    p_report.add_argument("-o", "--output", default=None,
                          help=f"HTML file to write (default: {REPORT_NAME} in the run "
                               "directory; for a remote run, in the current directory)")
    p_report.add_argument("--json", action="store_true",
                          help='print {"ok", "path"} or {"ok": false, "error"} as JSON')
    p_report.add_argument("--metric", default=None,
                          help="metric to plot over steps (default: the first watched metric)")
    p_report.set_defaults(func=cmd_report)


def add_events_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run directory (Result.path), sweep directory, the "
                        "JSONL file, or a URI such as s3://bucket/run")
    parser.add_argument("--follow", "-f", action="store_true",
                        help="keep printing new events until interrupted (a live run)")
    parser.add_argument("--kind", "-k", action="append", default=[],
                        help="only this kind (repeatable), e.g. --kind restart --kind worker_died")
    parser.add_argument("--rank", "-r", type=int, default=None,
                        help="only this rank (events of the whole group are kept)")
    parser.add_argument("--json", action="store_true", help="one JSON object a line")
    parser.add_argument("--goodput", action="store_true",
                        help="the run's goodput and badput by cause instead of the events "
                        "(a sweep: per trial; with --json: one object)")
    parser.add_argument("--poll-s", type=float, default=1.0, help=argparse.SUPPRESS)


def cmd_events(args: argparse.Namespace) -> int:
    try:
        source = locate(args.run_dir)
    except (OSError, ValueError) as exc:  # ValueError: pyarrow's for a URI it cannot open
        print(f"rayguard events: {inert(exc)}", file=sys.stderr)
        return 2
    if getattr(args, "goodput", False):
        return _print_goodput(source, as_json=args.json)
    keep = Filter(kinds=tuple(args.kind), rank=args.rank)
    if not args.json:
        print(header(sweep=source.kind == "sweep"))
    t0: float | None = None
    try:
        # streamed in file order: memory stays bounded however long the log
        events = follow(source, poll_s=args.poll_s) if args.follow else iter_events(source)
        for event in events:
            if t0 is None and isinstance(event.get("time"), (int, float)):
                t0 = float(event["time"])
            if keep.keep(event):
                print(format_event(event, t0 or 0.0, as_json=args.json), flush=args.follow)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `rayguard events ... | head`
        return 0
    except OSError as exc:  # the log unreadable (a directory, no permission)
        print(f"rayguard events: cannot read {inert(source.path)}: {inert(exc)}", file=sys.stderr)
        return 2
    return 0


def _print_goodput(source: Any, *, as_json: bool) -> int:
    from rayguard.checkpoint.interval_advice import recommend_interval
    from rayguard.observe.digest import digest_log
    from rayguard.observe.goodput import goodput
    from rayguard.observe.goodput_sweep import format_sweep_goodput, sweep_goodput
    from rayguard.observe.goodput_table import format_goodput

    try:
        if source.kind == "sweep":
            trials = sweep_goodput(iter_events(source))
            print(json.dumps({"trials": {t: g.to_dict() for t, g in trials.items()}})
                  if as_json else format_sweep_goodput(trials))
            return 0
        digest = digest_log(source, curves=False)  # streamed: memory bounded
    except OSError as exc:
        print(f"rayguard events: cannot read {inert(source.path)}: {inert(exc)}", file=sys.stderr)
        return 2
    g, advice = goodput(digest.compact.events()), recommend_interval(digest.events())
    if as_json:
        print(json.dumps({**g.to_dict(), "checkpoint_interval": advice.to_dict()}))
    else:
        print(format_goodput(g) + "\n\n" + advice.line())
    return 0


REPORT_NAME = "rayguard_report.html"


def default_output(run_dir: str) -> str:
    """Where ``rayguard report`` writes without ``-o``: beside the run's event log in a
    local run directory (not into the current directory, a checkout), else the current
    directory (a remote run)."""
    path = run_dir.removeprefix("file://")
    if "://" in path:
        return REPORT_NAME
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    return os.path.join(folder, REPORT_NAME)


def cmd_report(args: argparse.Namespace) -> int:
    from rayguard.observe.report import ReportDependencyError, write_report

    def fail(exc: Exception, code: int) -> int:
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"rayguard report: {inert(exc)}", file=sys.stderr)
        return code

    try:
        path = write_report(args.run_dir, args.output or default_output(args.run_dir),
                            metric=args.metric)
    except (OSError, ValueError) as exc:  # not found, unreadable, a URI pyarrow cannot open
        return fail(exc, 2)
    except ReportDependencyError as exc:
        return fail(exc, 3)
    print(json.dumps({"ok": True, "path": str(path)}) if getattr(args, "json", False)
          else f"wrote {inert(path)}")
    return 0


def events_main(argv: list[str] | None = None) -> int:
    """``python -m rayguard.events RUN_DIR ...``: the same as ``rayguard events``."""
    parser = argparse.ArgumentParser(prog="python -m rayguard.events",
                                     description="print a rayguard event log as a table")
    add_events_arguments(parser)
    return cmd_events(parser.parse_args(argv))
