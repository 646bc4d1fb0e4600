"""What runs in Ray Train's controller actor: the callbacks that write the event log
(:mod:`~rayguard.controller.callbacks`), the world-rank order
(:mod:`~rayguard.controller.rank_order`), the failure policy
(:mod:`~rayguard.controller.failure_policy`) and the elastic scaling policy
(:mod:`~rayguard.controller.scaling`).

Each applies what a pure planner returns as data (``placement.numa``, ``elastic.remap``,
``elastic.geometry``, ``health.crash_loop``, ``failures``: a worker's failure is classified
once, by :func:`rayguard.failures.classify`); Ray's private classes they build on come from
:mod:`rayguard._ray.train`. Nothing here is re-exported: ``RobustTrainer`` wires them in.
"""

__all__: list[str] = []  # nothing to import: wired in by RobustTrainer
