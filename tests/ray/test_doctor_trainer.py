"""RobustTrainer runs the doctor's per-worker subset at start-up (GuardConfig(preflight=True)):
a bad variable stops the run at once with the finding's message on the driver; a correctly
configured Ray Train worker passes (every RobustTrainer test runs the preflight: it is on by
default, e.g. tests/ray/test_trainer_foundation.py; the unit tests check Ray Train's worker
variables, see tests/unit/doctor/helpers.py)."""

from __future__ import annotations

import signal

import pytest

from rayguard.testing.recorder import make_trainer

pytestmark = pytest.mark.slow


def _never_reached(config):
    raise AssertionError("the training function must not start after a preflight error")


def test_bad_variable_stops_the_run_with_the_finding(ray_local, tmp_path):
    trainer = make_trainer(_never_reached, tmp_path, num_workers=1, name="bad",
                           worker_runtime_env={"env_vars": {"NCCL_SOCKET_NTHREADS": "99"}})
    with pytest.raises(Exception, match="NCCL_SOCKET_THREADS_RANGE") as info:
        trainer.fit()
    assert "NCCL_SOCKET_NTHREADS='99' must be an integer in 1..16" in str(info.value)


def _tcp_loop(config):
    import os

    import torch
    import torch.distributed as dist

    import rayguard.train

    assert "MASTER_ADDR" not in os.environ  # tcp:// rendezvous: Ray sets no MASTER_*
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    rayguard.train.report({"sum": float(t.item()), "world": dist.get_world_size()})


def test_tcp_rendezvous_passes_the_preflight(ray_local, tmp_path, groups_left):
    """TorchConfig(init_method="tcp") leaves RANK/WORLD_SIZE without MASTER_*: a valid run
    that the preflight stopped with PROC_MISSING before."""
    from ray.train.torch import TorchConfig
    from ray.train.v2.api.config import RunConfig, ScalingConfig

    import rayguard
    from rayguard.testing.recorder import RecordReports, read_reports

    reports = str(tmp_path / "reports.jsonl")
    trainer = rayguard.RobustTrainer(
        _tcp_loop, torch_config=TorchConfig(init_method="tcp", backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="tcp",
                             callbacks=[RecordReports(reports)]))
    before = signal.getsignal(signal.SIGINT)
    result = trainer.fit()
    assert result.error is None
    assert read_reports(reports) == [[{"sum": 3.0, "world": 2}] * 2]
    # fit() puts the caller's SIGINT handler back: Ray's holds the finished controller, which
    # kept its worker groups' placement groups (the workers' CPUs) until the next fit()
    assert signal.getsignal(signal.SIGINT) is before
    assert not groups_left()  # this fit's (not earlier tests')
