"""NaN/inf rolled back in place (``GuardConfig(recovery="live")``) on a real local cluster
(2 CPU workers, DDP on gloo): every rank agrees at the NaN's report and re-enters the
training function in its own process from the last committed checkpoint (disk, or the
memory tier); no worker restarts, and the weights end bitwise equal to a run without
faults."""

from __future__ import annotations

import pytest

import rayguard
from rayguard.events import read as read_events
from rayguard.testing.exact_loop import exact_loop, fit_exact, same_weights
from rayguard.testing.recorder import make_trainer

STEPS = 10  # the steps of the session's fault-free run (tests/conftest.py, exact_clean)


def _fit(tmp_path, name, faults=None, mode="sync", memory_tier=False, recovery="live"):
    return fit_exact(tmp_path, name, steps=STEPS, faults=faults, mode=mode,
                     memory_tier=memory_tier, recovery=recovery)


@pytest.fixture(scope="module")
def clean(ray_local_module, exact_clean):
    """The fault-free run's weights (one run for this file, test_live_replace.py and
    test_recovery_exact.py)."""
    return exact_clean


# (sync, disk) is the frameworks' faults runs' rollback (tests/ray/test_frameworks_*.py):
# exact weights after a NaN rolled back in place from the disk checkpoint (docs/testing.md)
@pytest.mark.parametrize(("mode", "memory_tier"), [("async", False), ("sync", True)])
def test_nan_rolls_back_in_place_exactly(clean, tmp_path, mode, memory_tier):
    weights, events, entered = _fit(tmp_path, "nan", faults="nan:rank=0,step=4", mode=mode,
                                    memory_tier=memory_tier)
    assert same_weights(weights, clean)
    kinds = [e["kind"] for e in events]
    assert "worker_died" not in kinds  # Ray never restarted the group
    assert kinds.count("restart") == 1 and kinds[-1] == "finished"
    restart = next(e for e in events if e["kind"] == "restart")
    assert restart["path"] == "in_place" and restart["step"] == 4
    assert set(restart["phases"]) == {"agree_s", "settle_s"}
    nan = next(e for e in events if e["kind"] == "nan_detected")
    assert nan["step"] == 4 and nan["path"] == "in_place"
    restored = [e for e in events if e["kind"] == "restored"]
    assert restored[-1]["step"] == 3 and restored[-1]["attempt"] == 1
    from rayguard.observe.goodput import goodput

    assert goodput(events).replayed_steps == 1  # step 4 only, done again from step 3
    if memory_tier:
        assert restored[-1]["tier"] == "memory", restored[-1]
    started = [e for e in events if e["kind"] == "attempt_started"]
    assert [e["attempt"] for e in started] == [0, 1] and started[1]["path"] == "in_place"
    # No checkpoint was committed for the NaN step in the attempt that saw it.
    assert not [e for e in events if e["kind"] == "checkpoint_committed"
                and e["step"] == 4 and e["attempt"] == 0]
    for rank in (0, 1):
        runs = [e for e in entered if e["rank"] == rank]
        assert len(runs) == 2, entered  # the function ran twice in one process
        assert runs[0]["pid"] == runs[1]["pid"] and runs[0]["ctx"] == runs[1]["ctx"]
        assert runs[0]["ray_ctx"] == runs[1]["ray_ctx"] and runs[0]["ray_ctx"][0] == rank
        assert [r["attempt"] for r in runs] == [0, 1]
        assert runs[0]["loaded_step"] is None and runs[1]["loaded_step"] == 3
        # ray.train.get_checkpoint(): the rolled-back one, on every rank
        assert runs[1]["ray_checkpoint"] == "checkpoint_000000003_a0", entered


def test_restart_budget_bounds_in_place_rollbacks(ray_local_module, tmp_path):
    from ray.train import FailureConfig

    guard = rayguard.GuardConfig(seed=0, numa="off", recovery="live",
                                 faults="nan:rank=1,step=2;nan:rank=0,step=5")
    log = str(tmp_path / "budget.jsonl")
    trainer = make_trainer(exact_loop, tmp_path, guard=guard, name="budget",
                           config={"steps": STEPS, "out": str(tmp_path / "b.pt"), "log": log},
                           failure_config=FailureConfig(max_failures=1))
    with pytest.raises(Exception, match="max_failures=1"):
        trainer.fit()
    events = read_events(trainer.run_dir)
    assert [e.get("path") for e in events if e["kind"] == "restart"] == ["in_place"]
