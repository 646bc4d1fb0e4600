"""Ray Train's ``PlacementGroupCleaner`` where it cannot work: left out.

Ray Train starts a detached ``PlacementGroupCleaner`` actor with every run; its thread asks
Ray's State API every few seconds whether the controller is still alive, to remove the run's
placement group if the controller died without doing so. The State API is served by the
dashboard: on a cluster started without it (``ray.init(include_dashboard=False)``, as
rayguard's examples and tests start theirs, or a ``pip install ray`` with no
``ray[default]``), every question fails and the cleaner logs
``Failed to query Ray Train Controller actor state...`` to the driver's console, a few times
in a healthy run and dozens in a run with a fault, while it can never clean anything up.

:func:`without_blind_cleaner` drops Ray's ``PlacementGroupCleanerCallback`` from a run's
controller callbacks when one State API question fails at ``fit()`` (about 15 ms); with the
dashboard up the cleaner is kept as Ray starts it.

Relies on ``ray.train.v2._internal.callbacks.placement_group_callback
.PlacementGroupCleanerCallback`` (Ray 2.59 and 2.60); without it the callbacks are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("rayguard")

_NO_SUCH_ACTOR = "ffffffffffffffffffffffff01000000"


def state_api_answers(timeout_s: int = 2) -> bool:
    """Whether Ray's State API answers (the dashboard serves it) on the connected cluster."""
    try:
        from ray.util.state import get_actor

        get_actor(_NO_SUCH_ACTOR, timeout=timeout_s)
    except Exception as exc:  # ServerUnavailable, RayStateApiException, a timeout
        logger.debug("rayguard: Ray's State API does not answer: %s", exc)
        return False
    return True


def without_blind_cleaner(callbacks: list[Any],
                          answers: Callable[[], bool] = state_api_answers) -> list[Any]:
    """``callbacks`` without Ray's ``PlacementGroupCleanerCallback`` when the State API it
    polls does not answer (``answers()`` False); unchanged otherwise."""
    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import (
            PlacementGroupCleanerCallback,
        )
    except ImportError:
        return callbacks
    if not any(isinstance(c, PlacementGroupCleanerCallback) for c in callbacks) or answers():
        return callbacks
    logger.debug("rayguard: Ray's State API does not answer (no dashboard): Ray Train's "
                 "placement-group cleaner is not started (it could only warn)")
    return [c for c in callbacks if not isinstance(c, PlacementGroupCleanerCallback)]


__all__ = ["state_api_answers", "without_blind_cleaner"]
