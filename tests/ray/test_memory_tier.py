"""The in-memory checkpoint tier on a simulated two-node cluster (one training worker per
node, the coordinator on a head node that never dies), every fault in sequence in one run
(live recovery; each recovery asserted from its own ``restored`` event):

1. a worker killed -> it restores from memory (each rank from the copy of the node that
   saved it);
2. a memory copy that does not match the manifest -> the peer's copy serves;
3. both copies that do not -> the disk;
4. both nodes removed (every copy gone) -> the ranks read the disk.

The run ends with weights bitwise equal to a fault-free run (the exact-resume check of
test_recovery_exact.py). A single node's loss, served by the peer copies:
test_memory_peer.py. (These were four runs, one per fault.)"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.cluster import SimulatedCluster, wait_for
from rayguard.testing.coordinator import memory_copies

# its own simulated cluster (the shared one shut down): run after the shared cluster's tests
pytestmark = pytest.mark.own_cluster

STEPS = 12
HOLDS = (4, 6, 8, 10)
"""After committing each of these steps the run waits until the test has acted on its copies
and released it; then rank 1 is killed at the next step (the first three), or the test
removes both nodes (the last)."""
FAULTS = "kill:rank=1,step=5;kill:rank=1,step=7;kill:rank=1,step=9"


def loop(config):
    import torch.distributed as dist

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    state = rayguard.train.load_state()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    for step in range(start, STEPS):
        x = torch.randn(16, 8)  # the rank's RNG: exact only if RNG state is restored
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        rayguard.train.report({"loss": loss.item(), "step": step},
                              state=state if ctx.rank == 0 else None)
        release = config.get("release")
        if release and step in HOLDS:
            while not os.path.exists(f"{release}-{step}"):
                rayguard.train.heartbeat()
                time.sleep(0.2)
    dist.barrier()
    if ctx.rank == 0:
        torch.save(model.state_dict(), config["out"])


class Run:
    """A fit() in a background thread, so the test can act on the cluster mid-run."""

    def __init__(self, tmp_path, name: str, faults: str | None = None, hold: bool = False):
        self.out = str(tmp_path / f"{name}.pt")
        self.release = str(tmp_path / f"{name}.release") if hold else None
        guard = rayguard.GuardConfig(seed=0, faults=faults, numa="off",
                                     checkpoint=rayguard.CheckpointConfig(memory_tier=True),
                                     health=rayguard.HealthConfig(max_restarts=4))
        self.trainer = rayguard.RobustTrainer(
            loop, train_loop_config={"out": self.out, "release": self.release},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=str(tmp_path), name=name),
            guard_config=guard)
        self.result: dict = {}
        self.thread = threading.Thread(target=self._fit, daemon=True)
        self.thread.start()

    def _fit(self):
        try:
            self.result["result"] = self.trainer.fit()
        except BaseException as exc:
            self.result["error"] = exc

    def held_at(self, step: int) -> str:
        """Wait until both ranks' copies of step ``step``'s checkpoint are in memory."""
        import ray

        coordinator = wait_for(lambda: self.trainer._coordinator, what="coordinator")

        def both() -> str | None:
            committed = ray.get(coordinator.memory_committed.remote())
            if committed is None or f"{step:09d}_a" not in os.path.basename(committed):
                return None
            copies = [c for c in memory_copies(coordinator) if c[0] == committed]
            peers = [c for c in copies if c[3] is not None]
            return committed if len(copies) == 2 and len(peers) == 2 else None

        return wait_for(both, timeout_s=300, what=f"both ranks' two copies of step {step}")

    def release_hold(self, step: int) -> None:
        open(f"{self.release}-{step}", "w").close()

    def finish(self):
        self.thread.join(600)
        assert not self.thread.is_alive(), "fit() did not end"
        if "error" in self.result:
            raise self.result["error"]
        result = self.result["result"]
        return torch.load(self.out, weights_only=True), read_events(result.path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    with SimulatedCluster(worker_nodes=2) as sim:
        yield sim


@pytest.fixture(scope="module")
def clean(cluster, tmp_path_factory):
    weights, events = Run(tmp_path_factory.mktemp("clean"), "clean").finish()
    assert "restart" not in [e["kind"] for e in events]
    return weights


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _flipped(files):
    """``files`` with one byte of the first file flipped."""
    out = {name: data.copy() for name, data in files.items()}
    name = sorted(out)[0]
    out[name][len(out[name]) // 2] ^= 0xFF
    return out


def _corrupt_copies(coordinator, rank, which=("own", "peer")):
    """Replace rank ``rank``'s committed memory copies named in ``which`` by ones with a
    flipped byte (put by this driver, which outlives the run); False when there is none.
    The coordinator's snapshot registry is reached with Ray's ``__ray_call__``: the
    production actor has no test-only method for it."""
    import ray

    def refs_of(actor, rank):
        registry = actor._memory
        path = registry.committed
        snap = None if path is None else registry.lookup(path, rank)
        return None if snap is None else (snap.refs, snap.peer_refs)

    def replace(actor, rank, own, peer):
        snap = actor._memory.lookup(actor._memory.committed, rank)
        snap.refs = own if own is not None else snap.refs
        snap.peer_refs = peer if peer is not None else snap.peer_refs

    found = ray.get(coordinator.__ray_call__.remote(refs_of, rank))
    if found is None:
        return False
    corrupt = [None if name not in which or refs is None
               else [ray.put(_flipped(ray.get(refs[0])))]
               for name, refs in zip(("own", "peer"), found, strict=True)]
    ray.get(coordinator.__ray_call__.remote(replace, rank, *corrupt))
    return True


def _restored_at(events, step):
    restored = [e for e in events if e["kind"] == "restored" and e["step"] == step]
    assert restored, [(e["kind"], e.get("step")) for e in events]
    return restored[0]


@pytest.mark.timeout(900)
def test_every_memory_tier_fault_in_sequence_restores_from_the_right_copy(clean, cluster,
                                                                         tmp_path):
    run = Run(tmp_path, "faults", faults=FAULTS, hold=True)
    # 1. nothing touched: the kill at step 5 restores step 4 from each rank's own copy
    run.held_at(4)
    run.release_hold(4)
    # 2. rank 0's own copy of step 6 replaced by one with a flipped byte: the peer serves
    run.held_at(6)
    assert _corrupt_copies(run.trainer._coordinator, 0, ("own",))
    run.release_hold(6)
    # 3. both of rank 0's copies of step 8 damaged: the disk, verified in full
    run.held_at(8)
    assert _corrupt_copies(run.trainer._coordinator, 0)
    run.release_hold(8)
    # 4. both nodes removed at step 10: every copy gone with them, the disk
    path = run.held_at(10)
    held = [(p, r, n) for p, r, n, _ in memory_copies(run.trainer._coordinator)]
    lost_nodes = {cluster.remove_worker_node(0), cluster.remove_worker_node(0)}
    lost_ranks = sorted(r for p, r, n in held if p == path and n in lost_nodes)
    assert lost_ranks == [0, 1], held  # each shard had a copy on each node
    cluster.add_worker_node()
    cluster.add_worker_node()
    run.release_hold(10)  # the new group's ranks pass step 10 without waiting
    weights, events = run.finish()
    assert _equal(weights, clean)
    own = _restored_at(events, 4)
    assert own["tier"] == "memory" and own.get("disk_hashing_skipped") is True, own
    assert own["copy"] == "own", own  # every node alive: the copy where it was saved
    # rank 0's own copy failed its sha256 check, its peer copy verified: both ranks (rank 1
    # restores rank 0's replicated shard too) read rank 0's shard from the peer copy
    peer = _restored_at(events, 6)
    assert peer["tier"] == "memory" and peer.get("disk_hashing_skipped") is True, peer
    assert peer["copy"] == "peer", peer
    # both of rank 0's copies failed their sha256 check: verified on disk in full, read there
    disk = _restored_at(events, 8)
    assert disk["tier"] == "disk" and "disk_hashing_skipped" not in disk, disk
    gone = _restored_at(events, 10)
    tiers = gone.get("tiers") or [gone["tier"]] * 2
    assert all(tiers[r] == "disk" for r in lost_ranks), gone
    assert "disk_hashing_skipped" not in gone
