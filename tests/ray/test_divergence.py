"""A loss that diverges (``HealthConfig(divergence=...)``) on a real local cluster, 2 CPU
workers, DDP on gloo: one poisoned sample makes its step's loss spike; the run rolls back to
the checkpoint before it and leaves that step's data out (``ElasticSampler``), in place
(``recovery="live"``: the same processes) or through the group restart. Without the skip the
replay diverges again, and the crash-loop rule ends the run naming the step."""

from __future__ import annotations

import json
import os

import pytest

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.recorder import make_trainer

SAMPLES, GLOBAL, MICRO = 96, 8, 4
POISON = 7 * GLOBAL  # rank 0's first sample of step 7 (no shuffle): the step that diverges


def poisoned_loop(config):
    import torch

    ctx = rayguard.train.get_context()
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, SAMPLES).unsqueeze(-1)
    y = 3 * x
    y[POISON] = 1e4  # a corrupt label
    model = torch.nn.Linear(1, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sampler = rayguard.train.ElasticSampler(SAMPLES, global_batch_size=GLOBAL,
                                            micro_batch_size=MICRO, rank=ctx.rank,
                                            world_size=ctx.world_size, shuffle=False)
    state = rayguard.train.load_state()
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        sampler.load_state_dict(state["sampler"])  # leaves out the data that diverged
        step = state["step"] + 1
    with open(config["log"], "a") as f:
        f.write(json.dumps({"rank": ctx.rank, "pid": os.getpid(), "attempt": ctx.attempt,
                            "start": step, "skip": ctx.data_skip_steps}) + "\n")
    for indices in sampler.micro_batches():
        loss = (ddp(x[indices]) - y[indices]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sampler.advance()
        with open(config["log"], "a") as f:
            f.write(json.dumps({"rank": ctx.rank, "step": step, "attempt": ctx.attempt,
                                "indices": indices}) + "\n")
        rayguard.train.report({"loss": loss.item(), "step": step}, state={
            "model": model.state_dict(), "optim": opt.state_dict(),
            "sampler": sampler.state_dict(), "step": step})
        step += 1


def _fit(tmp_path, name, *, recovery, skip_data=True):
    log = tmp_path / f"{name}.jsonl"
    guard = rayguard.GuardConfig(seed=0, numa="off", recovery=recovery, health=rayguard.HealthConfig(
        divergence=rayguard.DivergenceConfig(factor=10.0, skip_data=skip_data)))
    trainer = make_trainer(poisoned_loop, tmp_path, guard=guard, name=name,
                           config={"log": str(log)})
    return trainer, log


def _rows(log):
    return [json.loads(line) for line in log.read_text().splitlines() if line]


@pytest.mark.parametrize("recovery", ["live", "restart"])
def test_a_diverged_step_is_rolled_back_and_its_data_left_out(ray_local_module, tmp_path,
                                                              recovery):
    trainer, log = _fit(tmp_path, recovery, recovery=recovery)
    result = trainer.fit()
    assert result.error is None
    events = read_events(trainer.run_dir)
    diverged = [e for e in events if e["kind"] == "diverged"]
    assert [(e["step"], e["rank"]) for e in diverged] == [(7, 0)], diverged
    assert "'loss' diverged at step 7" in diverged[0]["detail"]
    restart = [e for e in events if e["kind"] == "restart"]
    assert len(restart) == 1, restart
    rows = _rows(log)
    starts = [r for r in rows if "start" in r]
    for rank in (0, 1):
        mine = [r for r in starts if r["rank"] == rank]
        assert [(r["start"], r["skip"]) for r in mine] == [(0, 0), (7, 1)], mine
    if recovery == "live":
        assert restart[0]["path"] == "in_place" and "divergence at step 7" in restart[0]["detail"]
        assert "worker_died" not in [e["kind"] for e in events]
        for rank in (0, 1):
            assert len({r["pid"] for r in starts if r["rank"] == rank}) == 1  # same process
    else:
        assert restart[0].get("path") is None and restart[0]["cause"] == "nan", restart[0]
    trained = [r for r in rows if "indices" in r]
    after = [r for r in trained if r["attempt"] > restart[0]["attempt"]]
    assert after and all(POISON not in r["indices"] for r in after)
    # The rollback left out exactly step 7's data: the next step reads from sample 64 on.
    first = min((r for r in after if r["rank"] == 0), key=lambda r: r["step"])
    assert first["step"] == 7 and first["indices"][0] == 8 * GLOBAL, first
    assert max(r["step"] for r in trained) == SAMPLES // GLOBAL - 2  # one step fewer


def test_without_the_skip_the_replay_diverges_again_and_the_run_ends(ray_local_module,
                                                                     tmp_path):
    trainer, _ = _fit(tmp_path, "noskip", recovery="live", skip_data=False)
    with pytest.raises(Exception, match="divergence at step 7 again"):
        trainer.fit()
    events = read_events(trainer.run_dir)
    assert [e["step"] for e in events if e["kind"] == "diverged"] == [7, 7, 7]
