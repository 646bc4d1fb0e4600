"""``rayguard doctor``: exit 0 without error findings, 1 with, 2 when it could not run."""

from __future__ import annotations

import argparse
import json
import sys

EXIT_OK, EXIT_ERRORS, EXIT_UNAVAILABLE = 0, 1, 2


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
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all probes")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from rayguard.doctor.runner import DoctorUnavailableError, run

    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"rayguard doctor: --env {item!r} must be NAME=VALUE", file=sys.stderr)
            return EXIT_UNAVAILABLE
        env[name] = value
    try:
        report = run(args.address, storage_path=args.storage_path, env=env, timeout_s=args.timeout)
    except DoctorUnavailableError as exc:
        if args.json:
            print(json.dumps({"version": 1, "ok": None, "error": str(exc)}))
        else:
            print(str(exc), file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(report.to_json() if args.json else report.format_table())
    return report.exit_code
