"""Restart causes, the event -> metric mapping and the coordinator-side observer (no Ray)."""

from __future__ import annotations

from rayguard.observe.causes import failure_cause
from rayguard.observe.metrics import SPECS, RayMetrics, event_updates, summary_updates
from rayguard.observe.observer import RunObserver

RAY_DEATH = ("rank 1 failed: ActorDiedError: The actor died unexpectedly before finishing this "
             "task. The actor is dead because its worker process has died. Some common causes "
             "include: (1) the process was killed by the OOM killer due to high memory usage")


def _ev(kind, **kw):
    return {"time": 0.0, "kind": kind, "rank": None, "node": None, "step": None, "attempt": 0,
            "detail": "", **kw}


def test_causes_come_from_the_classified_failure_field():
    died = _ev("worker_died", detail="rank 1 failed: worker process died (ActorDiedError: x)",
               failure="oom")
    assert failure_cause([died]) == "oom"  # the classifier's, not the text's "kill"
    assert failure_cause([_ev("worker_died", failure="error"),
                          _ev("worker_died", failure="kill")]) == "kill"
    assert failure_cause([_ev("stall_detected"), _ev("worker_died", failure="kill")]) == "hang"
    assert failure_cause([_ev("worker_died", detail=RAY_DEATH, failure="a newer cause")]) == "unknown"
    assert failure_cause([_ev("worker_died", detail=RAY_DEATH)]) == "unknown"  # text is not read
    assert failure_cause([]) == "unknown"


def test_an_older_logs_worker_died_with_only_the_old_cause_label_still_reads():
    for label, cause in (("died", "kill"), ("injected kill", "kill"), ("stall", "hang"),
                         ("startup", "hang"), ("nan", "nan"), ("error", "error"),
                         ("injected raise", "error"), ("a label never written", "unknown")):
        assert failure_cause([_ev("worker_died", cause=label)]) == cause, label
    assert failure_cause([_ev("stall_detected"), _ev("worker_died", cause="died")]) == "hang"
    assert failure_cause([_ev("worker_died", cause="died", failure="oom")]) == "oom"
    # one event of an older log beside one of now: both count
    assert failure_cause([_ev("worker_died", failure="error"),
                          _ev("worker_died", cause="died")]) == "kill"


def test_metric_names_follow_prometheus_conventions():
    for spec in SPECS.values():
        assert spec.name.startswith("rayguard_") and not spec.name.endswith("_total")
        assert spec.exported.startswith("ray_rayguard_")
        if spec.type == "counter":
            assert spec.exported.endswith("_total")
        if "seconds" in spec.name or "bytes" in spec.name:
            assert spec.name.endswith(("_seconds", "_bytes"))
    assert SPECS["rayguard_restarts"].exported == "ray_rayguard_restarts_total"


def test_event_updates():
    (u,) = event_updates(_ev("restart", cause="kill"))
    assert u.name == "rayguard_restarts" and dict(u.tags) == {"cause": "kill"}
    names = [u.name for u in event_updates(_ev("checkpoint_committed", bytes=100, seconds=0.5))]
    assert names == ["rayguard_checkpoints_committed", "rayguard_checkpoint_bytes",
                     "rayguard_checkpoint_seconds", "rayguard_checkpoint_seconds"]
    assert event_updates(_ev("steps")) == [] and event_updates(_ev("a_kind_from_the_future")) == []
    gauges = summary_updates(1, {"intervals": 4, "step_time_sum_s": 2.0, "reports": 4,
                                 "blocked_sum_s": 0.04}, 2.5)
    assert {u.name: u.value for u in gauges} == {
        "rayguard_step_time_seconds": 0.5, "rayguard_report_latency_seconds": 0.01,
        "rayguard_straggler_score": 2.5}


class FakeMetrics:
    def __init__(self):
        self.updates = []

    def apply(self, updates):
        self.updates += updates


def test_observer_annotates_restarts_and_fallbacks_and_emits_metrics():
    metrics = FakeMetrics()
    obs = RunObserver("run", metrics=metrics)
    for event in (_ev("stall_detected", rank=0), _ev("worker_died", failure="kill"),
                  _ev("restart"), _ev("checkpoint_rejected", attempt=1), _ev("restored", attempt=1),
                  _ev("restored", attempt=2)):
        obs.annotate(event)
        obs.emit(event)
        if event["kind"] == "restart":
            assert event["cause"] == "hang"
        if event["kind"] == "restored":
            assert event["fallback"] is (event["attempt"] == 1)
    names = [u.name for u in metrics.updates]
    assert names == ["rayguard_stalls", "rayguard_restarts", "rayguard_checkpoints_rejected",
                     "rayguard_checkpoint_fallbacks"]


