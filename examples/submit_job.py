"""A rayguard training job made for ``ray job submit``.

Run it on any Ray cluster from the root of the rayguard checkout::

    ray job submit --address http://HEAD:8265 --working-dir . \\
        --runtime-env cluster-configs/job/runtime_env.yaml \\
        -- python examples/submit_job.py --num-workers 2 --steps 20

``--working-dir .`` ships this checkout (rayguard itself and examples/) to the driver and every
worker; ``cluster-configs/job/runtime_env.yaml`` leaves out what the job does not need and sets
rayguard's environment. Without ``ray job submit`` the script starts a private local cluster
(``python examples/submit_job.py``), or joins ``--address``.

Settings, two ways (docs/cluster.md):
  * command-line flags for the job's shape and for ``GuardConfig`` / ``HealthConfig`` fields
    (``--seed``, ``--deterministic``, ``--stall-timeout-s``, ``--nan-policy``,
    ``--max-restarts``, ``--faults``, ``--no-preflight``); ``--help`` lists them;
  * ``RAYGUARD_*`` environment variables, which rayguard reads itself in the driver and every
    worker (``RAYGUARD_LOG_LEVEL``, ``RAYGUARD_FAULTS``, ``RAYGUARD_SERIALIZERS``,
    ``RAYGUARD_TOPOLOGY``): put them in the runtime_env's ``env_vars`` (or
    ``--runtime-env-json '{"env_vars": {...}}'``). A flag wins over the environment.

The model is a small MLP fitted to a synthetic linear target; on CPU, 2 workers and 20 steps
take seconds. Rank 0 prints ``step N loss X`` lines; the driver ends with
``rayguard job finished ...``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

FEATURES = 32
HIDDEN = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    job = p.add_argument_group("job")
    job.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or "local",
                     help="Ray cluster to join; `ray job submit` sets RAY_ADDRESS, "
                          "'local' starts a private cluster")
    job.add_argument("--num-workers", type=int, default=2, help="training workers (ranks)")
    job.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    job.add_argument("--cpus-per-worker", type=float, default=1.0)
    job.add_argument("--steps", type=int, default=20, help="optimizer steps")
    job.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    job.add_argument("--lr", type=float, default=0.05)
    job.add_argument("--log-every", type=int, default=1, help="print a progress line every N steps")
    job.add_argument("--checkpoint-every", type=int, default=0,
                     help="take a verified checkpoint every N steps (0: none); on a multi-node "
                          "cluster use a --storage-path every node sees")
    job.add_argument("--storage-path", default=None,
                     help="run directory root (local path, NFS, s3://, gs://); "
                          "default: Ray's ~/ray_results")
    job.add_argument("--name", default=None, help="run name; default: rayguard-job-<time>")
    guard = p.add_argument_group("rayguard (GuardConfig / HealthConfig)")
    guard.add_argument("--seed", type=int, default=0, help="base seed; each rank derives its own")
    guard.add_argument("--deterministic", action="store_true",
                       help="torch deterministic algorithms")
    guard.add_argument("--stall-timeout-s", type=float, default=None,
                       help="restart a rank that makes no progress this long; "
                            "default: adaptive")
    guard.add_argument("--nan-policy", choices=("restart", "fail"), default=None,
                       help="what a NaN/inf loss does (default: HealthConfig's)")
    guard.add_argument("--max-restarts", type=int, default=None,
                       help="restart budget (default: HealthConfig's)")
    guard.add_argument("--faults", default=None,
                       help="fault-injection spec, e.g. 'kill:rank=1,step=5' "
                            "(default: RAYGUARD_FAULTS)")
    guard.add_argument("--no-preflight", action="store_true",
                       help="skip the doctor's per-worker checks at start-up")
    args = p.parse_args(argv)
    if args.num_workers < 1 or args.steps < 1 or args.batch_size < 1 or args.log_every < 1:
        p.error("--num-workers, --steps, --batch-size and --log-every must be >= 1")
    return args


def build_guard_config(args: argparse.Namespace) -> Any:
    """The GuardConfig the flags ask for; fields left unset keep rayguard's defaults."""
    import rayguard

    health_kwargs: dict[str, Any] = {}
    if args.stall_timeout_s is not None:
        health_kwargs["stall_timeout_s"] = args.stall_timeout_s
    if args.nan_policy is not None:
        health_kwargs["nan_policy"] = args.nan_policy
    if args.max_restarts is not None:
        health_kwargs["max_restarts"] = args.max_restarts
    return rayguard.GuardConfig(
        seed=args.seed,
        deterministic=args.deterministic,
        health=rayguard.HealthConfig(**health_kwargs),
        preflight=not args.no_preflight,
        faults=args.faults,
    )


