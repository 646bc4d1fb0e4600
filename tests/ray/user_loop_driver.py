"""A user's driver: a loop written as Ray's docs write it (``prepare_model``,
``Checkpoint.from_directory``, ``ray.train.get_checkpoint()``, metrics ``{"loss", "epoch"}``)
under a plain swap of ``TorchTrainer`` for ``RobustTrainer`` (no ``GuardConfig``), run as a
script by tests/ray/test_user_loop.py with Ray's and rayguard's default console output.

    python user_loop_driver.py GCS_ADDRESS WORK_DIR pair
        fit "quiet" (no fault), then fit "killed" (rank 1 SIGKILLs itself once, in epoch
        KILL_EPOCH) with the same RunConfig object; each fit's console output ends with a
        marker line; the last line is JSON: per fit, the error, the last epoch and rank 0's
        PIDs, and whether fit() left the RunConfig's worker environment as given.
    python user_loop_driver.py GCS_ADDRESS WORK_DIR driver-kill
        a fit on a remote filesystem (pyarrow SubTreeFileSystem over WORK_DIR/bucket) whose
        driver SIGKILLs itself once rank 0 is 3 epochs in and one upload interval has passed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time

EPOCHS = 8
KILL_EPOCH = 4
MARK = "=== fit done:"


def train_func(config):
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F
    from ray.train import Checkpoint

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for epoch in range(start, config["epochs"]):
        for i in range(0, 64, 16):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x[i:i + 16]), y[i:i + 16])
            loss.backward()
            optimizer.step()
        time.sleep(config["epoch_s"])
        if rank == 0:
            with open(config["pids"], "a") as f:
                f.write(f"{epoch} {os.getpid()}\n")
        marker = config.get("kill_marker")
        if marker and rank == 1 and epoch == KILL_EPOCH and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.TemporaryDirectory() as d:
            saved = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch},
                           os.path.join(d, "model.pt"))
                saved = Checkpoint.from_directory(d)
            ray.train.report({"loss": loss.item(), "epoch": epoch}, checkpoint=saved)


def _trainer(work, name, run_config, **config):
    from ray.train import ScalingConfig

    import rayguard

    run_config.name = name
    return rayguard.RobustTrainer(
        train_func, scaling_config=ScalingConfig(num_workers=2), run_config=run_config,
        train_loop_config={"pids": os.path.join(work, f"{name}.pids"), **config})


def _pids(work, name):
    with open(os.path.join(work, f"{name}.pids")) as f:
        return [tuple(int(v) for v in line.split()) for line in f]


def pair(work):
    from ray.train import RunConfig

    env = {"env_vars": {"USER_VAR": "1"}}
    run_config = RunConfig(storage_path=os.path.join(work, "runs"), worker_runtime_env=env)
    out = {}
    for name, extra in (("quiet", {}),
                        ("killed", {"kill_marker": os.path.join(work, "killed.marker")})):
        result = _trainer(work, name, run_config, epochs=EPOCHS, epoch_s=0.3, **extra).fit()
        time.sleep(1.0)  # the workers' last forwarded lines arrive before the marker
        sys.stderr.flush()
        print(f"{MARK} {name}", flush=True)
        out[name] = {"error": None if result.error is None else str(result.error),
                     "epoch": result.metrics.get("epoch"), "pids": _pids(work, name),
                     "run_dir": os.path.join(work, "runs", name)}
    out["env_untouched"] = run_config.worker_runtime_env == {"env_vars": {"USER_VAR": "1"}}
    print(json.dumps(out), flush=True)


def driver_kill(work):
    import pyarrow.fs as pafs
    from ray.train import RunConfig

    bucket = os.path.join(work, "bucket")
    os.makedirs(bucket, exist_ok=True)
    fs = pafs.SubTreeFileSystem(bucket, pafs.LocalFileSystem())
    run_config = RunConfig(storage_path="runs", storage_filesystem=fs)
    from rayguard.events.upload import UPLOAD_INTERVAL_S

    trainer = _trainer(work, "remote", run_config, epochs=200, epoch_s=0.5)

    def kill_when_under_way():
        # Once rank 0 is 3 epochs in, the attempt's start is in the local log: one upload
        # interval (and a second to spare) later it must be in storage too.
        path = os.path.join(work, "remote.pids")
        under_way = None
        while True:
            time.sleep(0.2)
            if under_way is None and os.path.exists(path) and len(_pids(work, "remote")) >= 3:
                under_way = time.monotonic()
            if under_way is not None and time.monotonic() - under_way > UPLOAD_INTERVAL_S + 1:
                print("=== killing the driver", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill_when_under_way, daemon=True).start()
    trainer.fit()
    print("=== fit ended before the driver was killed", flush=True)
    sys.exit(3)


def main() -> None:
    address, work, mode = sys.argv[1:4]
    import ray

    ray.init(address=address)
    {"pair": pair, "driver-kill": driver_kill}[mode](work)


if __name__ == "__main__":
    main()
