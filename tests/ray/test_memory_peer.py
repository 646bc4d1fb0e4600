"""A lost node under live recovery: the group restarts whole, and the lost rank's checkpoint
state comes back from a peer node's memory.

A simulated cluster of a CPU-less head node and three worker nodes of one CPU each: two ranks,
one per node, the third node spare. Each rank saves its own state with the memory tier on, so
every rank's committed shard is held on its own node and, as a second copy, on the other
rank's node (:mod:`rayguard.checkpoint.peer`). Once the held step has committed with both
copies of both shards, rank 1's node is removed. Ray's replacement of one worker would wait
without end for the placement-group bundle on the dead node, so live recovery falls back to a
restart of the whole group, placed anew (the spare node takes the lost rank), recorded as such
(when the poll already knows the node dead, as Ray's health check makes usual; else Ray moves
the bundle and the path is live). Rank 1 (its own copy gone with its node) restores from the
peer copy, exactly: the model, the optimizer and the RNG it loads are those it saved. (This
run was two before: the fallback with its weights compared to a fault-free run's, and the
peer copy; the exact restore of all the state stands for the comparison.)
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
from ray.train import FailureConfig, RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.cluster import SimulatedCluster, wait_for
from rayguard.testing.coordinator import memory_copies

STEPS = 6
HOLD = 3  # attempt 0 waits after committing this step until its node is gone


def _digest(model, opt, torch) -> str:
    """What an exact restore must reproduce: weights, optimizer state, the rank's RNG."""
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.numpy().tobytes())
    for per_param in opt.state_dict()["state"].values():
        for key in sorted(per_param):
            h.update(torch.as_tensor(per_param[key]).numpy().tobytes())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()


def _loop(config: dict) -> None:
    import torch

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    state = rayguard.train.load_state()
    start = 0
    log = open(os.path.join(config["out"], f"a{ctx.attempt}-r{ctx.rank}.jsonl"), "a")
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
        log.write(json.dumps({"loaded": state["step"], "digest": _digest(model, opt, torch),
                              "node": ctx.node_id, "pid": os.getpid()}) + "\n")
        log.flush()
    for step in range(start, STEPS):
        x = torch.randn(16, 8)  # the rank's RNG: exact only if RNG state is restored
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        if step == HOLD:
            log.write(json.dumps({"saved": step, "digest": _digest(model, opt, torch),
                                  "node": ctx.node_id, "pid": os.getpid()}) + "\n")
            log.flush()
        rayguard.train.report({"loss": loss.item(), "step": step}, state=state)
        if step == HOLD and ctx.attempt == 0:
            while True:  # until the test removes rank 1's node and Ray restarts the group
                rayguard.train.heartbeat()
                time.sleep(0.2)


def _lines(out, attempt: int, rank: int) -> list[dict]:
    path = os.path.join(out, f"a{attempt}-r{rank}.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.timeout(600)
def test_a_lost_node_restarts_the_group_and_its_rank_restores_from_the_peer_copy(no_ray,
                                                                                 tmp_path):
    import ray

    out = tmp_path / "out"
    out.mkdir()
    with SimulatedCluster(worker_nodes=3, cpus_per_node=1) as cluster:
        trainer = rayguard.RobustTrainer(
            _loop, train_loop_config={"out": str(out)},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=str(tmp_path), name="peer",
                                 failure_config=FailureConfig(max_failures=2,
                                                              controller_failure_limit=0)),
            guard_config=rayguard.GuardConfig(
                seed=0, numa="off", preflight=False,
                checkpoint=rayguard.CheckpointConfig(memory_tier=True)))
        thread = cluster.fit_in_background(trainer)
        coordinator = wait_for(lambda: trainer._coordinator, timeout_s=120, what="coordinator")

        def both_copies() -> tuple[str, dict, dict] | None:
            path = ray.get(coordinator.memory_committed.remote())
            if path is None or not path.endswith(f"{HOLD:09d}_a0"):
                return None
            copies = [c for c in memory_copies(coordinator) if c[0] == path]
            own = {r: n for _, r, n, _ in copies}
            peer = {r: n for _, r, _, n in copies if n is not None}
            return (path, own, peer) if len(own) == 2 and len(peer) == 2 else None

        path, own, peer = wait_for(both_copies, timeout_s=240,
                                   what=f"both copies of both shards of step {HOLD}")
        # each shard's second copy is on the other rank's node: one node's loss leaves one
        assert own[0] != own[1] and peer == {0: own[1], 1: own[0]}, (own, peer)
        victim = own[1]
        index = [n.node_id for n in cluster.nodes].index(victim)
        cluster.remove_worker_node(index)
        removed_at = time.time()
        result = cluster.join(thread, timeout_s=300)

    events = read_events(result.path)
    assert events[-1]["kind"] == "finished"
    restarts = [e for e in events if e["kind"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["time"] >= removed_at - 1, restarts
    pids = {x["pid"] for a in (0, 1) for x in _lines(out, a, 0) if "pid" in x}
    if restarts[0].get("path") == "live":  # the node's death not yet known at the poll:
        assert len(pids) == 1, pids  # Ray moved the bundle; rank 0 kept its process
    else:
        assert restarts[0].get("path") is None, restarts
        assert victim[:12] in restarts[0]["fallback"] and "lost" in restarts[0]["fallback"]
        assert len(pids) == 2, pids  # a new group: new processes
    died = [e for e in events if e["kind"] == "worker_died"]
    assert [e["rank"] for e in died] == [1], died  # the survivor is not recorded as dead
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored and restored[0]["step"] == HOLD and restored[0]["path"] == path, restored
    # both ranks restored from memory: rank 0 from the copy of its own (alive) node, rank 1,
    # whose node is gone, from the copy on its peer
    assert restored[0]["tier"] == "memory", restored[0]
    assert restored[0]["copy"] == "mixed" and restored[0]["copies"] == ["own", "peer"]
    for rank in (0, 1):
        saved = [x for x in _lines(out, 0, rank) if "saved" in x]
        loaded = [x for x in _lines(out, 1, rank) if "loaded" in x]
        assert saved and loaded and loaded[0]["loaded"] == HOLD
        assert loaded[0]["digest"] == saved[0]["digest"], rank  # an exact restore
    assert _lines(out, 1, 1)[0]["node"] != own[1]
