"""Ray Train's datasets callback, without its actor when the run has no datasets.

Ray Train's ``DatasetsCallback`` starts a ``DatasetManager`` actor at every worker-group
start, whether the trainer was given ``datasets`` or not: a new worker process on the
controller's node that imports Ray Data (about 200 MB, 1-2 s of CPU), once per attempt, and
a run under rayguard restarts its group at every whole-group recovery. With no ``datasets``,
:func:`without_idle_dataset_manager` puts :class:`NoDatasetsCallback` in its place, which
does the rest of what Ray's does: the driver's ``DataContext`` reaches every worker, and
``ray.train.get_dataset_shard`` raises Ray's own ``KeyError``.

Relies on Ray's private ``DatasetsCallback`` (its module and ``_data_context``), the
``WorkerGroupCallback`` hooks ``before_init_train_context`` and ``after_worker_group_start``,
and the ``dataset_shard_provider`` each worker's train context takes (Ray 2.59 and 2.60);
where they moved, Ray's callback stays.
"""

from __future__ import annotations

from typing import Any

try:  # Ray's private classes: the replacement exists only where they are as read
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback
except ImportError:  # pragma: no cover - a Ray that moved them keeps its own callback
    DatasetsCallback = None  # type: ignore[assignment,misc]
    WorkerGroupCallback = object  # type: ignore[assignment,misc]


class NoDatasetShards:
    """A worker's dataset shard provider when the trainer was given no datasets."""

    def get_dataset_shard(self, dataset_info: Any) -> Any:
        name = getattr(dataset_info, "dataset_name", dataset_info)
        raise KeyError(f"Dataset shard for '{name}' not found. Please ensure that the dataset "
                       "is passed through the Trainer `datasets` argument.")


def _set_data_context(context: Any) -> None:
    from ray.data.context import DataContext

    DataContext._set_current(context)


class NoDatasetsCallback(WorkerGroupCallback):  # type: ignore[misc,valid-type]
    """Ray's ``DatasetsCallback`` for a run without datasets: no ``DatasetManager`` actor."""

    def __init__(self, data_context: Any) -> None:
        self._data_context = data_context

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        return {"dataset_shard_provider": [NoDatasetShards()] * len(workers)}

    def after_worker_group_start(self, worker_group: Any) -> None:
        worker_group.execute(_set_data_context, self._data_context)


def without_idle_dataset_manager(callbacks: list[Any], datasets: Any) -> list[Any]:
    """``callbacks`` with Ray's ``DatasetsCallback`` replaced by :class:`NoDatasetsCallback`
    when ``datasets`` is empty; unchanged otherwise (or where Ray's class is not as read)."""
    if datasets or DatasetsCallback is None:
        return callbacks
    out = []
    for callback in callbacks:
        context = getattr(callback, "_data_context", None)
        if type(callback) is DatasetsCallback and context is not None:
            callback = NoDatasetsCallback(context)
        out.append(callback)
    return out


__all__ = ["NoDatasetShards", "NoDatasetsCallback", "without_idle_dataset_manager"]
