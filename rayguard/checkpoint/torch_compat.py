"""Checkpoints written by another torch: reported as such, never as corrupt.

torch.distributed.checkpoint (DCP) pickles its ``.metadata`` with its own classes, and a
torch may not parse what another wrote (saved by 2.15, read by 2.14: ``too many values to
unpack``). When the file's bytes match the manifest's digest, a parse failure under a torch
other than the one the manifest records means "read me with that torch", not "corrupt":
:func:`version_mismatch` decides (pure), and :class:`CheckpointVersionError` carries the
answer. Such a checkpoint is never recorded as rejected, so a run on the torch that wrote it
still resumes from it. Under the same torch release a parse failure is corruption, as ever.

Pure: no torch import (the running version comes from the package metadata, the form the
manifest records: :func:`~rayguard.checkpoint.manifest.library_versions`).
"""

from __future__ import annotations

from importlib import metadata as importlib_metadata

from rayguard.checkpoint.manifest import release_of
from rayguard.exceptions import CheckpointError


class CheckpointVersionError(CheckpointError):
    """A checkpoint's DCP part was written by another torch and this one cannot read it. Not
    corruption: the checkpoint is kept and stays offered to a run on the torch that wrote it.
    The message names both versions and the fix."""


def running_torch() -> str | None:
    """This process's torch release as the manifest would record it (local label stripped),
    or None when torch is not installed."""
    try:
        return release_of(importlib_metadata.version("torch"))
    except importlib_metadata.PackageNotFoundError:
        return None


def version_mismatch(manifest_torch: str | None, running: str | None, error: str) -> str | None:
    """Why a checkpoint failed to parse when another torch wrote it, or None when it is not
    that (same release, or either version unknown): then the failure is corruption.

    ``manifest_torch``: the version the manifest records (any form; ``None`` or ``"not
    installed"`` when it has none); ``running``: this torch's; ``error``: the parse error.
    Versions compare without their local label (``2.15.0+cu132`` is ``2.15.0``)."""
    saved = _known(manifest_torch)
    here = _known(running)
    if saved is None or here is None or saved == here:
        return None
    return (f"written by torch {saved}, and this torch ({here}) cannot read its DCP metadata "
            f"({error[:200]}). The checkpoint is not corrupt and is kept (not rejected). "
            f"Fix: resume with torch=={saved}, the version that wrote it; or re-save it: load "
            f"it under torch {saved}, export the state (e.g. torch.distributed.checkpoint."
            f"format_utils.dcp_to_torch_save) and start from that under torch {here}")


def _known(version: str | None) -> str | None:
    if not version or version == "not installed":
        return None
    return release_of(version) or None


__all__ = ["CheckpointVersionError", "running_torch", "version_mismatch"]