def train_fn(config: dict[str, Any]) -> None:
    """Runs in every worker: DDP over a small MLP on synthetic data, a report per step."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import rayguard

    ctx = rayguard.train.get_context()
    torch.manual_seed(1234)  # the same initial weights and target on every rank
    true_w = torch.randn(FEATURES, 1)
    model: torch.nn.Module = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
    ).to(ctx.device)
    if ctx.world_size > 1:
        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=device_ids)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])

    start = 0
    every = config["checkpoint_every"]
    if every:
        state = rayguard.train.load_state()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            start = state["step"] + 1
            if ctx.rank == 0:
                print(f"resumed at step {start} (attempt {ctx.attempt})", flush=True)

    data_seed = (ctx.seed if ctx.seed is not None else 0) + 7919 * ctx.rank
    gen = torch.Generator().manual_seed(data_seed)
    for step in range(start, config["steps"]):
        x = torch.randn(config["batch_size"], FEATURES, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(config["batch_size"], 1, generator=gen)
        x, y = x.to(ctx.device), y.to(ctx.device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = float(loss.item())
        metrics = {"loss": value, "step": step}
        if every and (step + 1) % every == 0:
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            rayguard.train.report(metrics, state=state if ctx.rank == 0 else None)
        else:
            rayguard.train.report(metrics)
        if ctx.rank == 0 and (step % config["log_every"] == 0 or step == config["steps"] - 1):
            print(f"step {step} loss {value:.4f}", flush=True)


def rayguard_env() -> dict[str, str]:
    """The RAYGUARD_* variables this driver sees (they reach the workers too)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("RAYGUARD_")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import ray
    from ray.train import RunConfig, ScalingConfig

    import rayguard

    guard_config = build_guard_config(args)  # a bad flag fails here, before Ray starts
    ray.init(address=args.address, log_to_driver=True)
    resources = ray.cluster_resources()
    print(f"rayguard {rayguard.__version__} on Ray {ray.__version__}: "
          f"{int(resources.get('CPU', 0))} CPUs, {int(resources.get('GPU', 0))} GPUs; "
          f"{args.num_workers} workers, {args.steps} steps, "
          f"env {rayguard_env() or '{}'}", flush=True)

    name = args.name or time.strftime("rayguard-job-%Y%m%d-%H%M%S")
    trainer = rayguard.RobustTrainer(
        train_fn,
        train_loop_config={
            "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
            "log_every": args.log_every, "checkpoint_every": args.checkpoint_every,
        },
        scaling_config=ScalingConfig(
            num_workers=args.num_workers, use_gpu=args.use_gpu,
            resources_per_worker={"CPU": args.cpus_per_worker},
        ),
        run_config=RunConfig(storage_path=args.storage_path, name=name),
        guard_config=guard_config,
    )
    result = trainer.fit()
    if result.error is not None:
        print(f"rayguard job failed: {result.error}", flush=True)
        return 1
    # Result.metrics holds the metrics of the last *checkpointed* report (Ray's behaviour);
    # rayguard keeps the last reported ones, checkpoint or not.
    metrics = trainer.last_metrics or {}
    loss = f"{metrics['loss']:.4f}" if "loss" in metrics else "not reported"
    print(f"rayguard job finished: run {name}, steps {args.steps}, "
          f"final loss {loss}, path {result.path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
