"""What a report's metrics and step are, whoever reports (``rayguard.train.report`` or a
loop's own ``ray.train.report``)."""

from __future__ import annotations

from typing import Any


def plain(value: Any) -> Any:
    """Ray Train refuses tensors in metrics: one-element tensors and numpy scalars become
    Python numbers; anything else is passed on unchanged."""
    numel = getattr(value, "numel", None)
    if callable(numel) and numel() == 1:  # torch.Tensor
        return value.item()
    if type(value).__module__ == "numpy" and getattr(value, "size", 0) == 1:
        return value.item()
    return value


def resolve_step(step: int | None, metrics: dict[str, Any], state: Any, last_step: int,
                 keys: tuple[str, ...] = ("step",)) -> int:
    """The step of a report: explicit, else the first of ``metrics[key]`` for ``keys``, else
    ``state['step']``, else one past the last."""
    for candidate in (step, *(metrics.get(k) for k in keys),
                      state.get("step") if isinstance(state, dict) else None):
        if isinstance(candidate, int) and not isinstance(candidate, bool):
            return candidate
    return last_step + 1


REPORT_UNIT = "report"
"""The unit of a report that carries no step-like metric: the report itself."""


def step_unit(metrics: dict[str, Any], keys: tuple[str, ...]) -> str:
    """What a report's step counts: the first of ``keys`` that ``metrics`` holds as an integer
    (the one :func:`resolve_step` reads), else :data:`REPORT_UNIT`."""
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return key
    return REPORT_UNIT


def resumed_last_step(offered: bool, sealed_step: int | None, last_step: int) -> int:
    """The last step before an attempt's first report, once ``ray.train.get_checkpoint()``
    has answered: the offered checkpoint's sealed step (a report without a step-like metric
    then counts on from it: the run's count, not the attempt's); ``-1`` when nothing is
    offered (the loop starts fresh); ``last_step`` unchanged when the offered checkpoint
    records no step (no manifest: reported before rayguard guarded the loop)."""
    if not offered:
        return -1
    return last_step if sealed_step is None else sealed_step
