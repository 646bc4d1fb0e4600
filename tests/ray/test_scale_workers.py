"""Recovery and diagnosis beyond 2 ranks, with real processes: W workers (DDP over gloo) on a
4-node simulated cluster (``ray.cluster_utils.Cluster``), W in 2, 8, 16. A SIGKILL of one
rank is replaced alone (live recovery) while every other rank keeps its first process, and
the weights end bitwise equal to a run without the kill; a rank asleep outside the
collective its peers wait in is the one culprit named.

Only the 16-worker kill (without its clean run) runs in ``make test``; the rest carry the ``scale`` marker
(``.venv/bin/python -m pytest -m scale tests/ray/test_scale_workers.py``), run before a
change to recovery or diagnosis is called done: their figures are in docs/scale.md.
Each test prints one ``SCALE {...}`` line (``-s`` shows it)."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.api.exceptions import WorkerGroupError

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.cluster import SimulatedCluster
from rayguard.testing.exact_loop import exact_loop, read_lines, same_weights

NODES = 4
STEPS = 14
VICTIM_STEP = 8


def _cluster(workers: int) -> SimulatedCluster:
    return SimulatedCluster(worker_nodes=NODES, cpus_per_node=math.ceil(workers / NODES))


def _exact(tmp_path, name: str, workers: int, faults: str | None, spare_after_s: float = 0.0):
    """``spare_after_s=0``: each node's spare at once, as docs/scale.md measured."""
    out, log = str(tmp_path / f"{name}.pt"), str(tmp_path / f"{name}.jsonl")
    guard = rayguard.GuardConfig(seed=0, faults=faults, numa="off", preflight=False,
                                 recovery="live",
                                 health=rayguard.HealthConfig(live_spare_after_s=spare_after_s))
    trainer = rayguard.RobustTrainer(
        exact_loop, train_loop_config={"steps": STEPS, "out": out, "log": log, "step_s": 0.05},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(tmp_path), name=name,
                             failure_config=FailureConfig(max_failures=3,
                                                          controller_failure_limit=0)),
        guard_config=guard)
    started = time.time()
    result = trainer.fit()
    return (torch.load(out, weights_only=True), read_events(result.path), read_lines(log),
            read_lines(log + ".steps"), time.time() - started)


def kill_scenario(tmp_path, workers: int, exact: bool = True) -> dict:
    """``exact``: also a run without the kill, whose weights the killed run must end with
    (the make-test variant leaves it out: exact recovery is proven at 2 workers there; nor
    does it start the nodes' spares at once: its kill comes before the default minute)."""
    victim = workers - 1 if workers < 12 else 11
    with _cluster(workers):
        clean, clean_s = None, None
        if exact:
            clean, *_, clean_s = _exact(tmp_path, "clean", workers, None)
        weights, events, entered, steps, fit_s = _exact(
            tmp_path, "kill", workers, f"kill:rank={victim},step={VICTIM_STEP}",
            spare_after_s=0.0 if exact else rayguard.HealthConfig.live_spare_after_s)
    assert clean is None or same_weights(weights, clean)
    kinds = [e["kind"] for e in events]
    assert kinds.count("worker_died") == 1 and kinds[-1] == "finished", kinds
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [(e.get("path"), e.get("ranks")) for e in restarts] == [("live", [victim])], restarts
    for rank in range(workers):  # every other rank kept its first process
        pids = {e["pid"] for e in entered if e["rank"] == rank}
        assert len(pids) == (2 if rank == victim else 1), (rank, entered)
    killed = next(e["time"] for e in events if e["kind"] == "fault_injected")
    after = [s["t"] for s in steps if s["t"] > killed]
    figures = {"workers": workers, "scenario": "kill",
               "clean_fit_s": None if clean_s is None else round(clean_s, 1),
               "fit_s": round(fit_s, 1), "kill_to_next_step_s": round(min(after) - killed, 2)}
    print("SCALE " + json.dumps(figures))
    return figures


def hang_loop(config):
    import torch.distributed as dist

    rank = rayguard.train.get_context().rank
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)
        rayguard.train.report({"loss": 1.0, "step": step})
    if rank == config["culprit"]:
        time.sleep(600)  # outside any collective; its watchdog still answers
    dist.all_reduce(t)  # the others wait here
    rayguard.train.report({"loss": 1.0, "step": 3})


def hang_scenario(tmp_path, workers: int) -> dict:
    culprit = workers - 3 if workers > 4 else workers - 1
    guard = rayguard.GuardConfig(numa="off", preflight=False, health=rayguard.HealthConfig(
        stall_timeout_s=6.0, max_restarts=0, diagnosis_wait_s=10.0))
    with _cluster(workers):
        trainer = rayguard.RobustTrainer(
            hang_loop, train_loop_config={"culprit": culprit},
            scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=str(tmp_path), name="hang",
                                 failure_config=FailureConfig(controller_failure_limit=0)),
            guard_config=guard)
        with pytest.raises(WorkerGroupError):
            trainer.fit()
    events = read_events(trainer.run_dir)
    diagnosed = [e for e in events if e["kind"] == "hang_diagnosed"]
    assert len(diagnosed) == 1, [e["kind"] for e in events]
    event = diagnosed[0]
    assert event["culprits"] == [culprit], event
    # the last report's own time (a node agent writes its ranks' summaries when it flushes)
    last = max(e.get("last_time") or e["time"] for e in events if e["kind"] == "steps")
    figures = {"workers": workers, "scenario": "hang", "culprit": culprit,
               "answered": len(event["answered"]),
               "last_report_to_diagnosed_s": round(event["time"] - last, 2),
               "decided_after_s": event["decided_after_s"]}
    print("SCALE " + json.dumps(figures))
    return figures


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.timeout(900)
def test_sixteen_workers_a_kill_is_replaced_alone(no_ray, tmp_path):
    kill_scenario(tmp_path, 16, exact=False)


@pytest.mark.scale
@pytest.mark.timeout(1200)
def test_sixteen_workers_a_kill_ends_with_the_exact_weights(no_ray, tmp_path):
    kill_scenario(tmp_path, 16)


@pytest.mark.scale
@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [2, 8])
def test_a_kill_is_replaced_alone_with_the_exact_weights(no_ray, tmp_path, workers):
    kill_scenario(tmp_path, workers)


@pytest.mark.scale
@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [2, 8, 16])
def test_a_hang_names_the_one_rank_outside_the_collective(no_ray, tmp_path, workers):
    hang_scenario(tmp_path, workers)
