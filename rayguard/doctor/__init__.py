"""rayguard doctor: preflight checks of the distributed-training setup on every node.

``run()`` probes every alive node of a Ray cluster (or the local machine) and returns a
:class:`DoctorReport`; ``worker_preflight()`` + ``raise_on_errors()`` are the fast
per-process subset RobustTrainer runs at worker start-up.
"""

from __future__ import annotations

from rayguard.doctor.checks import check_node, format_finding, raise_on_errors, worker_preflight
from rayguard.doctor.findings import CODES, Finding
from rayguard.doctor.report import DoctorReport
from rayguard.doctor.runner import DoctorUnavailableError, run

__all__ = [
    "CODES",
    "DoctorReport",
    "DoctorUnavailableError",
    "Finding",
    "check_node",
    "format_finding",
    "raise_on_errors",
    "run",
    "worker_preflight",
]
