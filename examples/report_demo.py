"""A short run with injected faults, then its report: 2 CPU workers train a small model
(DDP on gloo) with a checkpoint every 5 steps while rayguard kills rank 1 at step 12, hangs
rank 0 at step 24 (the watchdog detects it after 20 s) and poisons the loss with NaN at step
36. The run recovers from each and finishes; then ``rayguard report`` writes one HTML file.

    .venv/bin/python examples/report_demo.py [-o report.html] [--steps 48]
    rayguard events <run dir>            # the same story as a table
"""

import argparse
import os
import tempfile
import time

import ray
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard
from rayguard.cli import shell_command

FAULTS = "kill:rank=1,step=12;hang:rank=0,step=24;nan:rank=0,step=36"


def train_fn(config):
    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.arange(16, dtype=torch.float32) / 16
    state = rayguard.train.load_state()
    start = 0 if state is None else state["step"] + 1
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    for step in range(start, config["steps"]):
        x = torch.randn(64, 16)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), x @ true_w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(config["step_s"])  # a step long enough to see on the timeline
        save = step % 5 == 4 and ctx.rank == 0
        state = {"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}
        rayguard.train.report({"loss": loss.item(), "step": step}, state=state if save else None)


def run(storage: str, steps: int = 48, step_s: float = 0.1, faults: str = FAULTS) -> str:
    """Run the job; returns its run directory."""
    health = rayguard.HealthConfig(stall_timeout_s=20.0, step_summary_interval_s=1.0,
                                   straggler_window_s=10.0, max_restarts=5)
    trainer = rayguard.RobustTrainer(
        train_fn, train_loop_config={"steps": steps, "step_s": step_s},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=storage, name="report_demo"),
        guard_config=rayguard.GuardConfig(seed=0, numa="off", faults=faults, health=health),
    )
    return trainer.fit().path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="report.html")
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    # the report needs the extra: pip install 'rayguard[report]'
    from rayguard.observe.report import write_report

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    run_dir = run(tempfile.mkdtemp(prefix="rayguard-report-demo-"), steps=args.steps)
    write_report(run_dir, args.output)
    print(f"run directory: {run_dir}")
    print(f"report: {os.path.abspath(args.output)}  (open it in a browser; it works offline)")
    print(f"events: {shell_command('events', run_dir)}")


if __name__ == "__main__":
    main()
