"""Whether a reported checkpoint that carries no manifest may still be offered.

A checkpoint a loop gave to ``ray.train.report`` under rayguard is sealed with a manifest
(:mod:`rayguard.checkpoint.reported`). One without any manifest is offered unverified, with
a warning, only when it can be a checkpoint reported before rayguard guarded the loop. It is
rejected when:

* the run's event log records ``checkpoint_committed`` for it (rayguard sealed it: its
  manifest was removed since);
* an older checkpoint of the run is sealed (rayguard guarded the run before this one was
  reported, so it was sealed too);
* a checkpoint key is set (:mod:`rayguard.checkpoint.auth`: only signed checkpoints load);
* ``CheckpointConfig(accept_unsealed=False)``.

:func:`refusal` is the pure decision; :func:`committed_names` reads the facts it needs from
the run's log (streamed, bounded memory).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def refusal(name: str, *, committed: Iterable[str], older_sealed: bool, key_set: bool,
            accept_unsealed: bool) -> str:
    """Why the unsealed checkpoint named ``name`` (its directory name) is rejected; ``""``
    when it may be offered unverified. ``committed``: the directory names the run's log
    records as committed; ``older_sealed``: an older checkpoint of the run has a manifest."""
    if key_set:
        return ("no rayguard manifest, and a checkpoint key is set: only checkpoints signed "
                "with the key are loaded")
    if name in set(committed):
        return ("no rayguard manifest, but the run's log records that rayguard sealed it "
                "(checkpoint_committed): its manifest was removed after the save")
    if older_sealed:
        return ("no rayguard manifest, but an older checkpoint of this run is sealed, so this "
                "one was reported under rayguard and sealed too: its manifest was removed")
    if not accept_unsealed:
        return ("no rayguard manifest, and CheckpointConfig(accept_unsealed=False) refuses "
                "checkpoints that were never sealed")
    return ""


def committed_names(run_dir: str, filesystem: Any = None) -> set[str]:
    """The directory names of the checkpoints the run's log records as committed (empty
    when there is no log or it cannot be read)."""
    from rayguard.events.read import iter_events, run_source

    names: set[str] = set()
    try:
        for event in iter_events(run_source(run_dir, filesystem)):
            path = event.get("path")
            if event.get("kind") == "checkpoint_committed" and isinstance(path, str):
                names.add(os.path.basename(path.rstrip("/")))
    except (OSError, ValueError):
        pass
    return names


__all__ = ["committed_names", "refusal"]
