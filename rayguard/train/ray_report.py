"""Every ``ray.train.report`` in a RobustTrainer worker is guarded, whoever calls it.

Loops written for Ray Train (and the Ray callbacks of Transformers, Lightning, and Accelerate
loops) report through ``ray.train.report(metrics, checkpoint=...)`` and resume from
``ray.train.get_checkpoint()``. Set-up puts :class:`GuardedTrainFnUtils` in front of Ray's own
per-worker object (through :mod:`rayguard._ray.report`), so that:

* **every report is progress**: a completed step for the watchdog (start-up bound until the
  first, stall bound after), the step timer, the driver's progress line and
  ``RobustTrainer.last_metrics``, exactly as ``rayguard.train.report``; the step is the
  report's first metric of :data:`STEP_KEYS`, else one past the last, counted across the
  run: after ``get_checkpoint()`` the count goes on from the step sealed in the offered
  checkpoint's manifest (every rank reads it from the one choice). The unit (the key found,
  or ``"report"``) is recorded as ``step_unit`` on ``checkpoint_committed`` and
  ``restored``, and the goodput's replay is worded in it ("3 epochs replayed");
* **every report is checked**: ``HealthConfig.watch_metrics`` are checked for NaN/inf before
  Ray sees the report (``nan_detected``, then a restart or the end of the run by
  ``nan_policy``); injected faults fire at these reports too;
* **every checkpoint is sealed**: each reporting rank hashes its directory, the records meet
  at the run's coordinator, and the lowest reporting rank writes rayguard's manifest into its
  directory before Ray persists it (:mod:`rayguard.checkpoint.reported`). Ranks may mix upload
  modes at one report, or report no checkpoint, as under TorchTrainer: no rank waits across
  Ray's barrier for another (:mod:`rayguard.train.ray_seal`). When every rank with a
  checkpoint uploads ``ASYNC``, the hashing runs in Ray's upload threads, off the loop;
* **every report is paced**: with ``CheckpointConfig(interval=True)`` rank 0's checkpoint
  interval flag rides on the per-report agreement, so ``rayguard.train.should_checkpoint()``
  turns True at the Young/Daly interval in these loops too (the cost weighed is the report's
  own time, sealing and upload: the loop's save before the report is not seen);
* **every resume is verified**: ``ray.train.get_checkpoint()`` returns the newest reported
  checkpoint that verifies; damaged ones are rejected (``checkpoint_rejected``,
  ``rayguard_rejected.json``) and never offered again. One rank chooses per attempt, the
  others wait for its answer.

``rayguard.train.report`` forwards through Ray's own report (:func:`raw_report_of`),
so nothing is counted twice, and a loop's own ``ray.train.report`` goes through the same
forwarding thread, in order: mixing both in one loop keeps every rank's Ray reports in the
same sequence (Ray's report is a collective).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from rayguard._ray.report import (
    AttemptTagged,
    CheckpointUploadMode,
    current_train_fn_utils,
    install_train_fn_utils,
    untagged,
)
from rayguard.health.report_wait import ReportWait, returned_check
from rayguard.run.facts import loaded_key
from rayguard.run.link import RunLink
from rayguard.train.collective import Collective
from rayguard.train.forwarder import Forwarder
from rayguard.train.ray_seal import UNIT_FIELD, ReportSealer
from rayguard.train.steps import resolve_step, resumed_last_step, step_unit
from rayguard.train.store import CheckpointStore

logger = logging.getLogger("rayguard")

STEP_KEYS = ("step", "global_step", "training_iteration", "epoch", "iteration")
"""Metrics read as a report's step, first found wins (Transformers and Lightning report
``step``; Ray Tune style loops ``training_iteration``; a loop written as Ray's docs write
it, ``epoch``). Without any, a report is one past the last, counted across the run: a
resume from the checkpoint sealed at step ``k`` continues at ``k + 1``."""

CHOSEN_KEY = "ray-chosen:{attempt}"
"""The choice of ``get_checkpoint()`` for one attempt: ``(path or "", sealed step)``."""

_UNSET = object()


def report_step(metrics: dict[str, Any], last_step: int) -> int:
    """The step of a ``ray.train.report``: a step-like metric, else one past the last."""
    return resolve_step(None, metrics, None, last_step, keys=STEP_KEYS)


def report_unit(metrics: dict[str, Any]) -> str:
    """What the step of a ``ray.train.report`` counts: the first of :data:`STEP_KEYS` it
    carries, else ``"report"``."""
    return step_unit(metrics, STEP_KEYS)


def local_directory(checkpoint: Any) -> str | None:
    """The local directory of a reported ``ray.train.Checkpoint`` (``None``: it lives on a
    remote filesystem, and rayguard leaves it as it is)."""
    if checkpoint is None:
        return None
    from rayguard.checkpoint.remote import is_local

    path = getattr(checkpoint, "path", None)
    if not isinstance(path, str) or not is_local(getattr(checkpoint, "filesystem", None)):
        return None
    return path if os.path.isdir(path) else None


class Observer(Protocol):
    """What sees every report of a worker (the worker session)."""

    last_step: int
    step_unit: str

    def observe(self, metrics: dict[str, Any], *, step: int | None = None,
                state: Any = None, defer_nan: bool = False) -> tuple[dict[str, Any], int]: ...

    def agree_finite(self, step: int) -> None: ...

    def observed(self, metrics: dict[str, Any], step: int, seconds: float) -> None: ...

    def paced(self, *, checkpointed: bool, seconds: float) -> None: ...

    def replays(self, before: int) -> None: ...


class RayReportBridge:
    """What rayguard does around one worker's ``ray.train.report``/``get_checkpoint``:
    ``observer`` sees each report, ``link`` reaches the run, the reports go through
    ``forwarder`` in order; ``collective`` and ``store`` are the checkpointer's."""

    def __init__(self, observer: Observer, link: RunLink, forwarder: Forwarder,
                 collective: Collective, store: CheckpointStore, inner: Any, *,
                 in_place: bool = False, accept_unsealed: bool = True) -> None:
        self.observer = observer
        self.accept_unsealed = accept_unsealed
        """``CheckpointConfig(accept_unsealed=...)`` (:mod:`rayguard.checkpoint.unsealed`)."""
        self._committed: set[str] | None = None
        self.in_place = in_place
        """``GuardConfig(recovery="live")``: a NaN/inf rolls every rank back in place."""
        self.link = link
        self.forwarder = forwarder
        self.collective = collective
        self.store = store
        self.inner = inner
        """Ray's own ``TrainFnUtils`` of this worker."""
        self.count = 0
        self.unit: str | None = None
        """The unit of the last report's step (:func:`report_unit`)."""
        self.sealer = ReportSealer(link, self._persisted)
        self.returned = returned_check(link)  # a report no other rank will join
        self._chosen: Any = _UNSET
        self.sealed_step: int | None = None
        """The step sealed in the checkpoint ``get_checkpoint()`` offers (``None``: none
        offered, or it records none): where the count of reports goes on from."""
        self._reporting = False  # a checkpoint reported in this attempt: Ray's answers
        self._offered: Any = _UNSET
        """After an in-place rollback of a ``ray.train.report`` loop: the checkpoint the
        next ``get_checkpoint()`` chooses from (``_UNSET``: Ray's own)."""

    # -- report -----------------------------------------------------------------------------
    def report(self, metrics: dict[str, Any], checkpoint: Any = None,
               checkpoint_dir_name: str | None = None,
               checkpoint_upload_mode: Any = CheckpointUploadMode.SYNC,
               delete_local_checkpoint_after_upload: bool | None = None,
               checkpoint_upload_fn: Any = None, validation: Any = False) -> None:
        observer, link = self.observer, self.link
        started = time.perf_counter()
        observed, step = observer.observe(metrics, step=report_step(metrics, observer.last_step),
                                          defer_nan=self.in_place)
        self.count += 1
        self.unit = observer.step_unit = report_unit(metrics)
        if self.in_place:  # nothing of a NaN report is sealed or reaches Ray
            observer.agree_finite(step)
        directory = local_directory(checkpoint)
        prepared = self.sealer.prepare(f"ray-report{self.count}", directory,
                                       checkpoint_upload_mode, step, checkpoint_upload_fn,
                                       unit=self.unit)
        future = self.forwarder.submit(
            self.inner.report, metrics, checkpoint, checkpoint_dir_name, checkpoint_upload_mode,
            delete_local_checkpoint_after_upload, prepared.upload, validation)
        self.forwarder.wait(future, ReportWait(link.progress, self.returned, self.count))
        if checkpoint is not None:  # Ray's get_checkpoint() has it now: this process sealed
            self._offered, self._reporting = _UNSET, True  # it, so it is answered as Ray's
        if prepared.persisted_at_report:
            self._persisted(step, checkpoint.path, prepared.sealed_bytes)
        seconds = time.perf_counter() - started
        observer.paced(checkpointed=checkpoint is not None, seconds=seconds)
        observer.observed(observed, step, seconds)

    def _persisted(self, step: int, path: str | None, sealed_bytes: int | None = None) -> None:
        """The writer rank: the sealed checkpoint is in the run's storage (an event, counted
        as durable progress by the crash-loop rule); ``sealed_bytes``: what its manifest
        seals, the checkpoint's size in the goodput and the metrics."""
        name = os.path.basename(str(path).rstrip("/")) if path else "?"
        size = "" if sealed_bytes is None else f" ({sealed_bytes} bytes)"
        self.link.record("checkpoint_committed", f"checkpoint {name} reported through "
                            f"ray.train.report, sealed with a manifest{size}", step=step,
                            path=path, source="ray.train.report", step_unit=self.unit,
                            bytes=sealed_bytes)

    # -- get_checkpoint ---------------------------------------------------------------------
    def get_checkpoint(self) -> Any:
        """The newest reported checkpoint that verifies (``None``: a fresh start); the count
        of reports without a step-like metric goes on from its sealed step. Once this rank
        reported a checkpoint in this attempt, Ray's own answer (its latest, as with
        ``TorchTrainer``)."""
        if self._reporting:
            return self.inner.get_checkpoint()
        if self._chosen is _UNSET:
            latest = self.inner.get_checkpoint() if self._offered is _UNSET else self._offered
            self.sealed_step = None
            self._chosen = None if latest is None else self._agreed_choice(latest)
            observer = self.observer
            before = observer.last_step
            observer.last_step = resumed_last_step(self._chosen is not None, self.sealed_step,
                                                   before)
            if self._chosen is not None:  # the steps up to the run's highest are done again
                observer.replays(before)
        return self._chosen

    def rolled_back(self, path: str | None, *, reported: bool = False) -> None:
        """An in-place rollback (:mod:`rayguard.train.rollback`): from now on
        ``get_checkpoint()`` answers the last committed checkpoint handed to Ray (``path``;
        ``None``: none since this process started, the one it started from stays).
        ``reported``: ``path`` is the newest checkpoint the loop reported through
        ``ray.train.report`` (the same on every rank); the next ``get_checkpoint()`` chooses
        again from it, under the new attempt, so it is verified before it is offered and a
        damaged one falls back to the one before (``None``: nothing reported, a fresh
        start)."""
        self._reporting = False
        if reported:
            self._offered = None if path is None else self._checkpoint(path)
            self._chosen = _UNSET
            return
        if path is None:
            return
        self._chosen = self._checkpoint(path)

    def latest_reported(self) -> str | None:
        """The newest checkpoint this rank reported to Ray (Ray's ``get_checkpoint()``)."""
        latest = self._offered if self._offered is not _UNSET else self.inner.get_checkpoint()
        return None if latest is None else str(latest.path)

    def _checkpoint(self, path: str) -> Any:
        from ray.train import Checkpoint

        fs = self.store.fs
        return Checkpoint.from_directory(path) if fs is None else Checkpoint(path=path,
                                                                             filesystem=fs)

    def _agreed_choice(self, latest: Any) -> Any:
        """The checkpoint one rank chose for every rank; :attr:`sealed_step` the step sealed
        in it (every rank reads both from the one answer: every rank counts on from the same
        step)."""
        link = self.link
        key = CHOSEN_KEY.format(attempt=link.ctx.attempt)
        if link.claim(f"choose-{key}"):
            path, step = self._choose(latest)
            link.put(key, (path or "", step))
        else:
            path, step = link.wait_for(key)
        if not path:
            return None
        self.sealed_step = step
        if os.path.realpath(path) == os.path.realpath(str(latest.path)):
            return latest
        from ray.train import Checkpoint

        return Checkpoint(path=path, filesystem=latest.filesystem)

    def _choose(self, latest: Any) -> tuple[str | None, int | None]:
        """This attempt's choice, made by one rank: the newest that verifies, newer ones that
        do not are rejected and remembered."""
        from rayguard.train import protocol
        from rayguard.train.reported_choice import candidates, verify_reported

        link, collective, store = self.link, self.collective, self.store
        skip = protocol.rejected(collective, store)
        for path, why in collective.shared_rejections().items():
            if path not in store.rejected():
                store.remember_rejection(path, why)
        chosen, chosen_step = None, None
        order = candidates(store, str(latest.path))
        for path in order:
            if path in skip:
                continue
            problems, step, unverified = verify_reported(store, path)
            if unverified:
                problems = self._unsealed_refusal(path, order)
            if problems:
                protocol.reject(collective, store, path, f"{path}: {problems}")
                continue
            chosen, chosen_step = path, step
            fallback = path != order[0]
            note = " (no manifest: reported before rayguard guarded it; not verified)" \
                if unverified else ""
            link.record("restored", f"ray.train.get_checkpoint() offers "
                           f"{os.path.basename(path.rstrip('/'))} (step {step}){note}",
                           step=step, path=path, fallback=fallback, source="ray.train.report",
                           verified=not unverified, step_unit=sealed_unit(store, path))
            if unverified:
                logger.warning("rayguard: %s has no rayguard manifest; offered unverified", path)
            break
        link.put(loaded_key(link.ctx.attempt), chosen)
        self._committed = None
        if chosen is None:
            link.record("restored", "ray.train.get_checkpoint() offers nothing: no "
                           "reported checkpoint verifies; the loop starts fresh",
                           source="ray.train.report", fallback=True)
        return chosen, chosen_step


    def _unsealed_refusal(self, path: str, order: list[str]) -> str:
        """Why ``path``, a reported checkpoint with no manifest, is rejected (``""``: it is
        offered unverified: reported before rayguard guarded the loop)."""
        from rayguard.checkpoint import auth, unsealed
        from rayguard.train.reported_choice import has_manifest

        if self._committed is None:  # read once per choice, only when needed
            self._committed = unsealed.committed_names(self.link.ctx.run_dir, self.store.fs)
        older = order[order.index(path) + 1:]
        return unsealed.refusal(os.path.basename(path.rstrip("/")), committed=self._committed,
                                older_sealed=any(has_manifest(self.store, p) for p in older),
                                key_set=auth.active() is not None,
                                accept_unsealed=self.accept_unsealed)


