"""Ray-private parts of preemption handling (Ray 2.60, Train V2).

* Signal handlers can only be installed from a process's main thread, and Train V2 runs the
  training function in a thread of the worker actor. The worker actor (``RayTrainWorker``) is
  a plain actor whose tasks run on the main thread, and it has an ``execute(fn, *args)``
  method: calling it on this worker's own handle runs ``fn`` there, between the controller's
  status polls.
* Ray Train's ``PreemptionWatcher`` (controller side) polls GCS for draining nodes and calls
  ``RayTrainWorker.mark_preempt`` on every worker, which stores a ``PreemptionInfo`` in the
  worker's train context. The public ``ray.train.get_preemption_info()`` is a broadcast (a
  barrier through Ray's synchronisation actor); reading the stored value is an attribute
  read, so rayguard reads it at every report and agrees through its own flag all-reduce.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("rayguard")


def run_on_actor_main_thread(fn: Callable[..., Any], *args: Any, timeout_s: float = 10.0) -> Any:
    """Run the module-level function ``fn(*args)`` on this Train worker actor's main thread
    and return its result (raises if Ray's worker has no such method or it times out)."""
    import ray

    actor = ray.get_runtime_context().current_actor
    return ray.get(actor.execute.remote(fn, *args), timeout=timeout_s)


def drain_notice() -> tuple[float | None, list[int]] | None:
    """``(grace_s, preempted_ranks)`` when Ray Train told this worker that a node of its group
    is being drained (``grace_s``: seconds to Ray's deadline, ``None`` if none was given);
    ``None`` otherwise, or when this Ray has no such information."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        info = get_train_context().preemption_context.preemption_info
    except Exception:  # not a Train V2 worker, or another Ray version
        return None
    if info is None:
        return None
    deadline_ms = getattr(info, "deadline_ms", None)
    grace = None if not deadline_ms else max(0.0, deadline_ms / 1000.0 - time.time())
    return grace, list(getattr(info, "preempted_ranks", []))
