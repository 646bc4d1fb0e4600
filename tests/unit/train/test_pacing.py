"""The checkpoint interval in a worker: rank 0's decision rides on the per-report agreement
(three ranks in threads, MAX-merged flags), so every rank's should_checkpoint() is the same
at the same step; a one-rank session checkpoints at the policy's pace on a fake clock; the
failure history and the recommendation read from an event log."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

import rayguard
from rayguard.checkpoint.interval import IntervalBounds, IntervalPolicy, daly_interval
from rayguard.checkpoint.interval_advice import failure_history, recommend_interval
from rayguard.events import read
from rayguard.train import forwarding as forwarding_mod
from rayguard.train.agreement import Flags, merge_all
from rayguard.train.context import GuardContext
from rayguard.train.pacing import CheckpointPacing, pacing_for, read_history
from rayguard.train.setup import build_session
from rayguard.train.store import LocalStore


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ThreadAgreement:
    """``world`` ranks in threads: each report's flags are MAX-merged (as the all-reduce)."""

    def __init__(self, world: int) -> None:
        self.slots: list[Flags] = [Flags()] * world
        self.barrier = threading.Barrier(world)

    def agree(self, rank: int, mine: Flags) -> Flags:
        self.slots[rank] = mine
        self.barrier.wait()
        out = merge_all(list(self.slots))
        self.barrier.wait()
        return out


def test_rank_0s_interval_reaches_every_rank_at_the_same_report():
    world, steps, clock = 3, 60, Clock()
    agreement = ThreadAgreement(world)
    policy = IntervalPolicy(IntervalBounds(5, 5, prior_mtbf_s=3600), clock=clock)
    pacings = [CheckpointPacing(policy if rank == 0 else None) for rank in range(world)]
    saved_at: list[list[int]] = [[] for _ in range(world)]

    def loop(rank: int) -> None:
        pacing = pacings[rank]
        for step in range(steps):
            if rank == 0:
                clock.t = float(step)  # one second a step; only rank 0 reads the clock
            save = pacing.should_checkpoint()
            agreed = agreement.agree(rank, Flags(state=save, interval=pacing.local_flag()))
            if agreed.state:
                saved_at[rank].append(step)
            pacing.after_report(agreed, saved=agreed.state, cost_s=0.5)

    threads = [threading.Thread(target=loop, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert saved_at[0] == saved_at[1] == saved_at[2]
    # due at step 5 (5 s since the start), saved at the next step; then every 6 steps
    assert saved_at[0] == list(range(6, steps, 6))
    assert policy.cost_s == 0.5


def test_a_save_the_loop_makes_on_its_own_restarts_the_interval():
    clock = Clock()
    pacing = CheckpointPacing(IntervalPolicy(IntervalBounds(10, 10), clock=clock))
    clock.t = 9
    assert not pacing.local_flag()
    pacing.after_report(Flags(state=True), saved=True, cost_s=1.0)  # the loop's own save
    clock.t = 18
    assert not pacing.local_flag() and not pacing.should_checkpoint()
    clock.t = 19
    assert pacing.local_flag()
    pacing.after_report(Flags(interval=True), saved=False)
    assert pacing.should_checkpoint()
    pacing.after_report(Flags(), saved=False)  # the loop did not pass state: still due
    assert pacing.should_checkpoint()
    pacing.after_report(Flags(state=True), saved=True, cost_s=1.0)
    assert not pacing.should_checkpoint()


def test_never_due_while_a_save_persists():
    clock = Clock()
    pacing = CheckpointPacing(IntervalPolicy(IntervalBounds(1, 1), clock=clock))
    clock.t = 5
    assert not pacing.local_flag(in_flight=True)
    assert pacing.last is not None and "persisting" in pacing.last.reason
    assert pacing.local_flag(in_flight=False)


def test_only_rank_0_decides_and_interval_false_turns_it_off(tmp_path):
    def ctx(rank: int) -> GuardContext:
        return GuardContext(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                            node_rank=0, node_id="n0", device=torch.device("cpu"), seed=0,
                            attempt=0, run_dir=str(tmp_path))

    config = rayguard.CheckpointConfig()
    assert pacing_for(config, ctx(0)).policy is not None
    assert pacing_for(config, ctx(1)).policy is None
    assert pacing_for(rayguard.CheckpointConfig(interval=False), ctx(0)).policy is None


@pytest.fixture
def forwarded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict, str | None]]:
    calls: list[tuple[dict, str | None]] = []
    monkeypatch.setattr(forwarding_mod, "_forward", lambda report, m, path, fs: calls.append((m, path)))
    return calls


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_session_checkpoints_at_the_policys_pace(tmp_path, forwarded, mode):
    ctx = GuardContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                       node_id="n0", device=torch.device("cpu"), seed=0, attempt=0,
                       run_dir=str(tmp_path))
    checkpoint = rayguard.CheckpointConfig(mode=mode, min_interval_s=4, max_interval_s=4)
    session = build_session(ctx, rayguard.GuardConfig(checkpoint=checkpoint, numa="off"), None,
                            (), store=LocalStore(str(tmp_path)))
    clock = Clock()
    session.pacing = CheckpointPacing(IntervalPolicy(IntervalBounds(4, 4), clock=clock))
    asked = []
    for step in range(1, 21):
        clock.t = float(step)
        if session.should_checkpoint():
            asked.append(step)
        session.report({"loss": 1.0}, step=step,
                       state={"w": torch.ones(2), "step": step} if asked[-1:] == [step] else None)
        if session.async_checkpoints is not None:
            session.async_checkpoints.drain(30)  # let it persist: the next may be due
    session.finish()
    session.close()
    assert asked == [5, 10, 15, 20]  # due 4 s after the last save, saved at the next step
    committed = sorted(p.name for p in tmp_path.glob("checkpoint_*"))
    assert committed == [f"checkpoint_{s:09d}_a0" for s in asked]
    assert session.pacing.policy is not None and session.pacing.policy.cost_s is not None


