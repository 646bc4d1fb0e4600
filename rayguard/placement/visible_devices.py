"""``CUDA_VISIBLE_DEVICES``, read once, the way the CUDA runtime reads it.

One parser, two readers with their own rules over its result:

* the worker's device pinning (:func:`rayguard.placement.cuda.resolve_cuda_device`) matches
  the GPU ids Ray assigned against :func:`visible_ids`;
* the doctor (:func:`rayguard.doctor.cuda.check_visible_devices`) turns the classified
  entries of :func:`parse_visible_devices` into findings.

The value is comma-separated; each entry, stripped, is one of:

* ``index``: an integer (``"3"``); a negative one hides itself and every entry after it;
* ``uuid``: ``GPU-<hex>``, possibly a prefix of the full UUID;
* ``mig``: ``MIG-<uuid>`` or ``MIG-GPU-<uuid>/<gi>/<ci>``;
* ``empty``: nothing between two commas;
* ``invalid``: anything else. CUDA stops at the first empty or invalid entry.

Two entries name the same device when their :func:`device_key` is equal (``"0"`` and
``"00"``; UUIDs in any letter case); CUDA then exposes no device at all.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

EntryKind = Literal["index", "uuid", "mig", "empty", "invalid"]

NO_DEVICES = "NoDevFiles"
"""What some batch schedulers write for "no GPU"; :func:`visible_ids` reads it as none."""

_INDEX = re.compile(r"-?\d+")
_UUID = re.compile(r"GPU-[0-9a-fA-F-]+")
_MIG = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+/\d+/\d+|[0-9a-fA-F-]+)")


def classify_entry(raw: str) -> EntryKind:
    """The kind of one (stripped) ``CUDA_VISIBLE_DEVICES`` entry."""
    if not raw:
        return "empty"
    if _INDEX.fullmatch(raw):
        return "index"
    if _UUID.fullmatch(raw):
        return "uuid"
    if _MIG.fullmatch(raw):
        return "mig"
    return "invalid"


@dataclass(frozen=True)
class DeviceEntry:
    """One comma-separated entry, as written (stripped), and its kind."""

    raw: str
    kind: EntryKind

    @property
    def negative(self) -> bool:
        """A negative index: CUDA shows no device from here on."""
        return self.kind == "index" and int(self.raw) < 0

    @property
    def names_a_device(self) -> bool:
        """An index >= 0, a GPU UUID or a MIG id (it may still not exist on the node)."""
        return self.kind in ("index", "uuid", "mig") and not self.negative

    @property
    def key(self) -> str:
        return device_key(self.raw)


def device_key(raw: str) -> str:
    """What CUDA compares: an index's value (``"00"`` -> ``"0"``), else the lower-case text."""
    raw = raw.strip()
    return str(int(raw)) if _INDEX.fullmatch(raw) else raw.lower()


def parse_visible_devices(value: str) -> list[DeviceEntry]:
    """Every comma-separated entry of ``value``, classified; ``[]`` when it is blank."""
    if not value.strip():
        return []
    entries = []
    for raw in (p.strip() for p in value.split(",")):
        entries.append(DeviceEntry(raw, classify_entry(raw)))
    return entries


def duplicate_keys(raws: Iterable[str]) -> list[str]:
    """The :func:`device_key` of every entry listed more than once, sorted."""
    counts = Counter(device_key(r) for r in raws)
    return sorted(k for k, n in counts.items() if n > 1)


def visible_ids(value: str | None) -> list[str] | None:
    """The entries that can match a GPU id Ray assigned: ``None`` when unset (every device
    is visible), ``[]`` when blank or ``NoDevFiles``, else the non-empty entries as
    written (integers, UUIDs or MIG ids)."""
    if value is None:
        return None
    if value.strip() == NO_DEVICES:
        return []
    return [e.raw for e in parse_visible_devices(value) if e.kind != "empty"]


__all__ = ["NO_DEVICES", "DeviceEntry", "EntryKind", "classify_entry", "device_key",
           "duplicate_keys", "parse_visible_devices", "visible_ids"]
