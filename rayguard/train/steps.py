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
