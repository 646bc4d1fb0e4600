"""Fault injection, a production feature: ``GuardConfig(faults=...)`` / ``RAYGUARD_FAULTS``
rehearse recovery on a real cluster. :mod:`rayguard.faults.spec` parses the spec (pure, the
config validates against it); :mod:`rayguard.faults.injector` fires the faults in a worker.
:mod:`rayguard.testing` re-exports both for tests."""

from rayguard.faults.injector import FaultInjector
from rayguard.faults.spec import KINDS, POINTS, Fault, parse_faults

__all__ = ["KINDS", "POINTS", "Fault", "FaultInjector", "parse_faults"]
