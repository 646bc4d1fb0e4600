"""The goodput planner on hand-written event logs: a clean run, a kill with a restore, a
hang, a preemption, a 0.1-era log without the newer events, an empty and a failed run."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rayguard.events import make_event
from rayguard.observe.goodput import CAUSES, RESTART_PHASES, Goodput, goodput

T0 = 1_700_000_000.0


def ev(t: float, kind: str, attempt: int | None = None, **fields: Any) -> dict[str, Any]:
    event = make_event(kind, kind, attempt=attempt, **fields)
    event["time"] = T0 + t
    return event


def steps(t: float, attempt: int, first: int, last: int, *, first_time: float, sum_s: float,
          intervals: int, rank: int = 0) -> dict[str, Any]:
    return ev(t, "steps", attempt, rank=rank, first_step=first, last_step=last, step=last,
              first_time=T0 + first_time, step_time_sum_s=sum_s, intervals=intervals,
              reports=intervals + 1)


def assert_partition(g: Goodput) -> None:
    """Productive time and every cause add up to the wall time."""
    assert set(g.badput_s) == set(CAUSES)
    assert set(g.restart_s) == set(RESTART_PHASES)
    assert g.productive_s + sum(g.badput_s.values()) == pytest.approx(g.wall_s)
    assert sum(g.restart_s.values()) == pytest.approx(g.badput_s["restart"])
    assert all(v >= 0 for v in g.badput_s.values())
    for row in g.attempts:
        assert row.productive_s + sum(row.badput_s.values()) == pytest.approx(
            row.end_s - row.start_s)


def clean_run() -> list[dict[str, Any]]:
    return [ev(0, "start"), ev(4, "attempt_started", 0, world_size=2, group_start_time=T0 + 1,
               setup_start_time=T0 + 3),
            steps(6, 0, 0, 0, first_time=5, sum_s=0.0, intervals=0),
            steps(6.5, 0, 0, 0, first_time=5.2, sum_s=0.0, intervals=0, rank=1),
            ev(30, "checkpoint_committed", 0, step=50, seconds=2.0, blocked_s=2.0),
            steps(50, 0, 1, 90, first_time=6, sum_s=45.0, intervals=90),
            ev(100, "finished")]


def test_clean_run_ratio_is_productive_over_wall():
    g = goodput(clean_run())
    assert_partition(g)
    assert g.wall_s == pytest.approx(100)
    assert g.badput_s["startup"] == pytest.approx(5)
    assert g.badput_s["checkpoint"] == pytest.approx(2)
    assert g.productive_s == pytest.approx(93)
    assert g.ratio == pytest.approx(0.93)
    assert g.restarts == 0 and g.replayed_steps == 0
    assert g.attempts[0].outcome == "finished"
    assert g.not_measured == ()


def test_event_order_does_not_matter():
    assert goodput(list(reversed(clean_run()))) == goodput(clean_run())


def kill_with_restore() -> list[dict[str, Any]]:
    return [ev(0, "start"), ev(2, "attempt_started", 0),
            steps(3, 0, 0, 0, first_time=3, sum_s=0.0, intervals=0),
            ev(12, "checkpoint_committed", 0, step=19, seconds=1.0, blocked_s=1.0),
            steps(20, 0, 1, 40, first_time=3.5, sum_s=20.0, intervals=40),
            ev(25, "fault_injected", 0, step=45, fault="kill"),
            ev(27, "worker_died", 0, rank=1, failure="kill"),
            ev(28, "restart", 0), ev(35, "attempt_started", 1, group_start_time=T0 + 30,
               setup_start_time=T0 + 33), ev(36, "restored", 1, step=19),
            steps(38, 1, 20, 20, first_time=37, sum_s=0.0, intervals=0),
            steps(80, 1, 21, 100, first_time=37.5, sum_s=40.0, intervals=80),
            ev(90, "finished")]


def test_kill_with_restore_has_restart_phases_and_replay():
    g = goodput(kill_with_restore())
    assert_partition(g)
    assert g.restarts == 1
    assert g.restart_s == pytest.approx({"detection": 2, "teardown": 3, "worker_start": 3,
                                         "setup": 2, "load": 2})
    assert g.badput_s["restart"] == pytest.approx(12)
    # attempt 0 reached step 45; attempt 1 resumed at 20: 26 steps again at 0.5 s each
    assert g.replayed_steps == 26
    assert g.badput_s["replay"] == pytest.approx(13)
    assert g.badput_s["startup"] == pytest.approx(3)
    assert g.badput_s["checkpoint"] == pytest.approx(1)
    assert g.productive_s == pytest.approx(61)
    first, second = g.attempts
    assert (first.outcome, second.outcome) == ("failed", "finished")
    assert second.restored_step == 19 and second.step_time_s == pytest.approx(0.5)
    assert second.badput_s["restart"] == pytest.approx(12)
    assert g.not_measured == ()


def test_hang_counts_the_stall_and_degrades_without_the_start_events():
    events = [ev(0, "start"), ev(1, "attempt_started", 0),
              steps(2, 0, 0, 0, first_time=2, sum_s=0.0, intervals=0),
              steps(25, 0, 1, 30, first_time=2.5, sum_s=15.0, intervals=30),
              ev(40, "stall_detected", 0, step=30, timeout_s=10.0),
              ev(41, "worker_died", 0, failure="hang"), ev(41.5, "restart", 0),
              ev(45, "attempt_started", 1),
              steps(46, 1, 0, 0, first_time=46, sum_s=0.0, intervals=0),
              ev(60, "finished")]
    g = goodput(events)
    assert_partition(g)
    assert g.badput_s["stall"] == pytest.approx(10)
    assert g.restart_s == pytest.approx({"detection": 1, "teardown": 0.5, "worker_start": 3.5,
                                         "setup": 0, "load": 1})
    # attempt 1 started over from step 0 and ran only it: one step again, with no step time
    # measured, so no replay cost, and the log says so
    assert g.replayed_steps == 1 and g.badput_s["replay"] == 0
    assert any("replayed steps' time" in n for n in g.not_measured)
    assert any("group_start_time" in n for n in g.not_measured)
    assert any("setup_start_time" in n for n in g.not_measured)


def test_preemption_notice_to_the_death_is_preemption():
    events = [ev(0, "start"), ev(1, "attempt_started", 0),
              steps(2, 0, 0, 0, first_time=2, sum_s=0.0, intervals=0),
              ev(30, "preemption_notice", 0, step=20),
              ev(31, "preemption_checkpoint", 0, step=20),
              ev(31, "checkpoint_committed", 0, step=20, seconds=1.0, blocked_s=1.0),
              ev(33, "worker_died", 0, failure="preemption"), ev(34, "restart", 0),
              ev(38, "attempt_started", 1, group_start_time=T0 + 35,
               setup_start_time=T0 + 37), ev(38.5, "restored", 1, step=20),
              steps(39, 1, 21, 21, first_time=39, sum_s=0.0, intervals=0),
              ev(50, "finished")]
    g = goodput(events)
    assert_partition(g)
    assert g.badput_s["preemption"] == pytest.approx(3)
    assert g.restart_s["detection"] == 0
    assert g.restart_s == pytest.approx({"detection": 0, "teardown": 2, "worker_start": 2,
                                         "setup": 1, "load": 1})
    assert g.replayed_steps == 0


def test_0_1_era_log_degrades_gracefully():
    events = [ev(0, "start"), ev(1, "attempt_started", 0),
              ev(10, "checkpoint_committed", 0, step=9, seconds=2.0),
              ev(20, "worker_died", 0, rank=0, failure="kill"), ev(21, "restart", 0),
              ev(25, "attempt_started", 1), ev(26, "restored", 1, step=5),
              ev(40, "finished")]
    g = goodput(events)
    assert_partition(g)
    assert g.badput_s["startup"] == pytest.approx(1)
    assert g.badput_s["checkpoint"] == pytest.approx(2)  # a commit's whole duration
    assert g.badput_s["restart"] == pytest.approx(6)
    assert g.replayed_steps == 4 and g.badput_s["replay"] == 0
    text = " ".join(g.not_measured)
    for missing in ("first step", "group_start_time", "setup_start_time", "blocked",
                    "replayed steps' time"):
        assert missing in text
    assert g.ratio == pytest.approx(g.productive_s / 40)


def test_failed_run_tail_is_other():
    events = [ev(0, "start"), ev(1, "attempt_started", 0),
              steps(2, 0, 0, 0, first_time=2, sum_s=0.0, intervals=0),
              ev(20, "worker_died", 0, failure="error"), ev(20.5, "not_retried", 0),
              ev(24, "failed")]
    g = goodput(events)
    assert_partition(g)
    assert g.productive_s == pytest.approx(18)
    assert g.badput_s["other"] == pytest.approx(4)
    assert g.attempts[0].outcome == "failed"


def test_an_attempt_that_never_stepped_is_all_restart():
    events = kill_with_restore()[:9] + [
        ev(36, "worker_died", 1, failure="error"), ev(37, "restart", 1),
        ev(40, "attempt_started", 2, group_start_time=T0 + 38,
               setup_start_time=T0 + 39), ev(41, "restored", 2, step=19),
        steps(42, 2, 20, 20, first_time=42, sum_s=0.0, intervals=0), ev(50, "finished")]
    g = goodput(events)
    assert_partition(g)
    assert g.restarts == 2
    assert g.attempts[1].productive_s == 0
    assert g.productive_s == pytest.approx(21 + 8)


def test_empty_log_and_json():
    g = goodput([])
    assert g.ratio is None and g.wall_s == 0 and g.not_measured
    data = json.loads(json.dumps(goodput(kill_with_restore()).to_dict()))
    assert data["ratio"] == pytest.approx(61 / 90)
    assert set(data["badput_s"]) == set(CAUSES)
    assert len(data["attempts"]) == 2


def test_junk_fields_never_break_it():
    events = clean_run() + [{"kind": "steps", "time": "x"}, {"kind": "restored"},
                            ev(60, "steps", 0, rank="a", first_time="b"),
                            ev(61, "stall_detected", 5, timeout_s="ten")]
    assert_partition(goodput(events))


def test_meter_publishes_the_ratio_and_only_growing_badput_counters():
    from rayguard.observe.goodput_meter import GoodputMeter

    now = [0.0]
    meter = GoodputMeter(interval_s=30.0, clock=lambda: now[0])
    updates = []
    for event in kill_with_restore():
        now[0] += 1.0  # step summaries within 30 s of the last figures wait
        updates += meter.on_event(event)
    ratio = [u.value for u in updates if u.name == "rayguard_goodput_ratio"]
    assert ratio[-1] == pytest.approx(61 / 90)
    counted: dict[str, float] = {}
    for u in updates:
        if u.name == "rayguard_badput_seconds":
            assert u.value > 0
            cause = dict(u.tags)["cause"]
            counted[cause] = counted.get(cause, 0.0) + u.value
    final = goodput(kill_with_restore()).badput_s
    assert counted == pytest.approx({c: v for c, v in final.items() if v > 0})
    assert all(u.name in ("rayguard_goodput_ratio", "rayguard_badput_seconds") for u in updates)


def test_meter_drops_bulky_fields():
    from rayguard.observe.goodput_meter import GoodputMeter

    meter = GoodputMeter()
    meter.on_event(ev(0, "steps", 0, rank=0, samples=[[1, 2.0]] * 100, details="x" * 1000))
    assert "samples" not in meter._events[0] and "details" not in meter._events[0]


def test_a_log_cut_after_a_failure_counts_a_restart_under_way():
    g = goodput(kill_with_restore()[:8])  # up to the restart decision
    assert_partition(g)
    assert g.restart_s["detection"] == pytest.approx(2)
    assert g.restart_s["teardown"] == pytest.approx(1)
    assert g.badput_s["other"] == 0


def _write_log(run_dir, events) -> None:
    from rayguard.events import events_path

    events_path(run_dir).write_text("".join(json.dumps(e) + "\n" for e in events))


def test_cli_events_goodput_table_and_json(tmp_path, capsys):
    from rayguard.cli import main

    _write_log(tmp_path, kill_with_restore())
    assert main(["events", str(tmp_path), "--goodput"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("goodput 0.68 (61.0 s productive of 90.0 s, 1 restart, 26 steps")
    for word in CAUSES + RESTART_PHASES + ("productive", "wall", "attempt"):
        assert word in out
    assert main(["events", str(tmp_path), "--goodput", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["ratio"] == pytest.approx(61 / 90)
    assert data["restart_s"]["teardown"] == pytest.approx(3)
    assert main(["events", str(tmp_path / "nothing-here"), "--goodput"]) == 2


def test_cli_events_goodput_of_an_old_log_says_what_is_not_measured(tmp_path, capsys):
    from rayguard.cli import main

    _write_log(tmp_path, [ev(0, "start"), ev(1, "attempt_started", 0), ev(9, "finished")])
    assert main(["events", str(tmp_path), "--goodput"]) == 0
    out = capsys.readouterr().out
    assert "not measured:" in out and "first step" in out


def test_report_leads_with_goodput_and_a_badput_bar(tmp_path):
    pytest.importorskip("plotly")
    from rayguard.cli import main
    from rayguard.observe.report import embedded_data
    from rayguard.observe.report_goodput import BAR_ID

    _write_log(tmp_path, kill_with_restore())
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path), "-o", str(out)]) == 0
    page = out.read_text()
    assert page.index("<h2>Goodput</h2>") < page.index("<h2>Summary</h2>")
    assert f'id="{BAR_ID}"' in page and "goodput 0.68" in page
    for cause in ("productive", "restart", "replay", "checkpoint", "startup"):
        assert f"seg-{cause}" in page
    assert "seg-stall" not in page  # nothing of it: no segment
    data = embedded_data(page)
    assert data["goodput"]["ratio"] == pytest.approx(61 / 90)
    assert len(data["restarts"]) == 1  # the report's other sections are all there
    assert "<h2>Timeline</h2>" in page and "<h2>Restarts</h2>" in page


def test_the_coordinator_stamps_when_an_attempts_group_was_started(tmp_path):
    from rayguard.run.coordinator import RunCoordinator

    coordinator = RunCoordinator(str(tmp_path / "events.jsonl"))
    coordinator.open_attempt("restart")
    event = make_event("attempt_started", "attempt 0 started", rank=0, attempt=0,
                       setup_start_time=123.0)
    coordinator.record(event)
    written = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert written["setup_start_time"] == 123.0
    assert written["group_start_time"] <= written["time"]


def _trial_ev(t: float, kind: str, trial: str, **fields: Any) -> dict[str, Any]:
    return {"time": T0 + t, "kind": kind, "trial_id": trial, "rank": None, "node": None,
            "step": None, "attempt": None, "detail": kind, **fields}


def test_sweep_goodput_per_trial(tmp_path, capsys):
    from rayguard.cli import main
    from rayguard.events import sweep_events_path
    from rayguard.observe.goodput_sweep import sweep_goodput

    events = [{"time": T0, "kind": "sweep_started", "trial_id": None, "detail": ""},
              _trial_ev(1, "trial_started", "a"),
              _trial_ev(30, "unhealthy", "a", verdict={"check": "stall", "value": 10.0}),
              _trial_ev(31, "restart", "a"), _trial_ev(35, "trial_started", "a"),
              _trial_ev(61, "trial_completed", "a"),
              _trial_ev(2, "trial_started", "b"),
              _trial_ev(20, "unhealthy", "b", verdict={"check": "divergence", "value": 9.0}),
              _trial_ev(20.5, "restart", "b"), _trial_ev(22.5, "trial_started", "b"),
              _trial_ev(42, "trial_completed", "b")]
    trials = sweep_goodput(events)
    a, b = trials["a"], trials["b"]
    for g in (a, b):
        assert g.productive_s + sum(g.badput_s.values()) == pytest.approx(g.wall_s)
        assert g.restarts == 1 and g.not_measured
    assert a.wall_s == 60 and a.badput_s["stall"] == 10 and a.badput_s["restart"] == 5
    assert a.restart_s["detection"] == 1 and a.restart_s["worker_start"] == 4
    assert a.ratio == pytest.approx(45 / 60)
    assert b.badput_s["stall"] == 0 and b.badput_s["restart"] == pytest.approx(2.5)
    with open(sweep_events_path(tmp_path), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)
    assert main(["events", str(tmp_path), "--goodput"]) == 0
    out = capsys.readouterr().out
    assert "0.75" in out and "not measured" in out
    assert main(["events", str(tmp_path), "--goodput", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["trials"]) == {"a", "b"}


def test_a_finished_runs_end_after_its_last_report_is_other():
    events = clean_run()
    events[-2] = {**events[-2], "last_time": T0 + 96.0}  # the last summary: last report at 96 s
    # the coordinator gives the run's own events the current attempt: both shapes read alike
    for last in (events[-1], {**events[-1], "attempt": 0}):
        g = goodput(events[:-1] + [last])
        assert_partition(g)
        assert g.badput_s["other"] == pytest.approx(4)
        assert g.productive_s == pytest.approx(89)
        assert g.attempts[0].end_s == pytest.approx(96)
        assert g.attempts[0].outcome == "finished"


def test_the_step_timer_sends_its_last_report_time():
    from rayguard.observe.steps import StepTimer

    now = [0.0]
    timer = StepTimer(interval_s=100.0, clock=lambda: now[0], wall=lambda: 1000.0 + now[0])
    timer.on_report(0, {}, 0.0)
    now[0] = 2.0
    timer.on_report(1, {}, 0.0)
    summary = timer.take()
    assert summary["last_time"] == 1002.0 and summary["first_time"] == 1002.0


def test_cli_events_goodput_recommends_the_checkpoint_interval(tmp_path, capsys):
    """For a loop on its own schedule: the interval that would have maximised goodput, with
    the figures behind it (the log's mean checkpoint cost and its failures)."""
    from rayguard.checkpoint.interval import IntervalBounds, bounded_interval, estimate_mtbf
    from rayguard.checkpoint.interval_advice import failure_history
    from rayguard.cli import main

    events = kill_with_restore()
    _write_log(tmp_path, events)
    assert main(["events", str(tmp_path), "--goodput"]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("checkpoint interval: ") and "maximises goodput" in last
    assert main(["events", str(tmp_path), "--goodput", "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)["checkpoint_interval"]
    history = failure_history(events)
    assert advice["failures"] == history.failures >= 1
    mtbf = estimate_mtbf(history.observed_s, history.failures,
                         at_last_failure_s=history.at_last_failure_s)
    assert history.at_last_failure_s is not None and history.at_last_failure_s < history.observed_s
    assert advice["mtbf_s"] == pytest.approx(mtbf)
    assert advice["interval_s"] == pytest.approx(
        bounded_interval(advice["cost_s"], mtbf, IntervalBounds(60.0, 3600.0)))
    assert f"{advice['interval_s']:.0f} s" in last


def test_the_recommendation_line_keeps_a_short_interval_readable():
    from rayguard.checkpoint.interval_advice import Recommendation

    rec = Recommendation(interval_s=60.0, cost_s=0.01, mtbf_s=86400.0, observed_s=13.0,
                         failures=0, checkpoints=6, used_interval_s=0.05, unbounded_s=41.6)
    assert rec.line().endswith("this run checkpointed every 0.05 s")
    assert "60 s maximises goodput" in rec.line()


def test_replayed_steps_cost_what_the_lead_rank_measured():
    """After a restore the first steps run slower (a spare process starting beside them, a
    cold cache): the replay is the time the lead rank measured for its replayed steps, the
    attempt's first step and any step it did not count at the attempt's time per step."""
    events = kill_with_restore()
    replayed = events[10]  # attempt 1's first summary: steps 20..20
    assert replayed["kind"] == "steps" and replayed["attempt"] == 1
    events[11] = dict(events[11], replay_time_s=30.0, replay_steps=25)  # steps 21..45
    g = goodput(events)
    assert_partition(g)
    assert g.replayed_steps == 26
    assert g.badput_s["replay"] == pytest.approx(30.0 + 0.5)  # step 20 at 0.5 s
    assert g.productive_s == pytest.approx(61 - 17.5)
    # a worker that knew less of the run (fewer steps counted): the rest at 0.5 s each
    events[11] = dict(events[11], replay_time_s=12.0, replay_steps=10)
    assert goodput(events).badput_s["replay"] == pytest.approx(12.0 + 16 * 0.5)
    # one that counted more than the log shows replayed: its figure scaled to the 25
    events[11] = dict(events[11], replay_time_s=60.0, replay_steps=50)
    assert goodput(events).badput_s["replay"] == pytest.approx(30.0 + 0.5)


def test_the_coordinator_knows_the_highest_step_the_run_reached(tmp_path):
    from rayguard.run.coordinator import RunCoordinator

    coordinator = RunCoordinator(str(tmp_path / "events.jsonl"))
    assert coordinator.high_step() is None
    coordinator.open_attempt("restart")
    coordinator.progress({"step": 7})
    coordinator.record(make_event("steps", "rank 1", rank=1, attempt=0, last_step=12, step=12))
    coordinator.record(make_event("fault_injected", "kill", rank=1, attempt=0, step=13))
    assert coordinator.high_step() == 13
    coordinator.open_attempt("restart")
    coordinator.record(make_event("restored", "restored", rank=0, attempt=1, step=4))
    coordinator.progress({"step": 5})
    assert coordinator.high_step() == 13  # the restore and the replay do not lower it


def test_the_headline_names_the_largest_cause_of_badput():
    from rayguard.observe.goodput import CAUSES, RESTART_PHASES, Goodput
    from rayguard.observe.goodput_table import headline

    badput = dict.fromkeys(CAUSES, 0.0)
    short = Goodput(33.0, 0.3, 0.01, {**badput, "startup": 29.4, "other": 3.3},
                    dict.fromkeys(RESTART_PHASES, 0.0))
    assert headline(short).endswith("; most of the rest: start-up (Ray, the workers, set-up, "
                                    "before the first step) 29.4 s)")
    clean = Goodput(100.0, 98.0, 0.98, {**badput, "other": 2.0}, dict.fromkeys(RESTART_PHASES, 0.0))
    assert headline(clean).endswith("0 steps replayed)")  # under 5%: nothing to name


def test_interval_advice_is_shown_only_after_a_failure_or_a_long_enough_run():
    from rayguard.checkpoint.interval_advice import Recommendation, advice_matters

    def advice(observed_s, failures, interval_s=60.0):
        return Recommendation(interval_s, 0.02, 86400.0, observed_s, failures, 10, 0.07, 1.0)

    assert not advice_matters(advice(14.0, 0), 60.0)  # a short healthy demo
    assert advice_matters(advice(14.0, 1), 60.0)
    assert advice_matters(advice(600.0, 0), 60.0)
    assert not advice_matters(advice(600.0, 1, interval_s=None), 60.0)


def test_a_shrink_in_place_is_its_own_cause_not_a_restart():
    """A lost node's in-place resize (a ``resize`` event with ``path="live"``): the time from
    the failure to the first step at the new size is ``resize``, the run had no restart, and
    the headline says the resize."""
    from rayguard.observe.goodput_table import headline

    events = [e if e["kind"] != "restart" else ev(28, "resize", 0, path="live",
                                                      direction="shrink", next_attempt=1)
              for e in kill_with_restore()]
    g = goodput(events)
    assert_partition(g)
    assert (g.restarts, g.resizes) == (0, 1)
    assert g.badput_s["resize"] == pytest.approx(12) and g.badput_s["restart"] == 0
    assert g.restart_s == dict.fromkeys(RESTART_PHASES, 0.0)
    assert g.attempts[1].badput_s["resize"] == pytest.approx(12)
    assert "0 restarts, 1 resize in place" in headline(g)
    # the same log with Ray's restart stays a restart
    assert goodput(kill_with_restore()).resizes == 0
