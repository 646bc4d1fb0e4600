"""Unknown or misspelled RAYGUARD_* variables (a typo silently turns a feature off)."""

from __future__ import annotations

from rayguard.constants import KNOWN_ENV_VARS
from rayguard.doctor.findings import Finding, closest
from rayguard.doctor.probe import NodeProbe


def check_rayguard_env(probe: NodeProbe) -> list[Finding]:
    out = []
    for name in sorted(probe.env):
        if name.upper().startswith("RAYGUARD") and name not in KNOWN_ENV_VARS:
            guess = closest(name.upper(), KNOWN_ENV_VARS)
            out.append(Finding("RAYGUARD_UNKNOWN_VAR", "warning", name,
                               f"{name} is not a variable rayguard reads",
                               f"did you mean {guess}?" if guess else
                               f"known: {', '.join(sorted(KNOWN_ENV_VARS))}"))
    return out
