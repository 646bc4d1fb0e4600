"""The one table of what is never retried, and the retry policies."""

from __future__ import annotations

from pathlib import Path

import rayguard.exceptions as exceptions
from rayguard.failures import fatal
from rayguard.failures.fatal import FATAL_BY_ATTRIBUTE, FATAL_ERRORS, FATAL_TYPES, fatal_cause

DOC = Path(__file__).resolve().parents[3] / "docs" / "failure-handling.md"


def test_the_retry_policies() -> None:
    assert fatal.RETRY_POLICIES == ("retried", "after_one_repeat", "not_retried")


def test_every_fatal_exception_is_in_the_table() -> None:
    fatal_in_exceptions = {
        cls for cls in vars(exceptions).values()
        if isinstance(cls, type) and issubclass(cls, BaseException)
        and (getattr(cls, "fatal", False) or issubclass(cls, FATAL_ERRORS))}
    listed = {cls for cls, _ in FATAL_TYPES}
    assert all(any(issubclass(c, t) for t in listed) for c in fatal_in_exceptions)
    assert FATAL_ERRORS == tuple(listed_cls for listed_cls, _ in FATAL_TYPES)
    assert FATAL_BY_ATTRIBUTE == ()  # every rayguard fatal class is in the one table
    assert {"FatalNonFiniteMetricError", "ShardedStateError"} <= {c.__name__ for c in listed}


def test_the_table_and_the_docs_name_the_same_classes() -> None:
    text = DOC.read_text()
    for cls, cause in FATAL_TYPES:
        assert f"`{cls.__name__}`" in text and f"`{cause}`" in text
        assert f"``{cls.__name__}``" in (fatal.__doc__ or "")
    for name in FATAL_BY_ATTRIBUTE:
        assert f"`{name}`" in text and f"``{name}``" in (fatal.__doc__ or "")
    for policy in fatal.RETRY_POLICIES:
        assert f"`{policy}`" in text


def test_fatal_cause_is_none_for_what_a_restart_may_fix() -> None:
    assert fatal_cause(RuntimeError("NCCL timeout")) is None
    assert fatal_cause(exceptions.CheckpointError("disk full")) is None
    assert fatal_cause(exceptions.NonFiniteMetricError("loss is nan")) is None
    assert fatal_cause(exceptions.RayVersionError("ray 2.10")) == "config"


def _fatal_class(name: str) -> type[BaseException]:
    """A fatal class by name, wherever it is defined now."""
    import importlib

    for module in ("rayguard.exceptions", "rayguard.train.session", "rayguard.train.checkpointing"):
        cls = getattr(importlib.import_module(module), name, None)
        if cls is not None:
            return cls
    raise AssertionError(f"{name} is defined nowhere")


def test_the_classes_defined_elsewhere_are_fatal_with_their_cause() -> None:
    from rayguard.failures import classify

    causes = {"FatalNonFiniteMetricError": "nan", "ShardedStateError": "checkpoint"}
    for name in FATAL_BY_ATTRIBUTE:
        failure = classify(_fatal_class(name)("x"))
        assert (failure.cause, failure.fatal, failure.retry) == (causes[name], True, "not_retried")
