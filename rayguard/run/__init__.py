"""Run-side parts: what lives for a whole ``fit()`` beside the worker group, not in it.

* :mod:`rayguard.run.coordinator`: the run's coordinator actor (attempts, the event log,
  the gather, facts, failure records, the memory tier's registry);
* :mod:`rayguard.run.keeper`: the per-node actor owning the in-memory checkpoint copies;
* :mod:`rayguard.run.link`: the workers' one typed client of the coordinator
  (:class:`~rayguard.run.link.RunLink`, :class:`~rayguard.run.link.NullLink` without one).
"""

__all__: list[str] = []
