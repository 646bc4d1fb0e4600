"""Live recovery's pure decisions, its coordinator notice, the report forwarding's hold, and
the trainer's choice of the live backend (no Ray cluster)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from rayguard.exceptions import ConfigError, PeersLostError
from rayguard.health.config import HealthConfig
from rayguard.health.live import (
    LAST_COMMITTED_KEY,
    MAX_WAIT_S,
    bounded_wait_s,
    live_key,
    looks_like_peer_loss,
    opened_key,
    plan_rejoin,
    setup_wait_s,
    setup_within_s,
)
from rayguard.run.coordinator import RunCoordinator
from rayguard.testing.coordinator import InProcessCoordinator
from rayguard.train.forwarder import Forwarder

GLOO = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:33664. This is typically caused by a remote worker crashing.")


def test_a_peer_loss_is_told_from_a_ranks_own_bug():
    assert looks_like_peer_loss("RuntimeError", GLOO)
    assert looks_like_peer_loss("DistBackendError", "NCCL communicator was aborted")
    assert looks_like_peer_loss("PeersLostError", str(PeersLostError("rank 0: peers lost")))
    assert not looks_like_peer_loss("ValueError", "my bug at this step")
    assert not looks_like_peer_loss("InjectedFault", "injected fault raise:rank=1 on rank 1")


def test_a_survivor_rejoins_only_with_a_notice_that_spares_it():
    assert not plan_rejoin(None, rank=0, attempt=3).rejoin
    assert "own" in plan_rejoin(None, rank=0, attempt=3).reason
    mine = plan_rejoin({"attempt": 4, "ranks": [0]}, rank=0, attempt=3)
    assert not mine.rejoin and "itself" in mine.reason
    go = plan_rejoin({"attempt": 4, "ranks": [1, 2]}, rank=0, attempt=3)
    assert go.rejoin and go.attempt == 4 and go.replaced == (1, 2)


def test_live_wait_s_is_validated():
    assert HealthConfig(live_wait_s=5).live_wait_s == 5
    for bad in (0, -1, float("inf"), True, "30", 4000):
        with pytest.raises(ConfigError, match="live_wait_s"):
            HealthConfig(live_wait_s=bad)


def test_opening_a_live_recovery_releases_the_lost_attempts_waits(tmp_path):
    c = InProcessCoordinator(RunCoordinator(str(tmp_path / "events.jsonl"),
                                            {"run": "t", "metrics": None}))
    c.open_attempt("restart")
    out: dict[str, object] = {}
    waiter = threading.Thread(target=lambda: out.update(v=c.gather("a0:flags3", 0, 2, 1)))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # rank 1 never comes: rank 0 waits
    new = c.open_attempt("live", 0, [1], "rank 1 replaced").number
    waiter.join(timeout=10)
    assert not waiter.is_alive() and out["v"] is None
    assert new == 1 and c.attempt() == 1
    notice = c.get(live_key(0))
    assert notice == c.get(opened_key(1)) and notice["ranks"] == [1] and notice["attempt"] == 1
    assert "setup_within_s" not in notice  # none given: the survivors wait live_wait_s
    bounded = c.open_attempt("live", 1, [0], "rank 0 replaced", within_s=90.0)
    assert c.get(opened_key(bounded.number))["setup_within_s"] == 90.0
    # a gather of the next attempt is not released: it times out (0.3 s)
    assert c.gather("a1:flags1", 0, 2, 1, 0.3) is None
    assert c.gather("a0:late", 0, 2, 1, 600.0) is None  # the lost attempt's: at once
    c.stop()


def test_the_last_committed_checkpoint_is_kept_for_a_live_attempt(tmp_path):
    c = RunCoordinator(str(tmp_path / "events.jsonl"), {"run": "t", "metrics": None})
    c.open_attempt("restart")
    for step in (4, 9):
        c.record({"kind": "checkpoint_committed", "step": step, "path": f"/r/ckpt{step}",
                  "time": time.time(), "detail": "x"})
    assert c.get(LAST_COMMITTED_KEY) == "/r/ckpt9"


def test_a_held_forwarder_starts_nothing_and_drops_its_queue_when_abandoned():
    f = Forwarder()
    ran: list[int] = []
    f.hold()
    futures = [f.submit(ran.append, i) for i in range(3)]
    time.sleep(0.2)
    assert ran == []
    assert f.abandon(timeout_s=5)
    assert ran == [] and all(fut.cancelled() for fut in futures)


def test_a_resumed_forwarder_forwards_what_it_held():
    f = Forwarder()
    ran: list[int] = []
    f.hold()
    f.submit(ran.append, 1)
    f.resume()
    f.flush(timeout_s=5)
    assert ran == [1]
    f.close(timeout_s=5)


def test_the_live_backend_is_chosen_only_where_a_worker_can_be_replaced_alone():
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig

    import rayguard
    from rayguard._ray.live_backend import LiveTorchConfig, apply_live

    live = rayguard.GuardConfig(recovery="live")
    kwargs = {"scaling_config": ScalingConfig(num_workers=2),
              "torch_config": TorchConfig(backend="gloo", timeout_s=77)}
    assert apply_live(live, kwargs)
    config = kwargs["torch_config"]
    assert isinstance(config, LiveTorchConfig) and config.backend == "gloo"
    assert config.timeout_s == 77 and config.backend_cls.has_replica_groups
    assert rayguard.GuardConfig().recovery == "live"  # the default
    assert apply_live(rayguard.GuardConfig(), {"scaling_config": ScalingConfig(num_workers=2)})
    restart = rayguard.GuardConfig(recovery="restart")  # the opt-out
    assert not apply_live(restart, {"scaling_config": ScalingConfig(num_workers=2)})
    elastic = {"scaling_config": ScalingConfig(num_workers=(1, 2))}
    assert apply_live(live, elastic)  # its size changes are made in place where they can be
    assert isinstance(elastic["torch_config"], LiveTorchConfig)
    for kwargs in ({"scaling_config": ScalingConfig(num_workers=1)},
                   {"scaling_config": ScalingConfig(num_workers=(1, 1))},
                   {"scaling_config": ScalingConfig(num_workers=2),
                    "torch_config": LiveTorchConfig()}):
        before = dict(kwargs)
        assert not apply_live(live, kwargs) and kwargs == before
    # an elastic run that may hold 2 or more is live too: its size changes resize in place
    elastic = {"scaling_config": ScalingConfig(num_workers=(1, 2))}
    assert apply_live(live, elastic) and isinstance(elastic["torch_config"], LiveTorchConfig)


class _Poll:
    def __init__(self):
        self.fact = None
        self.asked = 0

    def value(self):
        self.asked += 1
        return self.fact


class _Link:
    class ctx:
        attempt = 3

    def __init__(self):
        self.poll = _Poll()
        self.keys = []

    def fact_poll(self, key):
        self.keys.append(key)
        return self.poll


def test_the_live_watch_aborts_the_group_once_a_peer_is_reported_lost():
    from rayguard.train.live import LiveWatch

    link, aborted = _Link(), []
    watch = LiveWatch(link, abort=lambda: aborted.append(1))
    assert link.keys == [live_key(3)]
    watch.tick()
    watch.tick()
    assert aborted == []  # no notice yet
    link.poll.fact = {"attempt": 4, "ranks": [1]}
    watch.tick()
    watch.tick()
    assert aborted == [1] and watch.aborted  # once


class _FactLink:
    """Facts as the coordinator holds them, for a rank of attempt 1."""

    class ctx:
        rank, attempt = 0, 1

    def __init__(self, facts):
        self.facts = facts

    def get(self, key):
        return self.facts.get(key)


def test_a_survivor_whose_set_up_gather_ended_moves_on_when_the_attempt_is_superseded():
    from rayguard.train.live import AttemptSuperseded, setup_lost

    moved = _FactLink({live_key(1): {"attempt": 2, "ranks": [1]}})
    with pytest.raises(AttemptSuperseded) as raised:
        setup_lost(moved, 30)
    assert raised.value.attempt == 2
    with pytest.raises(PeersLostError, match="live_wait_s"):
        setup_lost(_FactLink({}), 0.2)
    mine = _FactLink({live_key(1): {"attempt": 2, "ranks": [0]}})  # this rank is replaced
    with pytest.raises(PeersLostError):
        setup_lost(mine, 0.2)


def test_a_survivor_waits_for_its_replacements_start_as_long_as_the_notice_says(monkeypatch):
    """A replacement is a new process (no warm spare yet on its node): its start on a loaded
    node took longer than live_wait_s (30 s), the survivor gave up, and the whole group
    restarted. The controller writes how long to wait into the notice; the survivor waits
    that, the replacement (its peers' set-up facts already kept) live_wait_s."""
    import rayguard.train.setup as setup

    monkeypatch.setattr(setup, "_worker_info", lambda ctx: {"rank": ctx.rank})

    class Link:
        alone = False

        def __init__(self, facts):
            self.facts, self.bounds = facts, []

        def get(self, key):
            return self.facts.get(key)

        def gather(self, tag, value, *, kept=False, timeout_s=None):
            self.bounds.append((tag, kept, timeout_s))
            return [value]

    ctx = SimpleNamespace(rank=0, attempt=1)
    link = Link({opened_key(1): {"attempt": 1, "ranks": [1], "setup_within_s": 90.0}})
    assert setup._setup_infos(link, ctx, by_marks=True, wait_s=30.0, survivor=True) == [
        {"rank": 0, "setup_start_time": None}]
    setup._setup_infos(link, ctx, by_marks=True, wait_s=30.0)  # the replacement's own wait
    assert link.bounds == [("setup", True, 90.0), ("setup", True, 30.0)]
    older = Link({opened_key(1): {"attempt": 1, "ranks": [1]}})  # a notice without a bound
    setup._setup_infos(older, ctx, by_marks=True, wait_s=30.0, survivor=True)
    assert older.bounds == [("setup", True, 30.0)]


def test_the_set_up_bound_is_the_replacements_start_and_set_up_never_below_live_wait_s():
    assert setup_within_s(30.0, 60.0) == 90.0
    assert setup_wait_s({"setup_within_s": 90.0}, 30.0) == 90.0
    assert setup_wait_s({"setup_within_s": 5.0}, 30.0) == 30.0  # never below live_wait_s
    assert setup_wait_s({}, 30.0) == setup_wait_s(None, 30.0) == 30.0
    for junk in (True, "90", float("nan"), None, [90]):
        assert bounded_wait_s(junk, 12.0) == 12.0, junk
    assert bounded_wait_s(float("inf"), 12.0) == bounded_wait_s(10**400, 12.0) == MAX_WAIT_S
