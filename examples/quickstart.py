"""rayguard quickstart: 2 CPU workers on a local Ray cluster train a small model on synthetic
data with DDP (gloo) and a verified checkpoint every 10 steps.

    make quickstart          # or: .venv/bin/python examples/quickstart.py [--storage-path DIR]

Each run goes into its own directory under ``~/ray_results/rayguard-quickstart`` (or
``--storage-path``); the script ends by printing it and the commands to look inside.
"""

import argparse
import os
import time

import ray
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.cli import shell_command

CHECKPOINT_EVERY = 10  # report(state=...) takes a checkpoint: every N steps, not every step


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
        save = step % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1 and ctx.rank == 0
        state = {"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}
        rayguard.train.report({"loss": loss.item(), "step": step}, state=state if save else None)
        if ctx.rank == 0 and step in (0, config["steps"] - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default=os.path.expanduser("~/ray_results/rayguard-quickstart"),
                        help="where runs are written (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    ray.init(address="local", num_cpus=2, include_dashboard=False)  # a new local cluster
    trainer = rayguard.RobustTrainer(
        train_fn,
        train_loop_config={"lr": 0.05, "steps": args.steps},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=args.storage_path,
                             name=time.strftime("run-%Y%m%d-%H%M%S")),
        guard_config=rayguard.GuardConfig(seed=0),
    )
    result = trainer.fit()
    loss = trainer.last_metrics["loss"]  # Result.metrics holds only checkpointed reports
    print(f"\nfinished: final loss {loss:.4f} after {args.steps} steps")
    print(f"run directory:   {result.path}")
    print(f"last checkpoint: {result.checkpoint.path}")
    print("look inside:")
    print(f"  {shell_command('checkpoint', 'ls', result.path)}")
    print(f"  {shell_command('events', result.path)}")
    print(f"  {shell_command('report', result.path)}"
          "   # needs rayguard[report] (plotly)")


if __name__ == "__main__":
    main()
