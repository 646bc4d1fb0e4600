"""Asynchronous checkpoints: report(state=...) returns once the state is snapshotted; the save
persists in the background, and fit() returns after the last one committed.

    .venv/bin/python examples/async_checkpoints.py [--storage-path DIR]

The event log's checkpoint_committed events say how long the loop was blocked (blocked_s),
how long the snapshot took and whether a checkpoint waited for the previous one
(backpressure_s); see docs/checkpointing.md.
"""

import argparse
import tempfile

import ray
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.events import read as read_events


def train_fn(config):
    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    for step in range(start, config["steps"]):
        loss = model(torch.randn(32, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # the loop may change model and optimizer right after: the snapshot is already taken
        rayguard.train.report({"loss": loss.item(), "step": step},
                              state={"model": model.state_dict(), "optim": opt.state_dict(),
                                     "step": step} if ctx.rank == 0 else None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage-path", default=tempfile.mkdtemp(prefix="rayguard-async-"))
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2)  # a new local cluster, never another one
    trainer = rayguard.RobustTrainer(
        train_fn, train_loop_config={"steps": 20},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=args.storage_path, name="async"),
        guard_config=rayguard.GuardConfig(
            checkpoint=rayguard.CheckpointConfig(mode="async"), numa="off"))
    result = trainer.fit()
    committed = [e for e in read_events(result.path) if e["kind"] == "checkpoint_committed"]
    blocked = sum(e["blocked_s"] for e in committed)
    print(f"{len(committed)} checkpoints committed; the loop was blocked {blocked:.3f} s in all; "
          f"last: {result.checkpoint.path}")


if __name__ == "__main__":
    main()
