"""The trainer's divergence check (``HealthConfig(divergence=...)``): the config's errors, the
per-rank watch, the data-skip plan and the sampler that takes it."""

from __future__ import annotations

import pytest

import rayguard
from rayguard.elastic import ElasticSampler
from rayguard.exceptions import ConfigError, DivergedMetricError, NonFiniteMetricError
from rayguard.health.divergence import (
    DivergenceConfig,
    DivergenceWatch,
    offer_data_skip,
    plan_skip,
    take_data_skip,
)
from rayguard.health.finite import FiniteGuard
from rayguard.train.rollback import plan_rollback


@pytest.mark.parametrize(("field", "value"), [("factor", 1.0), ("factor", float("inf")),
                                              ("factor", True), ("window", 1),
                                              ("min_reports", 2.5), ("mode", "lowest"),
                                              ("metric", ""), ("skip_data", "yes")])
def test_a_bad_value_names_the_field_and_the_fix(field, value):
    with pytest.raises(ConfigError, match=f"DivergenceConfig.*{field}.*Fix"):
        DivergenceConfig(**{field: value})


def test_health_config_takes_only_a_divergence_config():
    assert rayguard.HealthConfig().divergence is None
    assert rayguard.HealthConfig(divergence=rayguard.DivergenceConfig()).divergence.factor == 10
    with pytest.raises(ConfigError, match="divergence.*DivergenceConfig"):
        rayguard.HealthConfig(divergence=10.0)


def _watch(**kwargs):
    return DivergenceWatch(DivergenceConfig(**kwargs), ("loss", "train_loss"))


def test_a_spike_beyond_the_factor_diverges_and_stays_out_of_the_series():
    watch = _watch(min_reports=3)
    for step, loss in enumerate([4.0, 2.0, 1.0, 0.9]):
        assert watch.check({"loss": loss}, step) is None
    reason = watch.check({"loss": 50.0}, 4)  # > 10 x max(best 0.9, median 1.5)
    assert reason and "'loss' diverged at step 4" in reason
    assert watch.check({"loss": 0.8}, 5) is None  # the spike did not raise the median


def test_noise_below_the_factor_and_early_reports_are_not_divergence():
    watch = _watch(min_reports=5)
    assert watch.check({"loss": 1.0}, 0) is None
    assert watch.check({"loss": 1e6}, 1) is None  # too few reports to judge
    healthy = _watch(min_reports=2)
    for step, loss in enumerate([1.0, 0.5, 0.6, 4.0, 0.4]):  # 4.0 < 10 x median
        assert healthy.check({"loss": loss}, step) is None


def test_the_first_watched_metric_present_is_judged_and_nan_is_left_to_the_nan_guard():
    watch = _watch(min_reports=2)
    for step in range(3):
        assert watch.check({"train_loss": 1.0}, step) is None
    assert watch.check({"train_loss": float("nan")}, 3) is None
    assert watch.check({"train_loss": 100.0}, 4)
    assert watch.check({"accuracy": 1e9}, 5) is None  # not watched
    maximize = DivergenceWatch(DivergenceConfig(metric="acc", mode="max", min_reports=2), ())
    for step in range(3):
        assert maximize.check({"acc": 0.9}, step) is None
    assert maximize.check({"acc": 0.01}, 3)


def test_the_skip_covers_the_steps_from_the_checkpoint_to_the_divergence():
    assert plan_skip(6, 7) == 1
    assert plan_skip(3, 7) == 4
    assert plan_skip(7, 7) == 0 and plan_skip(9, 7) == 0  # restored past it
    assert plan_skip(None, 7) == 0 and plan_skip(6, None) == 0


def test_the_sampler_takes_the_skip_once():
    sampler = ElasticSampler(96, global_batch_size=8, micro_batch_size=4, rank=0,
                             world_size=2, shuffle=False)
    saved = {**sampler.state_dict(), "cursor": 56}
    offer_data_skip(1)
    sampler.load_state_dict(saved)
    assert sampler.cursor == 64 and sampler.micro_batches()[0][0] == 64
    sampler.load_state_dict(saved)  # taken: a second restore reads where it was saved
    assert sampler.cursor == 56
    offer_data_skip(100)  # never past the epoch's end
    sampler.load_state_dict(saved)
    assert sampler.cursor == sampler.end
    assert take_data_skip() == 0


class _Link:
    class ctx:
        rank, node_id = 0, "n"

    def __init__(self):
        self.events, self.marks = [], {}

    def record(self, kind, detail, **fields):
        self.events.append((kind, detail, fields))

    def mark(self, key, value):
        self.marks[key] = value


def _guard(**health):
    config = rayguard.HealthConfig(divergence=DivergenceConfig(min_reports=2), **health)
    link = _Link()
    guard = FiniteGuard(config, link, lambda: None)
    for step in range(3):
        assert guard.check({"loss": 1.0}, step) is False
    return guard, link


def test_a_divergence_is_recorded_and_kept_then_deferred_or_raised():
    guard, link = _guard()
    assert guard.check({"loss": 100.0}, 3, defer=True) is True
    kind, detail, fields = link.events[-1]
    assert kind == "diverged" and fields["path"] == "in_place" and "in place" in detail
    assert link.marks == {"diverged": {"step": 3}}
    with pytest.raises(DivergedMetricError, match="diverged at step 4.*this attempt stops") as raised:
        guard.check({"loss": 100.0}, 4)
    assert isinstance(raised.value, NonFiniteMetricError)  # retried as a NaN is
    fail, _ = _guard(nan_policy="fail")
    with pytest.raises(NonFiniteMetricError, match="nan_policy='fail'"):
        fail.check({"loss": 100.0}, 3, defer=True)


def test_a_divergence_that_comes_back_says_how_to_leave_its_data_out():
    first = plan_rollback(0, -1, step=7, what="divergence")
    again = plan_rollback(1, -1, step=7, last_step=7, repeats=first.repeats, what="divergence")
    assert again.ok
    third = plan_rollback(2, -1, step=7, last_step=7, repeats=again.repeats, what="divergence")
    assert not third.ok and "divergence at step 7 again" in third.reason
    assert "ElasticSampler" in third.reason
