"""Fault injection and test helpers, shipped with the library so that recovery can be
rehearsed on a real cluster (``RAYGUARD_FAULTS``) as well as in tests. Controller decisions
are tested without a cluster by :mod:`rayguard.testing.controller` (``ControllerHarness``:
Ray Train's real controller, scripted workers; imported from there, as it imports Ray Train);
node loss and return are rehearsed on one machine with :mod:`rayguard.testing.cluster`
(``SimulatedCluster``, ``wait_for``)."""

from rayguard.faults import Fault, FaultInjector, parse_faults

__all__ = ["Fault", "FaultInjector", "parse_faults"]
