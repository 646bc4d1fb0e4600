"""The kernel's cpulist format (``"0-3,8,10-11"``), as sysfs writes it and topology files
may. Standard library only: the discovery that reads sysfs ships to nodes with it."""

from __future__ import annotations

from collections.abc import Sequence


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``; ``ValueError`` for a bad part."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo_s, hi_s = part.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise ValueError(f"range {part!r} runs backwards")
            cpus.extend(range(lo, hi + 1))
        else:
            cpus.append(int(part))
    return cpus


def format_cpulist(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"`` (sorted, repeats dropped)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


__all__ = ["format_cpulist", "parse_cpulist"]
