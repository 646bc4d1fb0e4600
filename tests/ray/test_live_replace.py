"""Live recovery (``GuardConfig(recovery="live")``) on a real local cluster: a killed or
crashed worker is replaced alone, the others keep their processes and rejoin it, and the
weights end bitwise equal to a run without faults (2 CPU workers, DDP on gloo)."""

from __future__ import annotations

import pytest
import torch

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.exact_loop import exact_loop, read_lines
from rayguard.testing.recorder import make_trainer

STEPS = 10


def _fit(tmp_path, name, faults=None, recovery="live", memory_tier=False, **run_kwargs):
    out, log = str(tmp_path / f"{name}.pt"), str(tmp_path / f"{name}.jsonl")
    guard = rayguard.GuardConfig(seed=0, faults=faults, numa="off", recovery=recovery,
                                 checkpoint=rayguard.CheckpointConfig(memory_tier=memory_tier))
    result = make_trainer(exact_loop, tmp_path, config={"steps": STEPS, "out": out, "log": log},
                          guard=guard, name=name, **run_kwargs).fit()
    return torch.load(out, weights_only=True), read_events(result.path), read_lines(log)


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def clean(ray_local_module, tmp_path_factory):
    weights, events, _ = _fit(tmp_path_factory.mktemp("clean"), "clean")
    assert "restart" not in [e["kind"] for e in events]
    return weights


@pytest.mark.parametrize("victim", [1, 0])
def test_killed_worker_is_replaced_alone(clean, tmp_path, victim):
    weights, events, entered = _fit(tmp_path, f"kill{victim}",
                                    faults=f"kill:rank={victim},step=5")
    assert _equal(weights, clean)
    kinds = [e["kind"] for e in events]
    assert kinds.count("worker_died") == 1 and kinds[-1] == "finished", kinds
    restart = next(e for e in events if e["kind"] == "restart")
    assert restart["path"] == "live" and restart["ranks"] == [victim], restart
    started = [e for e in events if e["kind"] == "attempt_started"]
    assert [e["attempt"] for e in started] == [0, 1] and started[1]["path"] == "live"
    survivor = 1 - victim
    mine = [e for e in entered if e["rank"] == survivor]
    assert len(mine) == 2 and mine[0]["pid"] == mine[1]["pid"], entered  # kept its process
    theirs = [e for e in entered if e["rank"] == victim]
    assert len(theirs) == 2 and theirs[0]["pid"] != theirs[1]["pid"], entered
    assert [e["attempt"] for e in mine] == [0, 1] and [e["attempt"] for e in theirs] == [0, 1]
    assert mine[1]["loaded_step"] == theirs[1]["loaded_step"] == 4, entered
