"""DoctorReport: the findings of one doctor run, as a table for people and JSON for machines."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rayguard.doctor.findings import SEVERITIES, Finding

REPORT_VERSION = 1


@dataclass
class DoctorReport:
    """What ``rayguard.doctor.run`` found."""

    findings: list[Finding]
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """One summary per probed node: node, hostname, ray_node_id, cpus, gpus, versions."""
    address: str | None = None
    """The Ray cluster checked; ``None`` when only the local machine was."""
    duration_s: float = 0.0
    """Wall time of the check (the CLI: from the command's start to the verdict)."""

    def __post_init__(self) -> None:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        self.findings = sorted(self.findings, key=lambda f: (order[f.severity], f.node, f.code, f.subject))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        """0: no error finding; 1: at least one."""
        return 0 if self.ok else 1

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def to_dict(self) -> dict[str, Any]:
        counts = {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}
        return {"version": REPORT_VERSION, "ok": self.ok, "address": self.address,
                "duration_s": round(self.duration_s, 3), "counts": counts, "nodes": self.nodes,
                "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DoctorReport:
        """The report :meth:`to_dict` wrote (e.g. by the CLI's helper process)."""
        return cls([Finding.from_dict(f) for f in data.get("findings", [])],
                   list(data.get("nodes", [])), data.get("address"),
                   float(data.get("duration_s", 0.0)))

    def headline(self) -> str:
        """Where the check ran and how long it took, in one line."""
        took = f"{self.duration_s:.1f} s"
        if self.address:
            return f"rayguard doctor: {len(self.nodes)} node(s) of the Ray cluster at {self.address}, {took}"
        if "DOCTOR_NO_CLUSTER" in self.codes():
            return f"rayguard doctor: no Ray cluster found: checked this machine only, {took}"
        return f"rayguard doctor: checked this machine only (--address none), {took}"

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    def format_table(self, width: int = 100) -> str:
        head = self.headline()
        if not self.findings:
            return head + "\nno findings: the setup looks right."
        rows = [("SEVERITY", "CODE", "NODE", "SUBJECT")]
        rows += [(f.severity.upper(), f.code, f.node or "(cluster)", f.subject) for f in self.findings]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [head, ""]
        for i, row in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
            if i:
                f = self.findings[i - 1]
                lines.append(f"    {f.message}"[:width * 3])
                lines.append(f"    fix: {f.fix}")
        counts = {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}
        lines.append("")
        lines.append(", ".join(f"{n} {s}(s)" for s, n in counts.items()))
        return "\n".join(lines)
