"""Timeline data and the HTML report from a synthetic event log (no Ray)."""

from __future__ import annotations

import json
import sys

import pytest

from rayguard.cli import main
from rayguard.observe.report import ReportDependencyError, embedded_data, write_report
from rayguard.observe.timeline import build_run, build_sweep

DEATH = "rank 1 failed: WorkerHealthCheckFailedError: A worker health check failed."


def _steps(t, attempt, rank, first, last, step_s=0.1, first_time=None):
    n = last - first + 1
    return {"time": t, "kind": "steps", "rank": rank, "node": "n1", "step": last,
            "attempt": attempt, "detail": "", "reports": n, "intervals": n, "first_step": first,
            "last_step": last, "step_time_sum_s": n * step_s, "blocked_sum_s": 0.001 * n,
            "first_time": t - n * step_s if first_time is None else first_time, "metric": "loss",
            "samples": [[s, 1.0 / (s + 1)] for s in range(first, last + 1)]}


def _ev(t, kind, attempt, **kw):
    return {"time": t, "kind": kind, "rank": kw.pop("rank", None), "node": None,
            "step": kw.pop("step", None), "attempt": attempt, "detail": kw.pop("detail", kind), **kw}


def events():
    return [
        _ev(100, "start", 0),
        _ev(101, "attempt_started", 0, rank=0, world_size=2),
        _steps(102, 0, 0, 0, 9), _steps(102, 0, 1, 0, 9),
        _ev(102.1, "checkpoint_committed", 0, rank=0, step=9, bytes=1000, seconds=0.2, path="/r/c9"),
        _steps(103, 0, 0, 10, 12),
        _ev(103.5, "worker_died", 0, rank=1, detail=DEATH),
        _ev(103.6, "restart", 0, cause="kill"),
        _ev(110, "attempt_started", 1, rank=0, world_size=2),
        _ev(110.5, "restored", 1, rank=0, step=9, fallback=False, path="/r/c9"),
        _steps(111, 1, 0, 10, 14, first_time=110.8), _steps(111, 1, 1, 10, 14),
        _ev(112, "stall_detected", 1, rank=0, step=14, timeout_s=5.0, stacks="/r/stacks/r0.txt"),
        _ev(112.2, "worker_died", 1, rank=0, detail="rank 0 failed: WorkerHealthCheckFailedError"),
        _ev(112.3, "restart", 1),  # a log written before causes were recorded: derived
        _ev(120, "attempt_started", 2, rank=0, world_size=2),
        _ev(120.2, "checkpoint_rejected", 2, rank=0, path="/r/c14", detail="skipped bad sha256"),
        _ev(120.4, "restored", 2, rank=0, step=9, fallback=True, path="/r/c9"),
        _steps(121, 2, 0, 10, 20), _steps(121, 2, 1, 10, 20),
        _ev(121.5, "straggler", 2, rank=1, ratio=3.1, detail="rank 1 is a straggler"),
        _ev(121.6, "a_kind_from_the_future", 2, whatever={"x": 1}),
        _ev(122, "finished", 2),
    ]


def test_build_run_attempts_restarts_and_costs():
    data = build_run(events())
    assert [a["attempt"] for a in data["attempts"]] == [0, 1, 2]
    assert [a["outcome"] for a in data["attempts"]] == ["failed", "failed", "finished"]
    r0, r1 = data["restarts"]
    assert (r0["cause"], r1["cause"]) == ("kill", "hang")
    assert r0["cost_s"] == pytest.approx(110.8 - 103.5)
    assert r0["restored_step"] == 9 and r0["replayed_steps"] == 3
    assert r1["detection_s"] == 5.0 and r1["replayed_steps"] == 5 and r1["fallback"]
    statuses = [c["status"] for c in data["checkpoints"]]
    assert statuses == ["committed", "restored", "rejected", "fallback"]
    s = data["summary"]
    assert s["restarts_by_cause"] == {"kill": 1, "hang": 1} and s["outcome"] == "finished"
    assert s["fallbacks"] == 1 and s["stragglers"] == 1 and s["checkpoint_bytes"] == 1000
    assert s["time_lost_s"] > r0["cost_s"] + 5.0
    assert [x["attempt"] for x in data["metric"]["series"]] == [0, 1, 2]
    assert data["throughput"] and all(p["steps_per_s"] > 0 for p in data["throughput"])


