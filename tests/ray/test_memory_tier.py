"""The in-memory checkpoint tier on a simulated two-node cluster (one training worker per
node, the coordinator on a head node that never dies): a worker killed -> the restart
restores from memory (each rank from the copy of the node that saved it); a memory copy that
does not match the manifest -> the peer's copy serves; both copies that do not -> the disk;
both nodes removed (every copy gone) -> the ranks read the disk. Every run ends with weights
bitwise equal to a fault-free run (the exact-resume check of test_recovery_exact.py). A
single node's loss, served by the peer copies: test_memory_peer.py."""

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

STEPS = 8
HOLD = 4  # attempt 0 waits after committing this step until released (or killed)


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
        if release and step == HOLD and ctx.attempt == 0:
            while not os.path.exists(release):
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
                                     checkpoint=rayguard.CheckpointConfig(memory_tier=True))
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

    def held_at_hold(self) -> str:
        """Wait until both ranks' copies of the held step's checkpoint are in memory."""
        import ray

        coordinator = wait_for(lambda: self.trainer._coordinator, what="coordinator")
        path = wait_for(lambda: ray.get(coordinator.memory_committed.remote()), timeout_s=300,
                        what="a committed memory copy")

        def both() -> str | None:
            committed = ray.get(coordinator.memory_committed.remote())
            copies = [c for c in memory_copies(coordinator) if c[0] == committed]
            held = copies
            peers = [c for c in copies if c[3] is not None]
            return (committed if committed.endswith(f"{HOLD:09d}_a0") and len(held) == 2
                    and len(peers) == 2 else None)

        path = wait_for(both, timeout_s=300, what=f"both ranks' two copies of step {HOLD}")
        return path

    def finish(self):
        if self.release:
            open(self.release, "w").close()
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


def _restored(events):
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored, [e["kind"] for e in events]
    return restored[0]


@pytest.mark.timeout(900)
def test_worker_killed_restores_from_memory(clean, tmp_path):
    weights, events = Run(tmp_path, "kill", faults="kill:rank=1,step=5").finish()
    assert _equal(weights, clean)
    restored = _restored(events)
    assert restored["step"] == 4
    assert restored["tier"] == "memory" and restored.get("disk_hashing_skipped") is True
    assert restored["copy"] == "own"  # every node is alive: the copy where it was saved


@pytest.mark.timeout(900)
def test_an_own_copy_that_does_not_match_the_manifest_is_served_by_the_peer(clean, tmp_path):

    run = Run(tmp_path, "corrupt_own", faults="kill:rank=1,step=5", hold=True)
    run.held_at_hold()
    assert _corrupt_copies(run.trainer._coordinator, 0, ("own",))
    weights, events = run.finish()
    assert _equal(weights, clean)
    restored = _restored(events)
    assert restored["step"] == 4
    # rank 0's own copy failed its sha256 check, its peer copy verified: both ranks (rank 1
    # restores rank 0's replicated shard too) read rank 0's shard from the peer copy
    assert restored["tier"] == "memory" and restored.get("disk_hashing_skipped") is True
    assert restored["copy"] == "peer"


@pytest.mark.timeout(900)
def test_copy_that_does_not_match_the_manifest_is_read_from_disk(clean, tmp_path):

    run = Run(tmp_path, "corrupt", faults="kill:rank=1,step=5", hold=True)
    run.held_at_hold()
    assert _corrupt_copies(run.trainer._coordinator, 0)
    weights, events = run.finish()
    assert _equal(weights, clean)
    restored = _restored(events)
    assert restored["step"] == 4
    # both of rank 0's copies failed their sha256 check: the checkpoint was verified on disk
    # in full, and
    # both ranks read it there (rank 1 saved no state: it restores rank 0's replicated shard)
    assert restored["tier"] == "disk"
    assert "disk_hashing_skipped" not in restored


@pytest.mark.timeout(900)
def test_both_nodes_removed_their_ranks_read_the_disk(clean, cluster, tmp_path):

    run = Run(tmp_path, "node", hold=True)
    path = run.held_at_hold()
    held = [(p, r, n) for p, r, n, _ in memory_copies(run.trainer._coordinator)]
    # every shard has a copy on each node (its own and its peer's): both nodes lost, none left
    lost_nodes = {cluster.remove_worker_node(0), cluster.remove_worker_node(0)}
    lost_ranks = sorted(r for p, r, n in held if p == path and n in lost_nodes)
    assert lost_ranks == [0, 1], held
    cluster.add_worker_node()
    cluster.add_worker_node()
    weights, events = run.finish()
    assert _equal(weights, clean)
    restored = _restored(events)
    assert restored["step"] == HOLD
    tiers = restored.get("tiers") or [restored["tier"]] * 2
    assert all(tiers[r] == "disk" for r in lost_ranks)
    assert "disk_hashing_skipped" not in restored
