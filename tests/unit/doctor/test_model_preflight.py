"""The model preflight at the first report: pure checks over per-rank facts, and the facts
collected from real modules and states."""

from __future__ import annotations

import torch

from rayguard.doctor import CODES
from rayguard.doctor.model import ModelFacts, check_model
from rayguard.train.model_preflight import collect, log_findings


def _model(seed: int, bn: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(4, 8)] + ([torch.nn.BatchNorm1d(8)] if bn else []) + [torch.nn.Linear(8, 1)]
    return torch.nn.Sequential(*layers)


def test_codes_are_listed():
    assert {"MODEL_BATCHNORM_NOT_SYNCED", "MODEL_PARAMS_DIFFER", "STATE_FULL_ON_EVERY_RANK"} <= set(CODES)


def test_unsynced_batchnorm_is_found_and_warned_once():
    facts = collect(None, {"model": _model(0)})
    assert facts.unsynced_batchnorm == ("1 (BatchNorm1d)",)
    synced = collect(None, {"model": torch.nn.SyncBatchNorm.convert_sync_batchnorm(_model(0))})
    assert synced.unsynced_batchnorm == ()
    findings = check_model([facts, facts])
    assert [f.code for f in findings] == ["MODEL_BATCHNORM_NOT_SYNCED"]
    assert "convert_sync_batchnorm" in findings[0].fix and "1 (BatchNorm1d)" in findings[0].message
    assert check_model([facts]) == []  # one rank: nothing to synchronise


def test_params_differing_across_ranks():
    a, b, c = (collect(None, {"model": _model(s, bn=False)}) for s in (0, 0, 1))
    assert a.replicated_fingerprint == b.replicated_fingerprint != c.replicated_fingerprint
    assert check_model([a, b]) == []
    findings = check_model([a, b, c])
    assert [f.code for f in findings] == ["MODEL_PARAMS_DIFFER"]
    assert "ranks [0, 1]" in findings[0].message and "ranks [2]" in findings[0].message
    assert "manual_seed" in findings[0].fix
    assert check_model([a, ModelFacts()]) == []  # a rank without a model: no verdict


def test_same_full_state_on_every_rank():
    state = {"model": {"w": torch.zeros(1024, 64)}, "step": 3}
    facts = [collect(state, None) for _ in range(2)]
    assert facts[0].state_bytes == 1024 * 64 * 4 and facts[0].state_signature
    findings = check_model(facts, full_state_warn_bytes=1024)
    assert [f.code for f in findings] == ["STATE_FULL_ON_EVERY_RANK"]
    assert "sharded=" in findings[0].fix and "rank 0 only" in findings[0].fix
    assert check_model(facts) == []  # below the default 64 MiB
    other = collect({"model": {"w": torch.zeros(512, 64)}}, None)
    assert check_model([facts[0], other], full_state_warn_bytes=1024) == []
    assert check_model([facts[0], collect(None, None)], full_state_warn_bytes=1024) == []


def test_log_findings_and_a_failed_collection(caplog):
    facts = collect(None, {"model": _model(0)})
    with caplog.at_level("WARNING", logger="rayguard"):
        messages = log_findings([facts, facts])
    assert messages and messages[0].startswith("rayguard preflight MODEL_BATCHNORM_NOT_SYNCED")
    assert messages[0] in caplog.text

    class Broken(torch.nn.Module):
        def named_modules(self, *a, **k):
            raise RuntimeError("boom")

    assert collect(None, {"model": Broken()}) == ModelFacts()
