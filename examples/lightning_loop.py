"""A PyTorch Lightning loop, written as Ray Train's docs write it, under
rayguard.RobustTrainer: ``RayDDPStrategy``, ``RayLightningEnvironment``,
``RayTrainReportCallback`` (a checkpoint with ``ray.train.report`` at every epoch end) and
``prepare_trainer``; a restart resumes with ``trainer.fit(..., ckpt_path=...)`` from
``ray.train.get_checkpoint()``. No line of the loop names rayguard: every report is watched
(progress, NaN/inf in ``train_loss``), every checkpoint gets a sha256 manifest, and a restart
gets the newest checkpoint that verifies.

    .venv/bin/python examples/lightning_loop.py [--storage-path DIR] [--epochs N] [--faults SPEC]

A LightningModule with one Linear layer on synthetic regression data; 2 CPU workers (gloo).
Ends by printing the run directory and what happened.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

import lightning.pytorch as pl
import ray
import ray.train
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.lightning import (
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)

import rayguard
from rayguard.cli import shell_command
from rayguard.events import read as read_events


class Regression(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)  # what RayTrainReportCallback reports
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def synthetic_data(n: int = 256) -> torch.utils.data.TensorDataset:
    """The same data on every rank and every attempt (its own generator)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = x @ (torch.arange(8, dtype=torch.float32) / 8).unsqueeze(-1) + 0.01 * torch.randn(n, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def train_func(config):
    pl.seed_everything(rayguard.train.get_context().seed or 0)  # this rank's seed
    model = config.get("module_fn", Regression)()
    loader = torch.utils.data.DataLoader(synthetic_data(), batch_size=16, shuffle=True)
    # [1] Configure the Lightning Trainer for Ray Train.
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback(), *config.get("callbacks", [])],
        enable_checkpointing=False,  # RayTrainReportCallback checkpoints instead
        enable_progress_bar=False,
        logger=False,
    )
    trainer = prepare_trainer(trainer)  # [2] prepare the Trainer

    checkpoint = ray.train.get_checkpoint()  # after a restart: the newest that verifies
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_dataloaders=loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path",
                        default=os.path.expanduser("~/ray_results/rayguard-lightning"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--faults", default=None,
                        help='rayguard fault injection, e.g. "kill:rank=1,step=24" (SIGKILL '
                             'rank 1 at its report of global step 24, the end of epoch 2: the '
                             'run resumes from the end of epoch 1)')
    parser.add_argument("--recovery", choices=("restart", "live"), default="restart",
                        help='"live": a failed worker is replaced alone and a NaN rolls back in '
                             'place, the other workers keep their processes; "restart" '
                             "(default): the whole worker group restarts")
    args = parser.parse_args()

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    trainer = rayguard.RobustTrainer(  # was: ray.train.torch.TorchTrainer(...)
        train_func,
        train_loop_config={"epochs": args.epochs},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=args.storage_path,
                             name=time.strftime("run-%Y%m%d-%H%M%S")),
        guard_config=rayguard.GuardConfig(faults=args.faults, recovery=args.recovery),
    )
    result = trainer.fit()
    print(f"\nfinished: train_loss {result.metrics['train_loss']:.4f} "
          f"after epoch {result.metrics['epoch']}")
    print(f"run directory:   {result.path}")
    print(f"last checkpoint: {result.checkpoint.path}")
    with result.checkpoint.as_directory() as d:  # [3] load the trained model
        model = Regression.load_from_checkpoint(
            os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    print(f"loaded: weight {model.layer.weight.detach().numpy().round(2).tolist()}")
    events = read_events(result.path)
    sealed = sum(e["kind"] == "checkpoint_committed" for e in events)
    notable = collections.Counter(e["kind"] for e in events if e["kind"] in (
        "fault_injected", "stall_detected", "nan_detected", "checkpoint_rejected", "restart"))
    print(f"what happened:   {sealed} checkpoints sealed with rayguard's manifest; "
          + (", ".join(f"{k} x{n}" for k, n in notable.items()) or "no fault, no restart"))
    print(f"the whole story: {shell_command('events', result.path)}")


if __name__ == "__main__":
    main()
