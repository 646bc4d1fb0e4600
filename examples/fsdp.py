"""FSDP2 on CPU workers: verified, reshardable checkpoints with ``sharded=``.

A 2-worker run trains a small model sharded with ``fully_shard`` (gloo, AdamW) and checkpoints
it through torch.distributed.checkpoint under a rayguard manifest. Then the same run
directory is resumed on 1 worker: the checkpoint is verified, resharded from 2 ranks to 1 by
DCP, and training carries on from the next step.

    .venv/bin/python examples/fsdp.py        # about a minute: two short runs
"""

from __future__ import annotations

import tempfile

import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.cli import shell_command
from rayguard.events import read as read_events


def train_fn(config: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sharded = {"model": model, "optim": opt}

    state = rayguard.train.load_state(sharded=sharded)  # in place, resharded to this size
    start = 0 if state is None else state["step"] + 1
    for step in range(start, config["steps"]):
        x = torch.randn(32, 16)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rayguard.train.report({"loss": loss.item(), "step": step}, sharded=sharded,
                              state={"step": step})


def fit(storage: str, workers: int, steps: int):
    trainer = rayguard.RobustTrainer(
        train_fn,
        train_loop_config={"steps": steps},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(storage_path=storage, name="fsdp"),
        guard_config=rayguard.GuardConfig(seed=0, numa="off"),
    )
    return trainer.fit()


def main() -> None:
    storage = tempfile.mkdtemp(prefix="rayguard-fsdp-")
    first = fit(storage, workers=2, steps=4)
    print(f"2 workers: steps 0-3, last loss {first.metrics['loss']:.4f}")
    second = fit(storage, workers=1, steps=8)  # same run directory, one worker
    restored = [e for e in read_events(second.path) if e["kind"] == "restored"][-1]
    print(f"1 worker: {restored['detail']}")
    print(f"1 worker: steps 4-7, last loss {second.metrics['loss']:.4f}; checkpoints in {second.path}")
    print(f"inspect from the shell: {shell_command('checkpoint', 'ls', second.path)}")


if __name__ == "__main__":
    main()
