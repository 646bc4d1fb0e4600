"""Per-kill cost with Ray's ``TorchftConfig``: ``TorchTrainer`` vs ``RobustTrainer``.

The same loop under both (Ray's torchft example, ``ray/train/v2/examples/pytorch/
torchft_linear_example.py``, 2 CPU workers, gloo, lighthouse ``min_replicas=2``), once
without a fault and once with rank 1 SIGKILLed at its report of ``--kill-step`` (by the
loop's own wrapper, the same in both trainers). Ray replaces rank 1's replica group alone;
rank 0 keeps its process. Printed per trainer: the fault-free wall time, the wall time with
the kill, their difference (the kill's cost), the time from the kill to rank 0's next
report, and whether rank 0 kept its PID. ``--live`` adds rayguard's own live recovery
(``GuardConfig(recovery="live")`` on Ray's plain ``TorchConfig``, no torchft, no per-step
quorum) on a DDP loop of the same shape: ``--steps`` steps of ``--step-s`` seconds, a report
every 10 steps that checkpoints ``report(state=)`` with the memory tier, rank 1 killed as
it starts step ``--kill-step`` (just after a commit: nothing is replayed, as nothing is in
the torchft run; a kill between commits adds the steps since the last one). Run under the shared lock:

    flock /tmp/rayguard-ray.lock .venv/bin/python tests/benchmarks/bench_torchft.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time


def loop(config):
    """Ray's example loop; every report leaves (rank, pid, step, time) in a file, and rank 1
    kills itself once at ``kill_step``."""
    import ray.train
    from ray.train.v2.examples.pytorch.torchft_linear_example import train_func

    rank = ray.train.get_context().get_world_rank()
    real_report = ray.train.report

    def report(metrics, *args, **kwargs):
        step = int(metrics["step"])
        with open(config["log"], "a") as f:
            f.write(json.dumps({"rank": rank, "pid": os.getpid(), "step": step,
                                "t": time.time()}) + "\n")
        marker = config["log"] + ".killed"
        if config.get("kill_step") == step and rank == 1 and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return real_report(metrics, *args, **kwargs)

    ray.train.report = report
    try:
        return train_func(config)
    finally:
        ray.train.report = real_report


def live_loop(config):
    """A DDP loop of the torchft example's shape, with rayguard's exact resume: a report
    every 10 steps (with its state), rank 1 killed once as it starts ``kill_step``."""
    import torch

    import rayguard

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    state = rayguard.train.load_state()
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    marker = config["log"] + ".killed"
    for step in range(start, config["num_steps"]):
        if config.get("kill_step") == step and ctx.rank == 1 and not os.path.exists(marker):
            with open(marker, "w") as f:  # right after the commit before it: no replay
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        end = time.perf_counter() + config["step_s"]
        loss = ddp(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(max(0.0, end - time.perf_counter()))
        if step % 10 != 9:
            continue
        with open(config["log"], "a") as f:
            f.write(json.dumps({"rank": ctx.rank, "pid": os.getpid(), "step": step,
                                "t": time.time()}) + "\n")
        rayguard.train.report({"loss": loss.item(), "step": step}, state={
            "model": model.state_dict(), "optim": opt.state_dict(), "step": step})


def run_live(steps: int, step_s: float, kill_step: int | None, root: str) -> dict:
    from ray.train import RunConfig, ScalingConfig

    import rayguard

    name = f"live-{'kill' if kill_step else 'clean'}"
    log = os.path.join(root, name + ".jsonl")
    started = time.perf_counter()
    rayguard.RobustTrainer(
        live_loop, train_loop_config={"num_steps": steps, "step_s": step_s, "log": log,
                                      "kill_step": kill_step},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=root, name=name),
        guard_config=rayguard.GuardConfig(numa="off", recovery="live", progress_interval_s=None,
                                          checkpoint=rayguard.CheckpointConfig(
                                              memory_tier=True))).fit()
    return _figures(log, time.perf_counter() - started, kill_step)


def _figures(log: str, wall: float, kill_step: int | None) -> dict:
    with open(log) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = {"wall_s": wall, "rank0_pids": len({r["pid"] for r in rows if r["rank"] == 0})}
    if kill_step:
        with open(log + ".killed") as f:
            killed = float(f.read())
        after = [r["t"] for r in rows if r["rank"] == 0 and r["t"] > killed + 1e-3]
        out["kill_to_next_report_s"] = min(after) - killed if after else None
    return out


def run(kind: str, steps: int, kill_step: int | None, root: str) -> dict:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2.torch.torchft_config import TorchftConfig

    import rayguard

    name = f"{kind}-{'kill' if kill_step else 'clean'}"
    log = os.path.join(root, name + ".jsonl")
    kw = dict(train_loop_config={"num_steps": steps, "report_interval": 10, "log": log,
                                 "kill_step": kill_step},
              scaling_config=ScalingConfig(num_workers=2),
              torch_config=TorchftConfig(lighthouse_kwargs={"min_replicas": 2}, backend="gloo"),
              run_config=RunConfig(storage_path=root, name=name,
                                   failure_config=FailureConfig(max_failures=2)))
    started = time.perf_counter()
    if kind == "TorchTrainer":
        TorchTrainer(loop, **kw).fit()
    else:
        rayguard.RobustTrainer(loop, guard_config=rayguard.GuardConfig(numa="off"), **kw).fit()
    return _figures(log, time.perf_counter() - started, kill_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kill-step", type=int, default=100)
    parser.add_argument("--live", action="store_true",
                        help="also rayguard's own live recovery (no torchft), same shape")
    parser.add_argument("--step-s", type=float, default=0.05,
                        help="--live: seconds per step of its loop")
    parser.add_argument("--only-live", action="store_true", help="--live alone")
    args = parser.parse_args()
    import ray

    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
    # the same controller poll for both (Ray: 2 s, which every report would wait for;
    # RobustTrainer sets 50 ms itself): the processes of the cluster inherit it
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.05")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    figures = {}
    with tempfile.TemporaryDirectory() as root:
        kinds = [] if args.only_live else ["TorchTrainer", "RobustTrainer"]
        for kind in kinds + (["RobustTrainer live"] if args.live or args.only_live else []):
            if kind == "RobustTrainer live":
                clean = run_live(args.steps, args.step_s, None, root)
                kill = run_live(args.steps, args.step_s, args.kill_step, root)
            else:
                clean = run(kind, args.steps, None, root)
                kill = run(kind, args.steps, args.kill_step, root)
            figures[kind] = {"clean_s": round(clean["wall_s"], 2),
                             "kill_s": round(kill["wall_s"], 2),
                             "per_kill_s": round(kill["wall_s"] - clean["wall_s"], 2),
                             "kill_to_next_report_s": kill["kill_to_next_report_s"],
                             "rank0_kept_pid": kill["rank0_pids"] == 1}
    ray.shutdown()
    print(json.dumps(figures, indent=1))
    if "TorchTrainer" in figures:
        base, ours = figures["TorchTrainer"], figures["RobustTrainer"]
        print(f"per-kill cost: RobustTrainer {ours['per_kill_s']} s, TorchTrainer "
              f"{base['per_kill_s']} s; fault-free: {ours['clean_s']} s vs {base['clean_s']} s "
              f"(ratio {ours['clean_s'] / base['clean_s']:.2f})")
    if "RobustTrainer live" in figures:
        live = figures["RobustTrainer live"]
        print(f"rayguard live (no torchft): per-kill cost {live['per_kill_s']} s, fault-free "
              f"{live['clean_s']} s, kill to rank 0's next report "
              f"{live['kill_to_next_report_s']:.2f} s")


if __name__ == "__main__":
    main()
