"""A collective hang names the rank that holds the others up: real gloo process groups on
the shared local cluster, one rank kept out of the collective its peers wait in (asleep
with the GIL released, or in another collective), and one ``hang_diagnosed`` decision
made through the run's coordinator before any rank is killed."""

from __future__ import annotations

import time

import pytest
from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard
from rayguard.events import read as read_events

# Half a CPU per worker: 4 workers fit in 2 of the shared cluster's 4 logical CPUs, whatever
# earlier test modules left reserved on it (in the whole suite a 4-worker group at 1 CPU
# each once never found room). A group that cannot start fails at once
# (controller_failure_limit=0) instead of Ray retrying its start-up timeout without end.
WORKER_CPUS = 0.5

STALL_S = 4.0


def hang_loop(config):
    import torch
    import torch.distributed as dist

    rank = rayguard.train.get_context().rank
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)
        rayguard.train.report({"loss": 1.0, "step": step})
    if rank == config["culprit"]:
        if config.get("mismatch"):
            dist.broadcast(t, src=config["culprit"])  # a different collective at the same seq
        else:
            time.sleep(300)  # the GIL released: its watchdog still answers
    dist.all_reduce(t)  # the others wait here
    rayguard.train.report({"loss": 1.0, "step": 3})


def _diagnose(tmp_path, name, num_workers, culprit, mismatch=False):
    guard = rayguard.GuardConfig(numa="off", preflight=False, health=rayguard.HealthConfig(
        stall_timeout_s=STALL_S, max_restarts=0, diagnosis_wait_s=8.0))
    trainer = rayguard.RobustTrainer(
        hang_loop, train_loop_config={"culprit": culprit, "mismatch": mismatch},
        scaling_config=ScalingConfig(num_workers=num_workers,
                                     resources_per_worker={"CPU": WORKER_CPUS}),
        run_config=RunConfig(storage_path=str(tmp_path), name=name,
                             failure_config=FailureConfig(controller_failure_limit=0)),
        guard_config=guard)
    with pytest.raises(WorkerGroupError):
        trainer.fit()
    events = read_events(trainer.run_dir)
    diagnosed = [e for e in events if e["kind"] == "hang_diagnosed"]
    assert len(diagnosed) == 1, [e["kind"] for e in events]  # the decision is made once
    stalls = [e for e in events if e["kind"] == "stall_detected"]
    assert len(stalls) == 1, stalls
    assert stalls[0]["culprits"] == [culprit]
    last_step = max(e["time"] for e in events if e["kind"] == "steps") if any(
        e["kind"] == "steps" for e in events) else None
    return diagnosed[0], events, last_step


# 4 workers only: at 2 the one rank waiting is the culprit's only peer (the live test's hang,
# tests/ray/test_live_replace.py::test_killed_and_hung_workers_are_replaced_alone (its hang), names rank 1 of 2)
@pytest.mark.parametrize("num_workers,culprit", [(4, 2)])
def test_a_rank_that_never_enters_the_collective_is_the_culprit(ray_local_module, tmp_path,
                                                                num_workers, culprit):
    event, events, _ = _diagnose(tmp_path, f"asleep-{num_workers}", num_workers, culprit)
    others = [r for r in range(num_workers) if r != culprit]
    assert event["culprits"] == [culprit] and event["waiting"] == others, event
    assert event["collective"]["op"] == "all_reduce" and event["collective"]["pg"] == "0"
    # the loop's three all-reduces, the reports' flag agreements before it: the seq the
    # others wait in is past both, and every rank answered
    assert event["collective"]["seq"] > 3 and event["answered"] == list(range(num_workers))
    assert event["mismatch"] is None and event["silent"] == []
    assert f"rank {culprit} on node " in event["detail"]
    assert f"never entered all_reduce #{event['collective']['seq']}" in event["detail"]
    assert "test_hang_diagnosis.py" in event["detail"] and "hang_loop" in event["detail"]
    assert set(event["nodes"]) == {str(culprit)} and event["nodes"][str(culprit)]
    assert set(event["stacks"]) == {str(r) for r in range(num_workers)}
    with open(event["stacks"][str(culprit)]) as f:
        assert "in hang_loop" in f.read()  # where it sleeps
    restart_or_fail = [e for e in events if e["kind"] in ("restart", "failed")]
    assert restart_or_fail, [e["kind"] for e in events]


def test_a_rank_in_another_collective_is_named_as_a_mismatch(ray_local_module, tmp_path):
    event, _, _ = _diagnose(tmp_path, "mismatch", 4, 1, mismatch=True)
    assert event["culprits"] == [1] and event["waiting"] == [0, 2, 3], event
    assert event["collective"]["op"] == "all_reduce"
    assert "broadcast" in event["mismatch"] and "all_reduce" in event["mismatch"]
    assert event["detail"].startswith("mismatched collectives: rank 1 on node ")
    assert "entered broadcast" in event["detail"]
