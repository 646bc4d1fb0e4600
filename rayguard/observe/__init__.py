"""Observability: read a run's event log (``rayguard events``), turn it into an offline HTML
report (``rayguard report``), export metrics through Ray's own metrics system, and detect
straggling ranks.

The log itself (record shape, kinds, writer, reader) is :mod:`rayguard.events`'s.
Pure parts: :mod:`~rayguard.observe.table`,
:mod:`~rayguard.observe.timeline` (what happened, as data), :mod:`~rayguard.observe.goodput`
(productive time and badput by cause; an attempt's step figures:
:mod:`~rayguard.observe.goodput_steps`; per trial of a sweep:
:mod:`~rayguard.observe.goodput_sweep`), :mod:`~rayguard.observe.causes`,
:mod:`~rayguard.observe.steps` (worker-side step timing), :mod:`~rayguard.observe.straggler`
and the event -> metric mapping in :mod:`~rayguard.observe.metrics`. Thin adapters:
:mod:`~rayguard.observe.observer` (inside the run's coordinator actor, with
:mod:`~rayguard.observe.goodput_meter` for the goodput metrics, over a compact log),
:mod:`~rayguard.observe.progress` (the driver's console while ``fit()`` runs) and
:mod:`~rayguard.observe.cli`.
"""

__all__: list[str] = []  # nothing to import: used through the `rayguard` CLI and the event log
