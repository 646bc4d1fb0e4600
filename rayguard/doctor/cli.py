"""``rayguard doctor``: exit 0 without error findings, 1 with, 2 when it could not run,
130 / 143 on Ctrl-C / SIGTERM (at any moment: the cluster connect runs in a helper process,
see :mod:`rayguard.connect`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rayguard.connect import DEFAULT_CONNECT_TIMEOUT_S, ClusterUnavailableError, Notify
from rayguard.inert import inert, inert_lines

EXIT_OK, EXIT_ERRORS, EXIT_UNAVAILABLE = 0, 1, 2
LOCAL_HINT = "pass --address none to check only this machine"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor", help="check the distributed-training setup on every node",
        description="Probe every alive node of a Ray cluster (or this machine) for "
                    "misconfiguration: rendezvous variables, CUDA_VISIBLE_DEVICES, NCCL_*, "
                    "threads, version/env drift, storage, clocks.")
    p.add_argument("--address", default="auto",
                   help='Ray cluster (host:port); "auto" (default): the running one, else '
                        'this machine only; "none": this machine only')
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--storage-path", default=None, help="the run's storage path to check")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable the run will set (repeatable), checked as if set on every node")
    p.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                   help=f"seconds to wait for the cluster connect (default "
                        f"{DEFAULT_CONNECT_TIMEOUT_S:.0f})")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all probes")
    p.set_defaults(func=main)


def doctor_in_child(notify: Notify, *, address: str, storage_path: str | None,
                    env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """The helper process's side (:func:`rayguard.connect.call_connected`): connect, run,
    return the report as a dict."""
    import ray

    from rayguard.connect import init_ray
    from rayguard.doctor.runner import DoctorUnavailableError, resolve_address, run

    try:
        target = resolve_address(address)
    except DoctorUnavailableError as exc:
        raise ClusterUnavailableError(str(exc), "unreachable") from exc
    if target is None:
        return run(address, storage_path=storage_path, env=env, timeout_s=timeout_s).to_dict()
    notify("connecting", address=target)
    init_ray(target, found_automatically=address == "auto", notify=notify,
             command="rayguard doctor")
    notify("connected")
    try:
        return run(target, storage_path=storage_path, env=env, timeout_s=timeout_s).to_dict()
    finally:
        ray.shutdown()


def _report(args: argparse.Namespace, env: dict[str, str]) -> Any:
    from rayguard.connect import call_connected
    from rayguard.doctor.report import DoctorReport
    from rayguard.doctor.runner import LOCAL_ONLY

    if args.address == LOCAL_ONLY:  # nothing to connect to: this process does it
        from rayguard.doctor.runner import run

        return run(LOCAL_ONLY, storage_path=args.storage_path, env=env, timeout_s=args.timeout)
    data = call_connected(
        "rayguard.doctor.cli:doctor_in_child",
        {"address": args.address, "storage_path": args.storage_path, "env": env,
         "timeout_s": args.timeout},
        command="rayguard doctor", address=args.address, local_hint=LOCAL_HINT,
        connect_timeout_s=args.connect_timeout, timeout_s=args.timeout + 30,
        progress=None if args.json else sys.stderr)
    return DoctorReport.from_dict(data)


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            message = f"rayguard doctor: --env {item!r} must be NAME=VALUE"
            if args.json:
                print(json.dumps({"version": 1, "ok": None, "error": message, "reason": "usage"}))
            else:
                print(inert(message), file=sys.stderr)
            return EXIT_UNAVAILABLE
        env[name] = value
    try:
        report = _report(args, env)
    except ClusterUnavailableError as exc:
        if args.json:
            print(json.dumps({"version": 1, "ok": None, "error": str(exc), "reason": exc.kind}))
        else:
            print(inert_lines(str(exc)), file=sys.stderr)
        return EXIT_UNAVAILABLE
    # The real wall time of the command: imports, helper process and connect included.
    from rayguard.connect import process_elapsed_s

    report.duration_s = process_elapsed_s() or time.monotonic() - started
    # node values (variables, paths) come from other machines: printed inert
    print(report.to_json() if args.json else inert_lines(report.format_table()))
    return report.exit_code
