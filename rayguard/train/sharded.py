"""The DCP adapter behind ``report(sharded=...)`` and ``load_state(sharded=...)``.

``sharded`` maps names to what DCP should save and load in place:

* an ``nn.Module`` (FSDP2 ``fully_shard``, DTensor parameters, or plain): its state dict
  through ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` /
  ``set_model_state_dict`` (sharded, never gathered);
* a ``torch.optim.Optimizer``: through ``get_optimizer_state_dict`` /
  ``set_optimizer_state_dict`` against the one module of the same mapping;
* anything else DCP takes as it is: a dict of (D)Tensors (loaded in place) or an object with
  ``state_dict``/``load_state_dict`` (DCP's ``Stateful``).

Every rank calls these functions together (DCP's save and load are collectives on the
default process group). Integrity, the manifest and the commit are rayguard's
(:mod:`rayguard.checkpoint.sharded`, :mod:`rayguard.train.checkpointing`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayguard.checkpoint.sharded import DCP_DIR
from rayguard.exceptions import CheckpointCorruptError, CheckpointError

if TYPE_CHECKING:
    from rayguard.checkpoint.dcp_safe import SafeReader
    from rayguard.checkpoint.manifest import Manifest, ShardRecord
    from rayguard.checkpoint.verify import Problem
    from rayguard.train.collective import Collective
    from rayguard.train.store import CheckpointStore


def check_sharded_arg(sharded: Any) -> str | None:
    """What is wrong with a ``sharded=`` argument (None: nothing)."""
    import torch

    if not isinstance(sharded, dict) or not sharded:
        return (f"sharded= must be a non-empty dict such as {{'model': model, 'optim': opt}}, "
                f"got {type(sharded).__name__}")
    bad = [k for k in sharded if not isinstance(k, str)]
    if bad:
        return f"sharded= keys must be strings, got {bad[:3]}"
    modules = [k for k, v in sharded.items() if isinstance(v, torch.nn.Module)]
    optims = [k for k, v in sharded.items() if isinstance(v, torch.optim.Optimizer)]
    if optims and len(modules) != 1:
        return (f"sharded= holds optimizer(s) {optims} and modules {modules}: an optimizer's "
                "state is keyed by the parameter names of exactly one module. Fix: pass one "
                "module (wrap several in one nn.Module) beside the optimizer(s)")
    return None


def _model_of(sharded: dict[str, Any]) -> Any:
    import torch

    return next((v for v in sharded.values() if isinstance(v, torch.nn.Module)), None)


def state_dict_for(sharded: dict[str, Any]) -> dict[str, Any]:
    """The DCP state dict of ``sharded`` (sharded tensors stay sharded)."""
    import torch
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    model = _model_of(sharded)
    out: dict[str, Any] = {}
    for key, value in sharded.items():
        if isinstance(value, torch.nn.Module):
            out[key] = get_model_state_dict(value)
        elif isinstance(value, torch.optim.Optimizer):
            out[key] = get_optimizer_state_dict(model, value)
        else:
            out[key] = value
    return out


def describe_meshes(state_dict: Any) -> list[dict[str, Any]]:
    """The device meshes of the DTensors in ``state_dict`` (for the manifest)."""
    from torch.distributed.tensor import DTensor

    seen: list[dict[str, Any]] = []
    stack = [state_dict]
    while stack:
        obj = stack.pop()
        if isinstance(obj, DTensor):
            mesh = obj.device_mesh
            desc = {"device_type": mesh.device_type, "shape": list(mesh.shape),
                    "dim_names": list(mesh.mesh_dim_names or ()),
                    "placements": [str(p) for p in obj.placements]}
            if desc not in seen:
                seen.append(desc)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return seen


def save(checkpoint_dir: str, sharded: dict[str, Any],
         digests: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Write ``sharded`` with DCP into ``checkpoint_dir/dcp`` (collective); returns the
    meshes it found. Every data file is hashed as it is written: ``digests``, when given,
    receives name -> (size, digest, chunk digests). Not yet durable: :func:`write_rank`
    fsyncs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from rayguard.checkpoint.dcp_writer import HashingWriter
    from rayguard.checkpoint.fsio import check_real_dir

    state_dict = state_dict_for(sharded)
    path = os.path.join(checkpoint_dir, DCP_DIR)
    os.makedirs(path, exist_ok=True)
    check_real_dir(checkpoint_dir, "staging directory")
    check_real_dir(path, "DCP directory")  # DCP would write through a planted link
    try:
        # the files are fsynced by record_dcp_files, together, after DCP wrote them all
        writer = HashingWriter(path, sync_files=False)
        dcp.save(state_dict, storage_writer=writer)
    except CheckpointException as exc:  # a BaseException: make it one the protocol handles
        raise CheckpointError(f"torch.distributed.checkpoint could not save {sorted(sharded)}: "
                              f"{exc}") from exc
    if digests is not None:
        digests.update(writer.digests)
    return describe_meshes(state_dict)


def load(checkpoint_dir: str, sharded: dict[str, Any], manifest: Manifest | None = None) -> None:
    """Load ``checkpoint_dir/dcp`` into the objects of ``sharded`` in place (collective),
    resharded by DCP to this world size and mesh. The files must have been verified.

    Nothing from disk runs as code (:mod:`rayguard.checkpoint.dcp_safe`): ``.metadata`` is
    read only if its bytes match ``manifest`` (the directory's own manifest when None; with
    none there, the caller's own unlisted directory) and unpickled restricted to DCP's
    metadata classes; non-tensor values load ``weights_only=True``. A refusal raises
    CheckpointCorruptError."""
    from rayguard.checkpoint.dcp_safe import SafeReader
    from rayguard.checkpoint.manifest import MANIFEST_NAME, read_manifest

    if manifest is None and os.path.exists(os.path.join(checkpoint_dir, MANIFEST_NAME)):
        manifest = read_manifest(Path(checkpoint_dir))
    _load_with(SafeReader(checkpoint_dir, manifest), checkpoint_dir, sharded)


def _load_with(reader: SafeReader, checkpoint_dir: str, sharded: dict[str, Any]) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from rayguard.checkpoint.dcp_safe import SafePlanner

    state_dict = state_dict_for(sharded)
    try:
        dcp.load(state_dict, checkpoint_id=os.path.join(checkpoint_dir, DCP_DIR),
                 storage_reader=reader, planner=SafePlanner())
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        version_error = getattr(reader, "version_error", None)
        if version_error is not None:  # written by another torch
            raise version_error from None
        if reader.refusal is not None:
            raise CheckpointCorruptError(str(reader.refusal)) from None
        raise CheckpointError(
            f"{checkpoint_dir}: torch.distributed.checkpoint could not load the sharded part "
            f"into {sorted(sharded)} ({type(exc).__name__}: {exc}). Fix: pass the same keys, "
            "model and optimizer types as when it was saved.") from exc
    model = _model_of(sharded)
    for key, value in sharded.items():
        if isinstance(value, torch.nn.Module):
            set_model_state_dict(value, state_dict[key])
        elif isinstance(value, torch.optim.Optimizer):
            set_optimizer_state_dict(model, value, state_dict[key])


@dataclass(frozen=True)
class ReadRejection:
    """:func:`restore`'s answer when a rank found a bad chunk while DCP read: the checkpoint
    (rejected and recorded), and whether any rank had copied part of it into the state."""

    path: str
    touched: bool


def load_verified(collective: Collective, checkpoint_dir: str, sharded: dict[str, Any],
                  manifest: Manifest, tag: str) -> tuple[tuple[Problem, ...], bool]:
    """Every rank: DCP loads ``checkpoint_dir`` into ``sharded`` while each rank verifies the
    bytes it reads (:class:`~rayguard.checkpoint.dcp_verified_read.VerifyingReader`: a chunk
    is compared with the manifest before anything in it is used). Returns the problems every
    rank agrees on (empty: loaded, and every byte used on every rank verified) and whether
    any rank copied part of the checkpoint into its state.

    How the ranks agree: a rank that finds a bad chunk fails its part of DCP's read, so DCP
    fails the load on every rank (its read step is a collective); each rank then gathers
    (problems, other error) over ``collective``, so all see the same problems and reject the
    same checkpoint, or raise the same CheckpointError for a failure that is not corruption.
    A rejected checkpoint may have been partly loaded into ``sharded`` (verified bytes only):
    the caller loads an older one over it, or fails the attempt (:func:`restore`)."""
    from rayguard.checkpoint.dcp_layout import DCP_METADATA
    from rayguard.checkpoint.dcp_verified_read import VerifyingReader
    from rayguard.checkpoint.verify import Problem

    reader = VerifyingReader(checkpoint_dir, manifest)
    mine: tuple[Problem, ...] = ()
    error = None
    try:
        _load_with(reader, checkpoint_dir, sharded)
    except CheckpointCorruptError as exc:
        mine = (reader.problem or Problem(f"{DCP_DIR}/{DCP_METADATA}", str(exc)),)
    except CheckpointError as exc:
        error = f"rank {collective.rank}: {exc}"
    outcomes = collective.gather(f"{tag}:loaded", (mine, error, reader.items_used > 0))
    problems = tuple(dict.fromkeys(p for found, _, _ in outcomes for p in found))
    errors = [e for _, e, _ in outcomes if e is not None]
    if not problems and errors:
        raise CheckpointError(error or errors[0])
    return problems, any(used for _, _, used in outcomes)


def write_rank(staging: str, rank: int, sharded: dict[str, Any],
               payload: Any) -> tuple[ShardRecord, list[dict[str, Any]]]:
    """One rank's part of a sharded save into ``staging`` (every rank together): DCP
    (collective), this rank's plain shard, and the record of both with every DCP file this
    rank wrote hashed (as DCP wrote it). Returns the record and the meshes found."""
    from rayguard import checkpoint as ck
    from rayguard.checkpoint.sharded import record_dcp_files
    from rayguard.checkpoint.writer import write_shard

    digests: dict[str, Any] = {}
    meshes = save(staging, sharded, digests)
    plain = write_shard(staging, rank, payload)
    records = record_dcp_files(staging, rank, digests=digests)
    return ck.ShardRecord(rank, plain.files + records), meshes


# -- the worker side of load_state(sharded=...) -------------------------------------------
# (the save side is protocol.save with write_rank as its DCP writer)

def choose(collective: Collective, store: CheckpointStore, tag: str) -> tuple[str, str] | None:
    """Every rank: the newest checkpoint that verifies, as (its path, the local directory DCP
    reads), so that DCP, which may read any file when it reshards, reads only verified files.
    Rank 0 records rejections.

    Each rank verifies its share through the store: on a local or shared run directory it
    hashes its share of each candidate
    (:func:`~rayguard.checkpoint.sharded.plan_verification`); on a remote filesystem it
    downloads the candidate and verifies its own whole copy (the copy DCP will read); the
    caller removes that copy."""
    import shutil

    from rayguard.train import protocol

    candidates = None
    if collective.rank == 0:
        store.cleanup()
        candidates = store.candidates(protocol.rejected(collective, store))
    candidates = collective.gather(f"{tag}:candidates", candidates)[0]
    for i, cand in enumerate(candidates):
        problems_here, copy = store.verify_share(cand, collective.rank, collective.world_size)
        shares = collective.gather(f"{tag}:verify{i}", problems_here)
        problems = tuple(dict.fromkeys(p for share in shares for p in share))
        if not problems:
            return str(cand), copy
        if copy and copy != cand:
            shutil.rmtree(copy, ignore_errors=True)
        _reject(collective, store, cand, problems)
    return None


def _reject(collective: Collective, store: CheckpointStore, path: str,
            problems: tuple[Problem, ...]) -> None:
    """Rank 0 logs and records the rejection of ``path`` (never resumed from again)."""
    from rayguard.checkpoint.fallback import Rejection
    from rayguard.train import protocol

    if collective.rank == 0:
        rejection = Rejection(path, problems)
        protocol.logger.warning("rayguard: skipping checkpoint %s; trying an older one",
                                rejection.describe())
        protocol.reject(collective, store, path, rejection.describe())


def restore(collective: Collective, store: CheckpointStore, chosen: tuple[str, str],
            sharded: Any, *, previous_rank: int | None, tag: str = "load") -> Any:
    """DCP loads the sharded part of the checkpoint :func:`choose` verified into ``sharded``
    in place, resharded to this world size; then the plain part, as for ``state=``.

    On a store whose ``dcp_data_verified_on_read`` is true (:class:`LocalStore`:
    :func:`choose` hashed everything but the DCP data files), the data files are verified as
    DCP reads them (:func:`load_verified`); when a rank finds a bad chunk, rank 0 records
    the rejection and this returns a :class:`ReadRejection` on every rank: choose again."""
    import shutil

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.sharded import check_loadable
    from rayguard.exceptions import ShardedStateError
    from rayguard.train.protocol import read_state

    path, local = chosen
    try:
        manifest = ck.read_manifest(Path(local))
        try:
            info = check_loadable(manifest, path)
        except CheckpointError as exc:  # a plain checkpoint: the same on every attempt
            raise ShardedStateError(f"rank {collective.rank}: {exc}") from None
        if getattr(store, "dcp_data_verified_on_read", False):
            problems, touched = load_verified(collective, local, sharded, manifest, tag)
            if problems:
                _reject(collective, store, path, problems)
                return ReadRejection(path, touched)
        else:
            load(local, sharded, manifest)
        collective.progress()
        saved = int(info["world_size"])
        note = "" if saved == collective.world_size else (
            f"; sharded state of {saved} ranks resharded to {collective.world_size} by DCP")
        return read_state(collective, path, local, previous_rank=previous_rank,
                          plain_optional=True, note=note, saved_world_size=saved)
    finally:
        if local != path:
            shutil.rmtree(local, ignore_errors=True)
