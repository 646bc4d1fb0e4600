"""The bridge from rayguard's reports to Ray Train's own ``ray.train.report``.

``rayguard.train.report`` hands its metrics, and the directory of a checkpoint rayguard
committed, to Ray's own report (the one set-up keeps behind the guarded one of
:mod:`rayguard.train.ray_report`, so that nothing is observed twice), through the
:class:`~rayguard.train.forwarder.Forwarder` thread, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from rayguard.train.forwarder import Forwarder


def _forward(report: Any, metrics: dict[str, Any], path: str | None, fs: Any) -> None:
    """Hand metrics, and the directory of a committed checkpoint, to Ray's own report
    (``report``; no upload: the checkpoint is already in the run directory)."""
    if path is None:
        report(metrics)
        return
    from ray.train import Checkpoint, CheckpointUploadMode

    checkpoint = Checkpoint.from_directory(path) if fs is None else Checkpoint(path=path,
                                                                               filesystem=fs)
    report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def ray_own_report(metrics: dict[str, Any], checkpoint: Any = None, **kwargs: Any) -> None:
    """Ray Train's public report (where set-up kept no inner one: a session without Ray's
    per-worker object)."""
    import ray.train

    ray.train.report(metrics, checkpoint=checkpoint, **kwargs)


class ReportForwarding:
    """Forwards this worker's reports to ``raw`` (Ray's own report) from ``forwarder``'s
    thread; ``fs``: the run's remote filesystem (``None``: local or shared)."""

    def __init__(self, forwarder: Forwarder, fs: Any,
                 raw: Callable[..., None] = ray_own_report) -> None:
        self.forwarder = forwarder
        self.fs = fs
        self.raw = raw
        self.last_path: str | None = None
        """The last committed checkpoint handed to Ray (an in-place rollback's resume)."""

    def forward(self, metrics: dict[str, Any], path: str | None) -> Future:
        """Queue one report (with the committed checkpoint at ``path``, if any)."""
        if path is not None:
            self.last_path = path
        return self.forwarder.submit(_forward, self.raw, metrics, path, self.fs)
