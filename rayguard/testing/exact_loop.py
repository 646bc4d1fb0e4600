"""A DDP loop whose weights are exact only if a resume is exact: the recovery tests' loop.

Each entry into the function appends one line to ``config["log"]`` (rank, pid, attempt, Ray's
view of the rank, the step it resumed from, what ``ray.train.get_checkpoint()`` answered), and
rank 0 appends each completed step, with its time, to ``config["log"] + ".steps"``; rank 0
saves the final weights to ``config["out"]``. With ``config["settle_memory"]`` each step waits
for the memory tier's background registration of its copies. Dropout and the rank's own
random batches make the weights depend on every rank's RNG state, so only an exact restore of
the model, the optimizer and the RNG reproduces a run without faults bit for bit.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def read_lines(path: str) -> list[dict[str, Any]]:
    """The JSON lines a loop wrote (``[]``: none)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def exact_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    import rayguard

    ctx = rayguard.train.get_context()
    rctx = ray.train.get_context()
    entered = {"rank": ctx.rank, "pid": os.getpid(), "ctx": id(ctx), "attempt": ctx.attempt,
               "node": ctx.node_id,
               "ray_ctx": [rctx.get_world_rank(), rctx.get_world_size(), rctx.get_local_rank(),
                           rctx.get_experiment_name(), rctx.get_storage().experiment_fs_path]}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    state = rayguard.train.load_state()
    checkpoint = ray.train.get_checkpoint()
    entered["ray_checkpoint"] = None if checkpoint is None else os.path.basename(checkpoint.path)
    entered["loaded_step"] = None if state is None else state["step"]
    with open(config["log"], "a") as f:
        f.write(json.dumps(entered) + "\n")
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"] + 1
    every = int(config.get("every", 1))
    step_s = float(config.get("step_s", 0.0))
    for step in range(start, config["steps"]):
        x = torch.randn(16, 8)  # the rank's RNG: exact only if RNG state is restored
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step_s:
            time.sleep(step_s)
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        if ctx.rank == 0:
            with open(config["log"] + ".steps", "a") as f:
                f.write(json.dumps({"step": step, "t": time.time(), "pid": os.getpid()}) + "\n")
        keep = ctx.rank == 0 and (step + 1) % every == 0
        rayguard.train.report({"loss": loss.item(), "step": step}, state=state if keep else None)
        if config.get("settle_memory"):
            # the memory tier registers a step's copies in the background: wait for them, so
            # that a fault at the next step finds them (a kill during the registration is the
            # disk fallback, a path of its own)
            from rayguard.train.memory_tier import flush

            flush()
    dist.barrier()
    if ctx.rank == 0:
        torch.save(model.state_dict(), config["out"])


def fit_exact(tmp_path: Any, name: str, *, steps: int, faults: str | None = None,
              recovery: Any = "live", mode: Any = "sync", memory_tier: bool = False,
              num_workers: int = 2, health: Any = None, settle_memory: bool = False,
              **run_kwargs: Any) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """Run :func:`exact_loop` for ``steps`` under ``RobustTrainer`` (seed 0, NUMA off; a
    ``rayguard.HealthConfig`` when given; ``settle_memory``: see :func:`exact_loop`) in
    ``tmp_path``; returns rank 0's final weights, the run's events and the entries of every
    rank into the function."""
    import torch

    import rayguard
    from rayguard.events import read as read_events
    from rayguard.testing.recorder import make_trainer

    out, log = str(tmp_path / f"{name}.pt"), str(tmp_path / f"{name}.jsonl")
    guard = rayguard.GuardConfig(seed=0, faults=faults, numa="off", recovery=recovery,
                                 checkpoint=rayguard.CheckpointConfig(mode=mode,
                                                                      memory_tier=memory_tier),
                                 **({"health": health} if health is not None else {}))
    result = make_trainer(exact_loop, tmp_path, config={"steps": steps, "out": out, "log": log,
                                                          "settle_memory": settle_memory},
                          guard=guard, name=name, num_workers=num_workers, **run_kwargs).fit()
    return torch.load(out, weights_only=True), read_events(result.path), read_lines(log)


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two state dicts bitwise equal."""
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


__all__ = ["exact_loop", "fit_exact", "read_lines", "same_weights"]
