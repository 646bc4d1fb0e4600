"""A run without datasets starts no ``DatasetManager`` actor at each worker-group start:
Ray Train's ``DatasetsCallback`` is replaced by one that only passes the driver's
``DataContext`` on and answers ``get_dataset_shard`` with Ray's ``KeyError``. No cluster."""

from __future__ import annotations

import pytest
import ray.cloudpickle as cloudpickle
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.execution.callback import WorkerGroupCallback

import rayguard
from rayguard._ray.datasets import (
    NoDatasetsCallback,
    NoDatasetShards,
    _set_data_context,
    without_idle_dataset_manager,
)


def _loop(config):
    pass


def _trainer(tmp_path, **kwargs):
    from ray.train import RunConfig

    return rayguard.RobustTrainer(_loop, run_config=RunConfig(storage_path=str(tmp_path)),
                                  guard_config=rayguard.GuardConfig(numa="off"), **kwargs)


def test_a_trainer_without_datasets_has_no_ray_datasets_callback(tmp_path):
    callbacks = _trainer(tmp_path)._create_default_callbacks()
    kinds = [type(c) for c in callbacks]
    assert DatasetsCallback not in kinds and kinds.count(NoDatasetsCallback) == 1, kinds
    replacement = next(c for c in callbacks if isinstance(c, NoDatasetsCallback))
    assert isinstance(replacement, WorkerGroupCallback)  # the controller runs its hooks
    again = cloudpickle.loads(cloudpickle.dumps(replacement))  # it travels to the controller
    assert type(again) is NoDatasetsCallback


def test_a_trainer_with_datasets_keeps_rays(tmp_path):
    callbacks = _trainer(tmp_path, datasets={"train": lambda: None})._create_default_callbacks()
    kinds = [type(c) for c in callbacks]
    assert kinds.count(DatasetsCallback) == 1 and NoDatasetsCallback not in kinds, kinds


def test_only_rays_callback_is_replaced_in_place():
    other = object()
    rays = DatasetsCallback.__new__(DatasetsCallback)
    rays._data_context = "the driver's"
    out = without_idle_dataset_manager([other, rays, other], datasets={})
    assert out[0] is other and out[2] is other and type(out[1]) is NoDatasetsCallback
    assert out[1]._data_context == "the driver's"
    assert without_idle_dataset_manager([rays], datasets={"x": 1}) == [rays]


def test_the_workers_get_the_data_context_and_rays_error_for_a_shard(monkeypatch):
    from ray.data.context import DataContext

    class Group:
        def execute(self, fn, *args):
            self.called = (fn, args)

    group = Group()
    callback = NoDatasetsCallback("ctx")
    callback.after_worker_group_start(group)
    assert group.called == (_set_data_context, ("ctx",))
    providers = callback.before_init_train_context(["w0", "w1", "w2"])["dataset_shard_provider"]
    assert len(providers) == 3 and all(isinstance(p, NoDatasetShards) for p in providers)

    class Info:
        dataset_name = "train"

    with pytest.raises(KeyError, match="Dataset shard for 'train' not found. Please ensure "
                                       "that the dataset is passed through the Trainer"):
        providers[0].get_dataset_shard(Info())
    seen = []
    monkeypatch.setattr(DataContext, "_set_current", staticmethod(seen.append))
    _set_data_context("ctx")
    assert seen == ["ctx"]