def test_observer_turns_summaries_into_steps_and_straggler_events():
    obs = RunObserver("run", straggler_threshold=1.5, straggler_window_s=2.0, metrics=FakeMetrics())
    kinds = []
    for t in range(1, 6):
        for rank, step_s in ((0, 0.01), (1, 0.03)):
            for e in obs.on_summaries([{"rank": rank, "attempt": 0, "time": float(t), "node": "n",
                                     "gpu_ids": [], "intervals": 10, "step_time_sum_s": 10 * step_s,
                                     "reports": 10, "blocked_sum_s": 0.0, "first_step": 0,
                                     "last_step": 9, "first_time": 0.0, "samples": []}]):
                kinds.append((e["kind"], e["rank"]))
                if e["kind"] == "straggler":
                    assert abs(e["ratio"] - 3.0) < 1e-6 and "rank 1" in e["detail"]
    assert kinds.count(("straggler", 1)) == 1 and ("straggler", 0) not in kinds
    assert kinds.count(("steps", 0)) == 5


def test_a_restarts_cause_and_metric_come_from_the_classified_worker_died():
    metrics = FakeMetrics()
    obs = RunObserver("run", metrics=metrics)
    for event in (_ev("worker_died", detail=RAY_DEATH, failure="oom"), _ev("restart")):
        obs.annotate(event)
        obs.emit(event)
    assert event["cause"] == "oom"
    assert [dict(u.tags) for u in metrics.updates if u.name == "rayguard_restarts"] == [{"cause": "oom"}]


def test_checkpoint_seconds_blocked_is_what_the_loop_waited_total_is_the_whole_save():
    updates = event_updates(_ev("checkpoint_committed", seconds=3.0, blocked_s=0.25,
                                mode="async"))
    by_phase = {dict(u.tags)["phase"]: u.value for u in updates
                if u.name == "rayguard_checkpoint_seconds"}
    assert by_phase == {"blocked": 0.25, "total": 3.0}
    sync = event_updates(_ev("checkpoint_committed", seconds=0.5))  # no blocked_s: the whole
    assert sorted(u.value for u in sync if u.name == "rayguard_checkpoint_seconds") == [0.5, 0.5]


def test_a_restart_after_a_diagnosed_hang_names_its_culprits():
    obs = RunObserver("run", metrics=FakeMetrics())
    diagnosed = _ev("hang_diagnosed", culprits=[2], waiting=[0, 1, 3],
                    detail="rank 2 on node n2 never entered all_reduce #41 that ranks 0, 1, 3 wait in")
    restart = _ev("restart", detail="worker group restarts after attempt 0")
    for event in (diagnosed, _ev("stall_detected"), _ev("worker_died", failure="hang"), restart):
        obs.annotate(event)
        obs.emit(event)
    assert restart["cause"] == "hang" and restart["culprits"] == [2]
    assert restart["cause_detail"].startswith("rank 2 on node n2 never entered all_reduce #41")
    assert restart["detail"] == ("worker group restarts after attempt 0 (hang: rank 2 on node n2 "
                                 "never entered all_reduce #41 that ranks 0, 1, 3 wait in)")
    plain = _ev("restart", attempt=1)
    obs.annotate(plain)
    assert "culprits" not in plain  # attempt 1 had no diagnosis


def test_a_checkpoint_of_no_bytes_adds_nothing_and_the_rest_of_its_updates_still_apply():
    """Ray's counters refuse an increment of 0 (ValueError): a checkpoint directory with no
    files (Ray's torchft example reports one) printed "could not update metrics" on the
    console at every checkpoint and lost its ``checkpoint_seconds``."""
    applied = []

    class Metric:
        def __init__(self, name):
            self.name = name

        def inc(self, value, tags):
            if value <= 0:
                raise ValueError(f"value must be >0, got {value}")
            applied.append((self.name, value))

        def observe(self, value, tags):
            applied.append((self.name, value))

    metrics = RayMetrics("run")
    metrics._metric = lambda spec: Metric(spec.name)
    metrics.apply(event_updates(_ev("checkpoint_committed", bytes=0, seconds=0.5)))
    assert [name.split("_", 1)[1] for name, _ in applied] == [
        "checkpoints_committed", "checkpoint_seconds", "checkpoint_seconds"]