def _log() -> list[dict]:
    return [
        {"kind": "start", "time": 1000.0},
        {"kind": "checkpoint_committed", "time": 1100.0, "attempt": 0, "seconds": 4.0},
        {"kind": "checkpoint_committed", "time": 1400.0, "attempt": 0, "seconds": 6.0},
        {"kind": "worker_died", "time": 1500.0, "attempt": 0},
        {"kind": "worker_died", "time": 1500.0, "attempt": 0},
        {"kind": "restart", "time": 1501.0, "attempt": 0},
        {"kind": "checkpoint_committed", "time": 1700.0, "attempt": 1, "mode": "async",
         "blocked_s": 7.0, "backpressure_s": 2.0, "seconds": 30.0},
        {"kind": "finished", "time": 2000.0},
        {"kind": "start", "time": 90000.0},  # the same directory, a day later
        {"kind": "restart", "time": 90500.0, "attempt": 0},
        {"kind": "finished", "time": 91000.0},
    ]


def test_the_failure_history_counts_restarts_and_run_time_not_the_gaps():
    history = failure_history(_log())
    assert (history.observed_s, history.failures, history.runs) == (2000.0, 2, 2)
    assert failure_history(_log(), now=92000.0).observed_s == 3000.0
    assert failure_history([]).failures == 0


def test_the_recommendation_from_a_log():
    rec = recommend_interval(_log(), min_interval_s=1, max_interval_s=10000)
    assert rec.cost_s == pytest.approx(5.0)  # 4, 6 and the async 7 - 2 of back-pressure
    assert rec.failures == 2 and rec.checkpoints == 3
    assert rec.used_interval_s == 300.0  # the gap over the restart is not counted
    assert rec.interval_s == pytest.approx(daly_interval(5.0, rec.mtbf_s))
    assert "maximises goodput" in rec.line() and "300 s" in rec.line()
    assert recommend_interval([]).interval_s is None
    assert "no checkpoint cost" in recommend_interval([]).line()


def test_rank_0_reads_the_history_from_the_run_directory(tmp_path: Path):
    from rayguard.events import append_events

    append_events(tmp_path / "rayguard_events.jsonl", _log()[:6])
    assert len(read(str(tmp_path))) == 6
    history = read_history(str(tmp_path), None, attempt=1)
    assert history.failures == 1 and history.observed_s > 500
    assert read_history(str(tmp_path / "missing"), None, attempt=3).failures == 3


def test_the_recommendation_takes_the_runs_own_prior_and_bounds_from_its_log():
    """``rayguard events --goodput`` and the report advise as the driver's last line: with
    the ``CheckpointConfig`` the run's ``start`` event recorded, unless told otherwise."""
    from types import SimpleNamespace

    from rayguard.checkpoint.interval_advice import interval_settings

    settings = interval_settings(SimpleNamespace(mtbf_s=30.0, min_interval_s=1.0,
                                                 max_interval_s=50.0))
    log = _log()
    log[-3] = dict(log[-3], interval_settings=settings)  # the newest run's start
    logged = recommend_interval(log)
    told = recommend_interval(_log(), mtbf_s=30.0, min_interval_s=1.0, max_interval_s=50.0)
    assert logged == told
    assert recommend_interval(_log()).mtbf_s > logged.mtbf_s  # the 24 h default prior
    assert recommend_interval(log, max_interval_s=20.0).interval_s == 20.0  # a given bound wins
    import rayguard

    default = interval_settings(rayguard.CheckpointConfig())  # no prior given: none recorded
    assert "mtbf_s" not in default and default["max_interval_s"] > 0
    bad = dict(log[-3], interval_settings={"mtbf_s": -1, "min_interval_s": True})
    assert recommend_interval([*log[:-3], bad, *log[-2:]]) == recommend_interval(_log())
