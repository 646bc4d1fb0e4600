"""The coordinated hang diagnosis on the coordinator's class itself (no Ray): ranks in
threads, each with a HangProbe and a StallResponder over a link that calls the coordinator
in-process (on its own event loop, as on the actor). One decision, recorded once, before any rank is killed; the answer bound names
a rank that never answers; a rank alone acts as before."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import rayguard.health.hang as hang
from rayguard.health.checks import Verdict
from rayguard.health.decisions import Decision
from rayguard.health.hang import HangProbe
from rayguard.health.stall import StallResponder
from rayguard.run.coordinator import RunCoordinator
from rayguard.run.diagnosis import open_key
from rayguard.run.link import NullLink, RunLink
from rayguard.testing.coordinator import InProcessCoordinator


class Poll:
    def __init__(self, c, key):
        self.c, self.key = c, key

    def value(self):
        return self.c.get(self.key)


class InProcessLink(RunLink):
    """A RunLink whose calls go straight to a RunCoordinator object."""

    def __init__(self, ctx, c):
        super().__init__(ctx, c)
        self.c = c

    def open_diagnosis(self, wait_s):
        return self.c.open_diagnosis(self.ctx.attempt, self.ctx.rank, self.ctx.world_size, wait_s)

    def answer_diagnosis(self, answer):
        self.c.answer_diagnosis(self.ctx.attempt, self.ctx.rank, answer)

    def await_diagnosis(self, timeout_s):
        return self.c.await_diagnosis(self.ctx.attempt, timeout_s)

    def diagnosis_poll(self):
        return Poll(self.c, open_key(self.ctx.attempt))

    def put(self, key, value):
        self.c.put(key, value)

    def mark(self, key, value):
        self.c.put(key, value)

    def _send_event(self, event, wait):
        self.c.record(event)


def ctx(rank, world_size=2):
    return SimpleNamespace(rank=rank, world_size=world_size, attempt=0, node_id=f"node{rank}",
                           gpu_ids=(str(rank),), run_dir="/nonexistent")


def stall():
    return Decision("restart", Verdict("", "stall", None, 4.1, 4.0, 0, 0.0, "no progress"),
                    "no progress for 4.1 s")


def events(tmp_path):
    with open(tmp_path / "events.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def coordinator(tmp_path):
    """The coordinator on an event loop of its own, called from the ranks' threads."""
    return InProcessCoordinator(RunCoordinator(str(tmp_path / "events.jsonl"),
                                               {"run": "t", "metrics": None}))


def rank_parts(c, rank, world_size, kills, wait_s=5.0):
    """One rank's probe and stall responder (its kill only noted)."""
    link = InProcessLink(ctx(rank, world_size), c)
    probe = HangProbe(link, dump=lambda: f"/stacks/rank{rank}.txt", wait_s=wait_s)
    responder = StallResponder(link, last_step=lambda: 2, local_run_dir=True,
                               kill=lambda: kills.append((rank, time.monotonic())), probe=probe)
    return probe, responder


def test_one_decision_before_any_kill_naming_the_rank_behind(tmp_path, monkeypatch):
    c = coordinator(tmp_path)
    kills: list = []
    state = {0: {"0": {"entered": {"seq": 7, "op": "all_reduce", "sizes": [[4]]}, "completed": 6}},
             1: {"0": {"entered": {"seq": 6, "op": "all_reduce", "sizes": [[4]]}, "completed": 6}}}
    local = threading.local()
    monkeypatch.setattr(hang, "collective_state", lambda: state[local.rank])
    _, r0 = rank_parts(c, 0, 2, kills)
    p1, _ = rank_parts(c, 1, 2, kills)

    def rank1_watchdog():  # its bound has not fired: it only ticks
        local.rank = 1
        for _ in range(200):
            p1.tick()
            if p1.answered:
                return
            time.sleep(0.01)

    def rank0_fires():
        local.rank = 0
        r0(stall())

    threads = [threading.Thread(target=rank0_fires), threading.Thread(target=rank1_watchdog)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    log = events(tmp_path)
    diagnosed = [e for e in log if e["kind"] == "hang_diagnosed"]
    assert len(diagnosed) == 1
    d = diagnosed[0]
    assert d["culprits"] == [1] and d["waiting"] == [0] and d["answered"] == [0, 1]
    assert d["collective"] == {"op": "all_reduce", "pg": "0", "seq": 7, "sizes": [[4]]}
    assert d["stacks"] == {"0": "/stacks/rank0.txt", "1": "/stacks/rank1.txt"}
    assert d["nodes"] == {"1": "node1"} and d["gpu_ids"] == {"1": ["1"]}
    stalls = [e for e in log if e["kind"] == "stall_detected"]
    assert len(stalls) == 1 and stalls[0]["rank"] == 0 and stalls[0]["culprits"] == [1]
    assert "hang diagnosed: rank 1 on node node1, GPU 1 never entered" in stalls[0]["detail"]
    assert kills and kills[0][0] == 0  # only the rank whose bound fired ends itself
    assert c.get("cause:0:0") == "killed by rayguard: stall"


def test_a_rank_that_never_answers_is_named_after_the_bound(tmp_path, monkeypatch):
    c = coordinator(tmp_path)
    kills: list = []

    monkeypatch.setattr(hang, "collective_state", lambda: {
        "0": {"entered": {"seq": 3, "op": "all_reduce", "sizes": []}, "completed": 2}})
    c.put("place:0:1", {"node": "nodeB", "gpu_ids": ["5"]})
    _, r0 = rank_parts(c, 0, 2, kills, wait_s=0.3)
    started = time.monotonic()
    r0(stall())
    assert time.monotonic() - started < 10
    d = next(e for e in events(tmp_path) if e["kind"] == "hang_diagnosed")
    assert d["culprits"] == [1] and d["silent"] == [1] and d["answered"] == [0]
    assert d["nodes"] == {"1": "nodeB"} and d["gpu_ids"] == {"1": ["5"]}
    assert "rank 1 on node nodeB, GPU 5 gave no answer" in d["detail"]
    assert kills


def test_a_second_rank_firing_joins_the_decision_and_records_no_stall(tmp_path, monkeypatch):
    c = coordinator(tmp_path)
    kills: list = []

    monkeypatch.setattr(hang, "collective_state", lambda: {})
    _, r0 = rank_parts(c, 0, 2, kills)
    _, r1 = rank_parts(c, 1, 2, kills)
    threads = [threading.Thread(target=r, args=(stall(),)) for r in (r0, r1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    log = events(tmp_path)
    assert [e["kind"] for e in log].count("hang_diagnosed") == 1
    assert [e["kind"] for e in log].count("stall_detected") == 1
    assert sorted(k[0] for k in kills) == [0, 1]  # both bounds fired: both end
    assert c.get("cause:0:0") == c.get("cause:0:1") == "killed by rayguard: stall"


def test_a_rank_alone_records_its_stall_as_before(tmp_path):
    recorded: list = []

    class Alone(NullLink):
        def record(self, kind, detail, **kw):
            recorded.append((kind, kw))

    link = Alone(ctx(0, world_size=1))
    kills: list = []
    probe = HangProbe(link, dump=lambda: "/stacks/0.txt", wait_s=5)
    StallResponder(link, last_step=lambda: 3, local_run_dir=True, kill=lambda: kills.append(1),
                   probe=probe)(stall())
    assert [k for k, _ in recorded] == ["stall_detected"] and kills == [1]
    assert "culprits" not in recorded[0][1]
    probe.tick()  # nothing to poll for a rank alone
    assert not probe.answered
