"""Receive policy validation and the pure device planner."""

from __future__ import annotations

import pytest

from rayguard.exceptions import ConfigError, SerializationError
from rayguard.serialization.policy import (
    CUDA_POLICY_ENV_VAR,
    SerializerPolicy,
    default_policy,
    plan_device,
)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"cuda": "gpu"}, "cuda"), ({"zero_copy": 1}, "zero_copy"),
     ({"cow_min_bytes": -1}, "cow_min_bytes"), ({"cow_min_bytes": True}, "cow_min_bytes")],
)
def test_bad_values_name_field_and_fix(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"SerializerPolicy\({field}=.*Fix: pass {field}="):
        SerializerPolicy(**kwargs)


def test_env_var_sets_default_cuda_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CUDA_POLICY_ENV_VAR, "cpu")
    assert default_policy().cuda == "cpu"
    monkeypatch.setenv(CUDA_POLICY_ENV_VAR, "nonsense")
    with pytest.raises(ConfigError):
        default_policy()


@pytest.mark.parametrize(
    ("sent", "policy", "cuda", "current", "expected"),
    [
        ("cpu", "receiver", True, 0, "cpu"),
        ("cpu", "receiver", False, None, "cpu"),
        ("cuda:3", "receiver", True, 0, "cuda:0"),  # the sender's ordinal never matters
        ("cuda:0", "receiver", True, 1, "cuda:1"),
        ("cuda", "receiver", True, 2, "cuda:2"),
        ("cuda:1", "cpu", True, 0, "cpu"),
        ("cuda:1", "cpu", False, None, "cpu"),
    ],
)
def test_plan_device(sent: str, policy: str, cuda: bool, current: int | None,
                     expected: str) -> None:
    assert plan_device(sent, policy, cuda, current, "t") == expected


def test_cuda_tensor_without_cuda_is_an_error_not_a_hang() -> None:
    with pytest.raises(SerializationError, match=r"tensor\(x\).*cuda:7.*no CUDA device"):
        plan_device("cuda:7", "receiver", False, None, "tensor(x)")
