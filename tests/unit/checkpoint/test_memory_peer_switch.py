"""``CheckpointConfig(memory_peer_copy=False)``: the memory tier keeps the own node's copy and
asks no peer node for one (the offer's background registration, with Ray's parts faked)."""

from __future__ import annotations

import types

import pytest

import rayguard
from rayguard.train import memory_tier


class _Link:
    connected = True
    timeouts = types.SimpleNamespace(memory_s=5.0)
    ctx = types.SimpleNamespace(rank=0, run_dir="/run")

    def __init__(self):
        self.offers = []

    def memory_offer(self, final, step, digests, held):
        self.offers.append((final, step))


class _Keeper:
    class hold:  # noqa: N801 - Ray's method-handle shape
        @staticmethod
        def remote(files):
            return "ref"


@pytest.mark.parametrize("peer", [True, False])
def test_the_peer_copy_is_asked_for_only_when_on(monkeypatch, peer):
    import ray

    config = rayguard.CheckpointConfig(memory_tier=True, memory_peer_copy=peer)
    link = _Link()
    tier = memory_tier.MemoryTier.for_run(link, config, None)  # type: ignore[arg-type]
    asked = []
    monkeypatch.setattr(memory_tier, "queue_peer_copy", lambda _l, final: asked.append(final))
    monkeypatch.setattr(tier, "_keeper", lambda: _Keeper())
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    monkeypatch.setattr("rayguard.checkpoint.memory.pack_shard", lambda rank, payload: {})
    monkeypatch.setattr("rayguard.checkpoint.memory.digests_of", lambda record: {})
    tier.offer("/run/checkpoint_3", 3, payload=object(), record=object())
    memory_tier._wait_pending()
    assert link.offers == [("/run/checkpoint_3", 3)]  # the own copy, either way
    assert asked == (["/run/checkpoint_3"] if peer else [])
