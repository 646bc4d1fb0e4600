"""Deprecated: fault injection moved to :mod:`rayguard.faults` (this path keeps working;
``from rayguard.testing import FaultInjector, parse_faults`` stays the way for tests)."""

import warnings

from rayguard.faults.injector import *  # noqa: F403
from rayguard.faults.injector import KINDS, POINTS, Fault, FaultInjector, parse_faults

__all__ = ["KINDS", "POINTS", "Fault", "FaultInjector", "parse_faults"]

warnings.warn("rayguard.testing.faults moved to rayguard.faults.injector", DeprecationWarning,
              stacklevel=2)