def test_report_embeds_what_it_draws(tmp_path):
    with open(tmp_path / "rayguard_events.jsonl", "w") as f:
        for e in events():
            f.write(json.dumps(e) + "\n")
        f.write('{"broken\n')
    out = tmp_path / "out" / "r.html"
    assert main(["report", str(tmp_path), "-o", str(out)]) == 0
    page = out.read_text()
    data = embedded_data(page)
    assert data["bad_lines"] == 1 and len(data["restarts"]) == 2
    assert 'id="rayguard-timeline"' in page and "plotly" in page.lower()
    assert '<script src="http' not in page and "<script src='http" not in page  # inlined
    assert "file:///r/stacks/r0.txt" in page  # the hang links to its stack dump


def test_sweep_report(tmp_path):
    rows = [{"time": 1.0, "kind": "trial_started", "trial_id": "a", "detail": "", "data": {}},
            {"time": 2.0, "kind": "unhealthy", "trial_id": "a", "detail": "loss diverged",
             "data": {"verdict": {"check": "divergence"}}},
            {"time": 3.0, "kind": "restart", "trial_id": "a", "detail": "", "data": {}},
            {"time": 4.0, "kind": "trial_completed", "trial_id": "a", "detail": "", "data": {}},
            {"time": 4.5, "kind": "trial_started", "trial_id": "b", "detail": "", "data": {}}]
    data = build_sweep([{**r, **r["data"]} for r in rows])
    assert [(t["trial_id"], t["state"], t["restarts"]) for t in data["trials"]] == [
        ("a", "completed", 1), ("b", "running", 0)]
    with open(tmp_path / "rayguard_sweep_events.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    out = write_report(str(tmp_path), str(tmp_path / "s.html"))
    page = open(out).read()
    assert embedded_data(page)["trials"][0]["verdicts"][0]["check"] == "divergence"


def test_missing_plotly_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(ReportDependencyError, match=r"rayguard\[report\]"):
        write_report(str(tmp_path), str(tmp_path / "x.html"))
    assert main(["report", str(tmp_path)]) == 3
    assert "rayguard[report]" in capsys.readouterr().err


def test_empty_log(tmp_path):
    (tmp_path / "rayguard_events.jsonl").write_text("")
    page = open(write_report(str(tmp_path), str(tmp_path / "e.html"))).read()
    assert embedded_data(page)["empty"] is True


def test_a_diagnosed_hang_is_listed_with_each_culprits_stacks(tmp_path):
    log = [
        _ev(100, "start", 0), _ev(101, "attempt_started", 0, rank=0, world_size=4),
        _steps(102, 0, 0, 0, 3),
        _ev(106, "hang_diagnosed", 0, culprits=[2], waiting=[0, 1, 3],
            detail="rank 2 on node n2 never entered all_reduce #9 that ranks 0, 1, 3 wait in",
            stacks={"0": "/r/s/rank0.txt", "1": "/r/s/rank1.txt", "2": "/r/s/rank2.txt",
                    "3": None}),
        _ev(106.1, "stall_detected", 0, rank=0, step=3, timeout_s=4.0, stacks="/r/s/rank0.txt"),
        _ev(106.5, "restart", 0, cause="hang", culprits=[2]),
        _ev(110, "attempt_started", 1, rank=0, world_size=4), _ev(115, "finished", 1),
    ]
    data = build_run(log)
    culprit = next(f for f in data["faults"] if f["event"] == "hang_diagnosed")
    assert culprit["kind"] == "culprit" and culprit["stacks"] == {"2": "/r/s/rank2.txt"}
    assert data["summary"]["stalls"] == 1  # the diagnosis is not a second stall
    with open(tmp_path / "rayguard_events.jsonl", "w") as f:
        for e in log:
            f.write(json.dumps(e) + "\n")
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path), "-o", str(out)]) == 0
    page = out.read_text()
    assert 'href="file:///r/s/rank2.txt">rank 2 stacks</a>' in page
    assert "file:///r/s/rank1.txt" not in page  # a waiting rank's stacks are not a culprit's
