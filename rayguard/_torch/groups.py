"""Leaving a broken default process group (live recovery, :mod:`rayguard.train.live`).

NCCL: the communicators are aborted (``torch.distributed.distributed_c10d.
_abort_process_group``, torch >= 2.4), so that no kernel keeps waiting on the lost peer and
the group can be formed again in the same process; elsewhere (gloo, whose collectives error
out when a peer's connection closes), or on a torch without the abort, the group is
destroyed. Never raises: a broken group is what is being left.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("rayguard")


def leave_default_group() -> str:
    """Abort (NCCL) or destroy the default group; returns what was done (``"none"``: there
    was no group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return "none"
    try:
        if "nccl" in str(dist.get_backend()):
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort is not None:
                abort()
                return "aborted"
        dist.destroy_process_group()
        return "destroyed"
    except Exception as exc:
        logger.debug("rayguard: leaving the process group: %s", exc)
        return "failed"


__all__ = ["leave_default_group"]