def sealed_unit(store: Any, path: str) -> str | None:
    """The ``step_unit`` a local reported checkpoint's manifest records (``None``: not
    recorded, or the checkpoint is remote: not read again for a label)."""
    if store.fs is not None:
        return None
    from pathlib import Path

    from rayguard.checkpoint.manifest import read_manifest

    try:
        unit = read_manifest(Path(path)).metadata.get(UNIT_FIELD)
    except Exception:  # a label for the log: never fail a restore for it
        return None
    return unit if isinstance(unit, str) else None


class GuardedTrainFnUtils:
    """Ray's per-worker ``TrainFnUtils`` with rayguard in front of ``report`` and
    ``get_checkpoint``; every other call goes to Ray's object unchanged."""

    def __init__(self, bridge: RayReportBridge) -> None:
        self._bridge = bridge

    def report(self, metrics: dict[str, Any], checkpoint: Any = None, *args: Any,
               **kwargs: Any) -> None:
        self._bridge.report(metrics, checkpoint, *args, **kwargs)

    def get_checkpoint(self) -> Any:
        return self._bridge.get_checkpoint()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bridge.inner, name)


def ray_own_utils(ctx: Any = None) -> Any:
    """Ray's own ``TrainFnUtils`` of this worker (before :func:`install` puts rayguard in
    front of it); with ``ctx`` (live recovery), its reports carry ``ctx.attempt``."""
    own = untagged(current_train_fn_utils())
    return own if ctx is None else AttemptTagged(own, lambda: ctx.attempt)


def raw_report_of(inner: Any) -> Callable[..., None]:
    """Ray's own report of ``inner`` (what ``rayguard.train.report`` forwards to: not
    observed again)."""
    def raw_report(metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
        inner.report(metrics, checkpoint, **kwargs)

    return raw_report


def install(bridge: RayReportBridge) -> RayReportBridge:
    """Put ``bridge`` in front of this worker's ``ray.train.report``; returns it."""
    install_train_fn_utils(GuardedTrainFnUtils(bridge))
    return bridge


def uninstall(bridge: RayReportBridge) -> None:
    install_train_fn_utils(untagged(bridge.inner))
