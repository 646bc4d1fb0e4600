"""``rayguard checkpoint verify PATH [--json]`` and ``rayguard checkpoint ls ROOT [--json]``.

Exit status: ``0`` every checkpoint verified (``ls``: also when there are none), ``1`` a
checkpoint failed verification (``ls``: any listed one), ``2`` the path does not exist or
is not a directory, ``3`` (``verify``) the directory is not a rayguard checkpoint (no
manifest: e.g. a plain TorchTrainer checkpoint folder), as opposed to a damaged one.

Paths and problems come from the manifest, which may come from elsewhere: what is printed
is made inert (:mod:`rayguard.inert`), so a crafted path cannot paint a fake "OK" line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rayguard.checkpoint import auth
from rayguard.checkpoint.fallback import list_candidates, order_candidates
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.checkpoint.reported import REPORTED_SOURCE
from rayguard.checkpoint.schemes import short_name
from rayguard.checkpoint.verify import verify
from rayguard.exceptions import ConfigError
from rayguard.inert import inert


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("checkpoint", help="inspect and verify rayguard checkpoints")
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="SUBCOMMAND", required=True)

    p_verify = sub.add_parser("verify", help="verify one checkpoint; exit 1 on any problem")
    p_verify.add_argument("path", help="a checkpoint directory (holds rayguard_manifest.json)")
    p_verify.add_argument("--json", action="store_true", help="print the report as JSON")
    _key_argument(p_verify)
    p_verify.set_defaults(func=_cmd_verify)

    p_ls = sub.add_parser("ls", help="list the checkpoints under a run directory, newest first; "
                                           "exit 1 when any fails verification")
    p_ls.add_argument("root", help="a directory holding checkpoint directories")
    p_ls.add_argument("--no-verify", action="store_true", help="check sizes only, skip the digests")
    p_ls.add_argument("--json", action="store_true", help="print one JSON object per line")
    _key_argument(p_ls)
    p_ls.set_defaults(func=_cmd_ls)


def _key_argument(parser: Any) -> None:
    parser.add_argument("--key-file", metavar="PATH", default=None,
                        help="the run's checkpoint key (CheckpointConfig(key_file=...)): only "
                             "checkpoints signed with it verify (default: the file named by "
                             f"{auth.KEY_FILE_ENV_VAR}, else integrity only)")


def _use_key(command: str, args: argparse.Namespace) -> int | None:
    """Set the key ``--key-file`` names (or the environment's); exit 2 when it is bad."""
    try:
        if args.key_file is not None:
            auth.use(auth.load_key(args.key_file, "--key-file"))
        else:
            auth.active()  # a bad RAYGUARD_CHECKPOINT_KEY_FILE is reported now, not per file
    except ConfigError as exc:
        print(f"rayguard checkpoint {command}: {inert(str(exc))}", file=sys.stderr)
        return EXIT_NOT_FOUND
    return None


EXIT_OK, EXIT_CORRUPT, EXIT_NOT_FOUND, EXIT_NOT_RAYGUARD = 0, 1, 2, 3
NOT_RAYGUARD = "not a rayguard checkpoint"


def _not_found(command: str, path: str, as_json: bool) -> int | None:
    """Exit 2 with "not found" unless ``path`` is a directory; None when it is."""
    if os.path.isdir(path):
        return None
    what = "not a directory" if os.path.exists(path) else "not found"
    if as_json:
        print(json.dumps({"path": path, "ok": None, "error": what}))
    else:
        print(f"rayguard checkpoint {command}: {inert(path)}: {what}", file=sys.stderr)
    return EXIT_NOT_FOUND


def _not_rayguard(path: str, as_json: bool) -> int | None:
    """Exit 3 with "not a rayguard checkpoint" when ``path`` has no manifest at all; None
    when it has one (even a broken one: that is a damaged rayguard checkpoint)."""
    if os.path.lexists(os.path.join(path, MANIFEST_NAME)):
        return None
    detail = (f"no {MANIFEST_NAME} in it: a folder rayguard did not write (e.g. a plain "
              "TorchTrainer checkpoint) or a rayguard save that never committed; nothing "
              "was verified")
    if list_candidates(path):
        detail += (f". It holds checkpoints: list and verify them with `rayguard checkpoint ls "
                   f"{path}`")
    if as_json:
        print(json.dumps({"path": path, "ok": None, "error": NOT_RAYGUARD, "detail": detail}))
    else:
        print(f"NOT A RAYGUARD CHECKPOINT {inert(path)}: {detail}")
    return EXIT_NOT_RAYGUARD


def _cmd_verify(args: argparse.Namespace) -> int:
    missing = _use_key("verify", args) or _not_found("verify", args.path, args.json)
    if missing is None:
        missing = _not_rayguard(args.path, args.json)
    if missing is not None:
        return missing
    report = verify(args.path)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    elif report.ok and report.manifest is not None:
        m = report.manifest
        source = (", reported through ray.train.report"
                  if m.metadata.get("source") == REPORTED_SOURCE else "")
        signed = f", signed with key {m.key_id}" if m.key_id else ""
        print(f"OK {inert(report.path)}: step {m.step}, {len(m.files)} files, "
              f"{_human(m.size_bytes)}, {short_name(m.hash_scheme)} verified{signed}{source}")
        for n in report.notes:  # e.g. written by another torch: kept, not corrupt
            print(f"  note: {inert(n.file)}: {inert(n.what)}")
    else:
        print(f"CORRUPT {inert(report.path)}:")
        for p in report.problems:
            print(f"  {inert(p.file)}: {inert(p.what)}")
    return EXIT_OK if report.ok else EXIT_CORRUPT


def _cmd_ls(args: argparse.Namespace) -> int:
    missing = _use_key("ls", args) or _not_found("ls", args.root, args.json)
    if missing is not None:
        return missing
    rows: list[dict[str, Any]] = []
    for cand in order_candidates(list_candidates(args.root)):
        report = verify(cand.path, hashes=not args.no_verify)
        m = report.manifest
        status = ("sizes ok" if args.no_verify else "verified") if report.ok else "CORRUPT"
        rows.append(
            {
                "path": str(cand.path),
                "step": m.step if m else None,
                "size_bytes": m.size_bytes if m else None,
                "status": status,
                "source": cand.source or ("rayguard" if m else None),
                "problems": [f"{p.file}: {p.what}" for p in report.problems],
            }
        )
    exit_code = EXIT_CORRUPT if any(row["status"] == "CORRUPT" for row in rows) else EXIT_OK
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return exit_code
    if not rows:
        print(f"no checkpoints under {inert(args.root)}")
        return EXIT_OK
    print(f"{'STEP':>8}  {'SIZE':>10}  {'STATUS':<9} PATH")
    for row in rows:
        size = _human(row["size_bytes"]) if row["size_bytes"] is not None else "-"
        step = "-" if row["step"] is None else str(row["step"])
        source = "  (ray.train.report)" if row["source"] == REPORTED_SOURCE else ""
        print(f"{step:>8}  {size:>10}  {row['status']:<9} {inert(row['path'])}{source}")
        for problem in row["problems"]:
            print(f"{'':>32}{inert(problem)}")
    return exit_code


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"
