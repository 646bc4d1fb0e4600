"""rayguard quickstart: 2 CPU workers on a local Ray cluster train a small model on synthetic
data with DDP (gloo), verified checkpoints every few steps, and print the loss falling.

    make quickstart          # or: .venv/bin/python examples/quickstart.py
"""

import tempfile

import ray
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard


def train_fn(config):
    ctx = rayguard.train.get_context()  # rank, world_size, device, seed, attempt
    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    true_w = torch.arange(16, dtype=torch.float32) / 16

    state = rayguard.train.load_state()  # None on a fresh start
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    for step in range(start, config["steps"]):
        x = torch.randn(64, 16)  # this rank's batch (seeded per rank by rayguard)
        y = x @ true_w + 0.01 * torch.randn(64)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        save = step % 10 == 9 and ctx.rank == 0
        state = {"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}
        rayguard.train.report({"loss": loss.item(), "step": step}, state=state if save else None)
        if ctx.rank == 0 and step % 5 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # a new local cluster
    trainer = rayguard.RobustTrainer(
        train_fn,
        train_loop_config={"lr": 0.05, "steps": 60},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="rayguard-quickstart-"),
                             name="quickstart"),
        guard_config=rayguard.GuardConfig(seed=0),
    )
    result = trainer.fit()
    print(f"final loss {result.metrics['loss']:.4f}; checkpoint {result.checkpoint.path}")
    print(f"event log: {result.path}/rayguard_events.jsonl")


if __name__ == "__main__":
    main()
