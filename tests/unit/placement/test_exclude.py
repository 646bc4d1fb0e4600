"""Merging the quarantine's node exclusion into the user's label selectors (pure), checked
against Ray's own label-selector validation."""

from __future__ import annotations

import pytest
from ray._private.label_utils import validate_label_selector

from rayguard.exceptions import ConfigError
from rayguard.placement.exclude import NODE_ID_LABEL, exclude_nodes, workers_that_fit

KEY = NODE_ID_LABEL
A, B, C = "a" * 56, "b" * 56, "c" * 56


def valid(selectors):
    for s in selectors:
        assert validate_label_selector(s) is None, s
    return selectors


def test_no_selector_gets_one_exclusion_per_worker() -> None:
    assert valid(exclude_nodes(None, [B, A], 2)) == [{KEY: f"!in({A}, {B})"}] * 2
    assert exclude_nodes(None, [], 3) is None


def test_a_dict_selector_is_kept_for_every_worker() -> None:
    out = valid(exclude_nodes({"zone": "us-east1"}, [A], 2))
    assert out == [{"zone": "us-east1", KEY: f"!in({A})"}] * 2
    assert exclude_nodes({"zone": "z"}, [], 2) == [{"zone": "z"}] * 2
    out[0]["zone"] = "changed"
    assert out[1]["zone"] == "us-east1"  # copies, not one shared dict


def test_a_per_worker_list_is_merged_worker_by_worker() -> None:
    out = valid(exclude_nodes([{"gpu": "H100"}, {"gpu": "A100"}, {}], [A], 3))
    assert [s["gpu"] if "gpu" in s else None for s in out] == ["H100", "A100", None]
    assert all(s[KEY] == f"!in({A})" for s in out)
    assert len(exclude_nodes([{"x": "1"}], [A], 3)) == 3  # shorter list: the rest unconstrained


def test_the_users_node_constraint_is_combined() -> None:
    assert exclude_nodes({KEY: f"!in({C})"}, [A], 1) == [{KEY: f"!in({A}, {C})"}]
    assert exclude_nodes({KEY: f"!{C}"}, [A], 1) == [{KEY: f"!in({A}, {C})"}]
    assert exclude_nodes({KEY: f"in({A}, {B}, {C})"}, [A], 1) == [{KEY: f"in({B}, {C})"}]
    assert exclude_nodes({KEY: f"in({A}, {B})"}, [A], 1) == [{KEY: B}]
    assert exclude_nodes({KEY: B}, [A], 1) == [{KEY: B}]  # pinned to an admitted node


@pytest.mark.parametrize("given", [A, f"in({A})", f"in({A}, {B})"])
def test_a_selector_admitting_only_quarantined_nodes_is_an_error(given) -> None:
    with pytest.raises(ConfigError) as info:
        exclude_nodes([{KEY: given}], [A, B], 1)
    message = str(info.value)
    assert "label_selector" in message and "worker 0" in message and given in message
    assert "rayguard quarantine lift" in message and "quarantine_after=None" in message


def test_workers_that_fit_counts_only_admitted_nodes() -> None:
    nodes = {"head": {"CPU": 0.0}, A: {"CPU": 4.0, "GPU": 2.0}, B: {"CPU": 3.0, "GPU": 4.0}}
    assert workers_that_fit(nodes, {"CPU": 1.0, "GPU": 1.0}) == 5
    assert workers_that_fit(nodes, {"CPU": 1.0, "GPU": 1.0}, [B]) == 2
    assert workers_that_fit(nodes, {"CPU": 2.0, "GPU": 0.0}, [A]) == 1
    assert workers_that_fit(nodes, {"CPU": 1.0}, [A, B]) == 0
    assert workers_that_fit(nodes, {"CPU": 0.0}, [A, B]) > 1000  # needs nothing: any number
