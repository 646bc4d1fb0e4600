"""The stall event says how long the rank was idle and since when (wall clock): goodput
measures the stall from there instead of taking the timeout."""

from __future__ import annotations

from typing import Any

from rayguard.health.checks import check_stall
from rayguard.health.decisions import stall_decision
from rayguard.health.stall import StallResponder


class _Ctx:
    attempt, rank, run_dir, node_id, world_size = 0, 1, "/nonexistent", "n0", 2


class _Link:
    ctx = _Ctx()

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def mark(self, key: str, value: Any) -> None:
        pass

    def record(self, kind: str, detail: str, **fields: Any) -> None:
        self.records.append((kind, fields))


def test_the_stall_event_carries_the_idle_time_and_the_last_progress(monkeypatch):
    import rayguard.health.stall as stall

    monkeypatch.setattr(stall, "dump_stacks", lambda ctx, local_run_dir: None)
    link, killed = _Link(), []
    responder = StallResponder(link, last_step=lambda: 7, local_run_dir=False,
                               kill=lambda: killed.append(True))
    verdict = check_stall("", last_progress=100.0, now_monotonic=106.5, timeout_s=5.0,
                          now=2_000.0)
    responder(stall_decision(verdict))
    ((kind, fields),) = link.records
    assert kind == "stall_detected" and killed == [True]
    assert fields["timeout_s"] == 5.0 and fields["idle_s"] == 6.5
    assert fields["last_progress_time"] == 2_000.0 - 6.5
