"""Ray Train V2's per-worker report seam: where ``ray.train.report`` and ``get_checkpoint`` go.

Relies on (Ray 2.59 and 2.60, see docs/compatibility.md): ``ray.train.report``,
``ray.train.get_checkpoint`` and the other ``ray.train`` worker calls look up one object per
worker process, ``ray.train.v2._internal.execution.train_fn_utils.get_train_fn_utils()``,
which ``set_train_fn_utils`` replaces (the module's docstring: "This class can be patched if
new user APIs behaviors is wanted"). Its ``report(metrics, checkpoint, checkpoint_dir_name,
checkpoint_upload_mode, delete_local_checkpoint_after_upload, checkpoint_upload_fn,
validation)`` runs in the calling thread; with ``checkpoint_upload_fn`` Ray calls
``fn(checkpoint, checkpoint_dir_name)`` instead of its own upload (the storage context's
``persist_current_checkpoint``), in the calling thread (``SYNC``) or its upload thread
(``ASYNC``), and never for ``NO_UPLOAD`` or a report without a checkpoint.
"""

from __future__ import annotations

from typing import Any

from rayguard._ray import require_attrs, version_error

try:
    from ray.train.v2._internal.execution import train_fn_utils as _train_fn_utils
    from ray.train.v2.api.report_config import CheckpointUploadMode
except ImportError as _exc:  # a Ray whose Train V2 internals moved
    raise version_error(f"a Train V2 internal ({_exc})", "guarding ray.train.report") from _exc

require_attrs(_train_fn_utils, ("get_train_fn_utils", "set_train_fn_utils"),
              "ray.train.v2._internal.execution.train_fn_utils", "guarding ray.train.report")

__all__ = ["ATTEMPT_TAG", "AttemptTagged", "CheckpointUploadMode", "current_train_fn_utils",
           "default_upload", "install_train_fn_utils", "untagged"]

ATTEMPT_TAG = "_rayguard_attempt"
"""The metric a live run's worker adds to each report: the attempt it was made in (taken off
in the controller before Ray sees the report: :mod:`rayguard._ray.stale_reports`)."""


class AttemptTagged:
    """Ray's ``TrainFnUtils`` ``inner`` whose reports carry the attempt they are made in
    (``attempt()``, read when the report is made), so that the controller can drop a failed
    attempt's report that reaches it after live recovery began; everything else is
    ``inner``'s."""

    def __init__(self, inner: Any, attempt: Any) -> None:
        self.untagged = untagged(inner)
        self.attempt = attempt

    def report(self, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return self.untagged.report({**metrics, ATTEMPT_TAG: int(self.attempt())},
                                    *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.untagged, name)


def untagged(utils: Any) -> Any:
    """Ray's own ``TrainFnUtils`` behind ``utils`` (``utils`` itself when not tagged)."""
    return utils.untagged if isinstance(utils, AttemptTagged) else utils


def current_train_fn_utils() -> Any:
    """This worker's ``TrainFnUtils`` (what ``ray.train.report`` calls)."""
    return _train_fn_utils.get_train_fn_utils()


def install_train_fn_utils(utils: Any) -> None:
    """Make ``ray.train.report``/``get_checkpoint`` in this worker go through ``utils``."""
    _train_fn_utils.set_train_fn_utils(utils)


def default_upload(checkpoint: Any, checkpoint_dir_name: str) -> Any:
    """Ray's own upload of a reported checkpoint into the run's storage (what a report does
    when no ``checkpoint_upload_fn`` is given)."""
    import ray.train

    storage = ray.train.get_context().get_storage()
    return storage.persist_current_checkpoint(checkpoint, checkpoint_dir_name)
