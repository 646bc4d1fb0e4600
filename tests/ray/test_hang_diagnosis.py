"""A collective hang names the rank that holds the others up: real gloo process groups on
the shared local cluster, one rank kept out of the collective its peers wait in, and one
``hang_diagnosed`` decision made through the run's coordinator before any rank is killed.
One 4-worker run, one hang per attempt: in attempt 0 rank 2 never enters the all-reduce
(asleep with the GIL released); in attempt 1, after the group's restart (every rank is
stopped: gloo cannot abort the collective its peers wait in), rank 1 enters a broadcast
instead (a mismatch); the restart budget (1) then ends the run. (These were two fits.)"""

from __future__ import annotations

import time

import pytest
from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.api.exceptions import TrainingFailedError

import rayguard
from rayguard.events import read as read_events

# Half a CPU per worker: 4 workers fit in 2 of the shared cluster's 4 logical CPUs, whatever
# earlier test modules left reserved on it (in the whole suite a 4-worker group at 1 CPU
# each once never found room). A group that cannot start fails at once
# (controller_failure_limit=0) instead of Ray retrying its start-up timeout without end.
WORKER_CPUS = 0.5
NUM_WORKERS = 4
STALL_S = 4.0
ASLEEP, MISMATCHED = 2, 1  # the culprit of attempt 0 and of attempt 1


def hang_loop(config):
    import torch
    import torch.distributed as dist

    ctx = rayguard.train.get_context()
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)
        rayguard.train.report({"loss": 1.0, "step": step})
    if ctx.attempt == 0 and ctx.rank == ASLEEP:
        time.sleep(300)  # the GIL released: its watchdog still answers
    elif ctx.attempt == 1 and ctx.rank == MISMATCHED:
        dist.broadcast(t, src=MISMATCHED)  # a different collective at the same seq
    dist.all_reduce(t)  # the others wait here
    rayguard.train.report({"loss": 1.0, "step": 3})


@pytest.fixture(scope="module")
def hang_events(ray_local_module, tmp_path_factory):
    """The run's events, by attempt: (hang_diagnosed events, stall_detected events)."""
    # recovery="restart": the attempts are 0 and 1 whatever the order in which the
    # controller sees the stopped ranks (live recovery may first replace the ranks it saw
    # stop, find the last one stopped too and restart the group: attempts 0, 1 and 2)
    guard = rayguard.GuardConfig(numa="off", preflight=False, recovery="restart",
                                 health=rayguard.HealthConfig(stall_timeout_s=STALL_S,
                                                              max_restarts=1,
                                                              diagnosis_wait_s=8.0))
    trainer = rayguard.RobustTrainer(
        hang_loop, scaling_config=ScalingConfig(num_workers=NUM_WORKERS,
                                                resources_per_worker={"CPU": WORKER_CPUS}),
        run_config=RunConfig(storage_path=str(tmp_path_factory.mktemp("hang")), name="hang",
                             failure_config=FailureConfig(controller_failure_limit=0)),
        guard_config=guard)
    with pytest.raises(TrainingFailedError):
        trainer.fit()
    events = read_events(trainer.run_dir)
    return events


def _one(events, kind, attempt):
    found = [e for e in events if e["kind"] == kind and e["attempt"] == attempt]
    assert len(found) == 1, [(e["kind"], e["attempt"]) for e in events]  # made once
    return found[0]


def test_a_rank_that_never_enters_the_collective_is_the_culprit(hang_events):
    event = _one(hang_events, "hang_diagnosed", 0)
    assert _one(hang_events, "stall_detected", 0)["culprits"] == [ASLEEP]
    others = [r for r in range(NUM_WORKERS) if r != ASLEEP]
    assert event["culprits"] == [ASLEEP] and event["waiting"] == others, event
    assert event["collective"]["op"] == "all_reduce" and event["collective"]["pg"] == "0"
    # the loop's three all-reduces, the reports' flag agreements before it: the seq the
    # others wait in is past both, and every rank answered
    assert event["collective"]["seq"] > 3 and event["answered"] == list(range(NUM_WORKERS))
    assert event["mismatch"] is None and event["silent"] == []
    assert f"rank {ASLEEP} on node " in event["detail"]
    assert f"never entered all_reduce #{event['collective']['seq']}" in event["detail"]
    assert "test_hang_diagnosis.py" in event["detail"] and "hang_loop" in event["detail"]
    assert set(event["nodes"]) == {str(ASLEEP)} and event["nodes"][str(ASLEEP)]
    assert set(event["stacks"]) == {str(r) for r in range(NUM_WORKERS)}
    with open(event["stacks"][str(ASLEEP)]) as f:
        assert "in hang_loop" in f.read()  # where it sleeps
    restart = [e for e in hang_events if e["kind"] == "restart"]  # the only one: budget 1
    assert [(e["attempt"], e["cause"], e["culprits"]) for e in restart] == [(0, "hang", [ASLEEP])]


def test_a_rank_in_another_collective_is_named_as_a_mismatch(hang_events):
    event = _one(hang_events, "hang_diagnosed", 1)
    assert _one(hang_events, "stall_detected", 1)["culprits"] == [MISMATCHED]
    assert event["culprits"] == [MISMATCHED] and event["waiting"] == [0, 2, 3], event
    assert event["collective"]["op"] == "all_reduce"
    assert "broadcast" in event["mismatch"] and "all_reduce" in event["mismatch"]
    assert event["detail"].startswith(f"mismatched collectives: rank {MISMATCHED} on node ")
    assert "entered broadcast" in event["detail"]
    assert [e["kind"] for e in hang_events][-1] == "failed"  # the budget of 1 is spent
