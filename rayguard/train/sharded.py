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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayguard.checkpoint.sharded import DCP_DIR
from rayguard.exceptions import CheckpointError

if TYPE_CHECKING:
    from rayguard.checkpoint.manifest import ShardRecord
    from rayguard.train.session import WorkerSession


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


def save(checkpoint_dir: str, sharded: dict[str, Any]) -> list[dict[str, Any]]:
    """Write ``sharded`` with DCP into ``checkpoint_dir/dcp`` (collective); returns the
    meshes it found. Not yet durable: :func:`write_rank` fsyncs while it hashes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    state_dict = state_dict_for(sharded)
    path = os.path.join(checkpoint_dir, DCP_DIR)
    try:
        # the files are fsynced by record_dcp_files, overlapped with their hashing
        dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(path, sync_files=False))
    except CheckpointException as exc:  # a BaseException: make it one the protocol handles
        raise CheckpointError(f"torch.distributed.checkpoint could not save {sorted(sharded)}: "
                              f"{exc}") from exc
    return describe_meshes(state_dict)


def load(checkpoint_dir: str, sharded: dict[str, Any]) -> None:
    """Load ``checkpoint_dir/dcp`` into the objects of ``sharded`` in place (collective),
    resharded by DCP to this world size and mesh. The files must have been verified."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state_dict = state_dict_for(sharded)
    try:
        dcp.load(state_dict, checkpoint_id=os.path.join(checkpoint_dir, DCP_DIR))
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
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


def write_rank(staging: str, rank: int, sharded: dict[str, Any],
               payload: Any) -> tuple[ShardRecord, list[dict[str, Any]]]:
    """One rank's part of a sharded save into ``staging`` (every rank together): DCP
    (collective), this rank's plain shard, and the record of both with every DCP file this
    rank wrote hashed. Returns the record and the meshes found."""
    from rayguard import checkpoint as ck
    from rayguard.checkpoint.sharded import record_dcp_files

    meshes = save(staging, sharded)
    plain = ck.write_shard(staging, rank, payload)
    return ck.ShardRecord(rank, plain.files + record_dcp_files(staging, rank)), meshes


def commit_sharded(final: str, records: list[ShardRecord], *, world_size: int, step: int,
                   meshes: list[dict[str, Any]], keys: list[str],
                   metadata: dict[str, Any] | None = None) -> Path:
    """The committer's step (rank 0): check that the records cover DCP's directory exactly,
    describe the sharded part in the manifest, write it last and publish atomically."""
    from rayguard import checkpoint as ck
    from rayguard.checkpoint import sharded as sh

    staging = ck.staging_dir_for(final)
    dcp_records = [f for r in records for f in r.files if f.path.startswith(f"{DCP_DIR}/")]
    try:
        sh.check_complete(dcp_records, os.listdir(staging / DCP_DIR), world_size)
    except BaseException:
        ck.discard_staging(staging)
        raise
    meta = dict(metadata or {})
    meta[sh.SHARDED_KEY] = sh.describe_sharded(world_size, meshes, keys)
    return ck.commit(staging, final, records, world_size=world_size, step=step, metadata=meta)


# -- the session side of report(sharded=...) / load_state(sharded=...) ---------------------

def write_for_session(session: WorkerSession, payload: Any, final: str, sharded: Any) -> Any:
    """``report(sharded=...)``'s write step: DCP into staging (collective), then this rank's
    plain shard; returns the record of both, the meshes and the keys.

    With a remote run filesystem each rank stages in a local temporary directory (DCP writes
    this rank's files there, rank 0's also ``.metadata``), checks that it holds nothing
    unhashed, and uploads; rank 0 then writes the manifest last (``commit_remote``)."""
    import shutil
    import tempfile

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.remote import is_local, upload_shard

    rank = session.ctx.rank
    if is_local(session.fs):
        record, meshes = write_rank(str(ck.staging_dir_for(final)), rank, sharded, payload)
    else:
        local = tempfile.mkdtemp(prefix="rayguard-stage-")
        try:
            record, meshes = write_rank(local, rank, sharded, payload)
            dcp_records = [f for f in record.files if f.path.startswith(f"{DCP_DIR}/")]
            extra = sorted(set(os.listdir(os.path.join(local, DCP_DIR)))
                           - {f.path.removeprefix(f"{DCP_DIR}/") for f in dcp_records})
            if extra:
                raise CheckpointError(f"rank {rank}: DCP wrote files no rank hashed {extra[:5]}")
            upload_shard(local, final, record, session.fs)
        finally:
            shutil.rmtree(local, ignore_errors=True)
    session.watchdog.heartbeat()
    return record, meshes, sorted(sharded)


