"""The link of a worker without a coordinator (NullLink): nothing to ask, nothing fails;
a link's waits feed the watchdog only where it was built to (feeding / quiet)."""

from __future__ import annotations

import torch

from rayguard.run.link import NullLink, RunLink, make_link
from rayguard.run.timeouts import LinkTimeouts, read_attempt
from rayguard.train.context import GuardContext


def _ctx(world_size: int = 1) -> GuardContext:
    return GuardContext(rank=0, local_rank=0, world_size=world_size, local_world_size=1,
                        node_rank=0, node_id="n0", device=torch.device("cpu"), seed=None,
                        attempt=0, run_dir="/tmp/unused")


def test_without_a_coordinator_the_link_answers_locally():
    link = make_link(_ctx(world_size=2), None)
    assert isinstance(link, NullLink) and not link.connected and link.actor is None
    assert read_attempt(None) == 0
    assert link.gather("setup", {"rank": 0}) == [{"rank": 0}]
    assert link.claim("k") and link.claim("k")  # every claim is won: faults fire locally
    assert link.get("k") is None and link.wait_for("k") is None
    assert link.rejected_checkpoints() == {} and link.memory_committed() is None
    link.record("fault_injected", "x", step=1, wait=True)  # logged only
    link.mark("cause:0:0", "x")
    link.put("k", 1)
    link.contribute("t", None)
    link.record_failure(ValueError("boom"), last_step=3)
    link.send_progress({"step": 1}, wait=True)
    link.send_summary({"step": 1}, wait=True)


def test_a_link_built_with_an_actor_is_a_run_link():
    link = make_link(_ctx(), object(), timeouts=LinkTimeouts(ack_s=1.0))
    assert type(link) is RunLink and link.connected and link.timeouts.ack_s == 1.0


def test_feeding_and_quiet_links_share_everything_but_the_heartbeat():
    beats: list[int] = []
    link = make_link(_ctx(), None)
    loop = link.feeding(lambda: beats.append(1))
    background = loop.quiet()
    loop.progress()
    background.progress()
    link.progress()
    assert beats == [1]
    assert isinstance(loop, NullLink) and loop.ctx is link.ctx and background.ctx is link.ctx
