"""Fault injection and test helpers, shipped with the library so that recovery can be
rehearsed on a real cluster (``RAYGUARD_FAULTS``) as well as in tests."""

from rayguard.faults import Fault, FaultInjector, parse_faults

__all__ = ["Fault", "FaultInjector", "parse_faults"]