def choose(session: WorkerSession) -> tuple[str, str] | None:
    """Every rank: the newest checkpoint that verifies, as (its path, the local directory DCP
    reads), so that DCP, which may read any file when it reshards, reads only verified files.
    Rank 0 records rejections.

    On a local or shared run directory each rank hashes its share of each candidate
    (:func:`~rayguard.checkpoint.sharded.plan_verification`). On a remote filesystem each
    rank downloads the candidate and verifies its own whole copy (the copy DCP will read);
    the caller removes that copy."""
    import shutil

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.fallback import Rejection, list_candidates, order_candidates
    from rayguard.checkpoint.remote import download, is_local, list_remote
    from rayguard.checkpoint.sharded import verify_share
    from rayguard.exceptions import CheckpointCorruptError
    from rayguard.train.checkpointing import _reject, _rejected, logger

    ctx, local_fs = session.ctx, is_local(session.fs)
    tag = f"load{session.load_count}"
    candidates = None
    if ctx.rank == 0:
        skip = {os.path.realpath(p) if local_fs else p for p in _rejected(session)}
        if local_fs:
            ck.cleanup_staging(ctx.run_dir)
            candidates = [str(c.path) for c in order_candidates(list_candidates(ctx.run_dir))
                          if os.path.realpath(c.path) not in skip]
        else:
            candidates = [c.path for c in list_remote(ctx.run_dir, session.fs) if c.path not in skip]
    candidates = session.gather(f"{tag}:candidates", candidates)[0]
    for i, cand in enumerate(candidates):
        copy = cand
        if local_fs:
            problems_here = verify_share(cand, ctx.rank, ctx.world_size).problems
        else:
            try:
                copy = download(cand, session.fs)
                problems_here = ck.verify(copy).problems
            except CheckpointCorruptError as exc:
                copy, problems_here = "", (ck.Problem("rayguard_manifest.json", str(exc)),)
        shares = session.gather(f"{tag}:verify{i}", problems_here)
        problems = tuple(dict.fromkeys(p for share in shares for p in share))
        if not problems:
            return str(cand), copy
        if copy and copy != cand:
            shutil.rmtree(copy, ignore_errors=True)
        if ctx.rank == 0:
            rejection = Rejection(cand, problems)
            logger.warning("rayguard: skipping checkpoint %s; trying an older one",
                           rejection.describe())
            _reject(session, cand, rejection.describe(), persist=local_fs)
    return None


def restore(session: WorkerSession, chosen: tuple[str, str], sharded: Any) -> Any:
    """DCP loads the sharded part of the checkpoint :func:`choose` verified into ``sharded``
    in place, resharded to this world size; then the plain part, as for ``state=``."""
    import shutil

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.sharded import check_loadable
    from rayguard.train.checkpointing import ShardedStateError, _restore

    path, local = chosen
    try:
        manifest = ck.read_manifest(Path(local))
        try:
            info = check_loadable(manifest, path)
        except CheckpointError as exc:  # a plain checkpoint: the same on every attempt
            raise ShardedStateError(f"rank {session.ctx.rank}: {exc}") from None
        load(local, sharded)
        session.watchdog.heartbeat()
        saved = int(info["world_size"])
        note = "" if saved == session.ctx.world_size else (
            f"; sharded state of {saved} ranks resharded to {session.ctx.world_size} by DCP")
        return _restore(session, path, local, plain_optional=True, note=note,
                        saved_world_size=saved)
    finally:
        if local != path:
            shutil.rmtree(local, ignore_errors=True)
