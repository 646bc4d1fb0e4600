"""A Hugging Face ``accelerate`` loop, unchanged, under rayguard.RobustTrainer.

``Accelerator()`` finds the process group Ray Train already set up (gloo on CPU, NCCL on
GPU); rayguard's set-up (seeding, pinning, watchdog) runs before it.

    .venv/bin/python examples/accelerate_loop.py
"""

import tempfile

import ray
import torch
from ray.train import RunConfig, ScalingConfig

import rayguard


def train_fn(config):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for epoch in range(config["epochs"]):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
        rayguard.train.report({"loss": loss.item(), "epoch": epoch,
                               "processes": accelerator.num_processes})


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    result = rayguard.RobustTrainer(
        train_fn, train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(), name="accelerate"),
    ).fit()
    print("done:", result.path)


if __name__ == "__main__":
    main()
