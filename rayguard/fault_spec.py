"""Deprecated: the fault spec moved to :mod:`rayguard.faults.spec` (this path keeps working)."""

import warnings

from rayguard.faults.spec import *  # noqa: F403
from rayguard.faults.spec import KINDS, POINTS, Fault, parse_faults

__all__ = ["KINDS", "POINTS", "Fault", "parse_faults"]

warnings.warn("rayguard.fault_spec moved to rayguard.faults.spec", DeprecationWarning,
              stacklevel=2)
