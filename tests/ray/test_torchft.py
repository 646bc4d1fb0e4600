"""RobustTrainer with Ray's ``TorchftConfig`` (2 CPU workers, gloo, Ray's own torchft example
loop): a killed, then a failing, rank is replaced alone by Ray's replica-group restart, rank 0
keeps its process, rank 0 late to the report where rank 1 was killed is released from it,
and the run finishes (before, the replacement waited in rayguard's set-up for peers that
were already training, and the run hung). The release's decision is proven in
tests/unit/health/test_replica_barrier.py."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torchft")

import rayguard  # noqa: E402
from rayguard.events import read as read_events  # noqa: E402

STEPS = 30


def pid_loop(config):
    """Ray's torchft example loop, unchanged, after leaving this worker's rank and PID in a
    file. Rank 0 makes its first report (step 10, where rank 1 is killed) only once rank 1's
    replacement has started: after Ray's reset of the report barrier at the replacement, so
    that it waits there for a peer that meets it in torchft's quorum first (before,
    depending on timing, the run waited until torchft's quorum timeout failed the
    replacement; in two full runs it then failed past ``max_failures``)."""
    import time

    import ray.train
    from ray.train.v2.examples.pytorch import torchft_linear_example as example

    rank = ray.train.get_context().get_world_rank()
    with open(config["pids"], "a") as f:
        f.write(f"{rank} {os.getpid()}\n")
    if rank == 0:
        report = ray.train.report

        def late_first_report(*args, **kwargs):
            ray.train.report = report
            deadline = time.monotonic() + 120
            while len(_pids(_started(config["pids"]), 1)) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            return report(*args, **kwargs)

        ray.train.report = late_first_report
    return example.train_func(config)


def _started(path):
    with open(path) as f:
        return [tuple(int(v) for v in line.split()) for line in f if line.strip()]


def _fit(tmp_path, name, *, faults=None, error_step=None):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.torch.torchft_config import TorchftConfig

    pids = str(tmp_path / f"{name}.pids")
    config = {"num_steps": STEPS, "report_interval": 10, "pids": pids}
    if error_step is not None:
        config.update(error_step=error_step, error_rank=1)
    trainer = rayguard.RobustTrainer(
        pid_loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
        # min_replicas=2: the survivor waits for the replacement rather than training alone
        torch_config=TorchftConfig(lighthouse_kwargs={"min_replicas": 2}, backend="gloo"),
        run_config=RunConfig(storage_path=str(tmp_path), name=name,
                             failure_config=FailureConfig(max_failures=2)),
        guard_config=rayguard.GuardConfig(numa="off", faults=faults))
    result = trainer.fit()
    return result, _started(pids), read_events(result.path)


def _pids(started, rank):
    return [pid for r, pid in started if r == rank]


@pytest.mark.timeout(300)
def test_rank1_killed_then_failing_is_replaced_alone_twice_rank0_keeps_its_process(
        ray_local_module, tmp_path):
    """A SIGKILL of rank 1 at step 10, then its replacement raising at step 20 (Ray's
    example's ``error_step``, once): each replaced alone, each failure with its own cause
    (these were one fit each)."""
    result, started, events = _fit(tmp_path, "faults", faults="kill:rank=1,step=10",
                                   error_step=20)
    assert result.error is None
    assert result.metrics["step"] >= STEPS
    assert len(_pids(started, 0)) == 1, started  # rank 0 was never restarted
    rank1 = _pids(started, 1)
    assert len(rank1) == 3 and len(set(rank1)) == 3, started  # rank 1 replaced twice
    kinds = [e["kind"] for e in events]
    assert kinds[-1] == "finished", kinds
    died = [e for e in events if e["kind"] == "worker_died"]
    assert [e["rank"] for e in died] == [1, 1], died
    assert "injected kill" in died[0]["detail"], died[0]
    # the replacement's own exception, not the kill its predecessor's mark recorded
    assert "Simulated replica failure" in died[1]["detail"], died[1]
    # rank 0, late to the report Ray's replacement reset, was released from it
    released = [e for e in events if e["kind"] == "report_released"]
    assert released and (released[0]["ranks"], released[0]["replaced"]) == ([0], [1]), released
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [(e["path"], e["ranks"]) for e in restarts] == [("replica_group", [1])] * 2, restarts
    assert kinds.count("attempt_started") == 1  # no worker-group restart
