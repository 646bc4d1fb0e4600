"""Coordinated checkpoints inside a worker: ``report(state=...)`` and ``load_state()``.

Commit protocol (every rank runs it; ranks agree through the run's coordinator):

1. every rank says whether it has a state (a gather); if none has, nothing is saved;
2. each rank writes its shard into ``<run>/.staging-<name>/``, hashing while writing; ranks
   without a state write only their RNG state (a few KiB) so the run resumes exactly;
3. the shard records (files, sizes, digests, or the error) are gathered; rank 0 writes the
   manifest last and atomically, then renames staging -> ``<run>/<name>/`` (the commit);
4. rank 0 hands the committed directory to ``ray.train.report`` (no upload: it is already
   in the run directory), so ``CheckpointConfig(num_to_keep=...)`` and ``Result`` work.

With ``sharded=`` (every rank passes it), step 2 first runs ``torch.distributed.checkpoint``
into ``.staging-<name>/dcp/`` (a collective), then each rank hashes the DCP files it wrote
and adds them to its shard record; rank 0 also checks that no DCP file escaped the records.
``load_state(sharded=...)`` lets DCP read only a checkpoint rank 0 verified in full.

A crash at any moment leaves either a committed, verified checkpoint or a staging directory
that no reader accepts and the next start removes.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rayguard.exceptions import CheckpointError
from rayguard.train import memory_tier

if TYPE_CHECKING:
    from rayguard.train.session import WorkerSession

logger = logging.getLogger("rayguard")

_META = "__rayguard__"


def checkpoint_name(step: int, attempt: int) -> str:
    return f"checkpoint_{step:09d}_a{attempt}"


def _canonical_keys(state: Any) -> Any:
    """Strip DDP/compile wrapper prefixes (``module.``) from the state dicts in ``state``, so a
    state saved from a wrapped model loads into an unwrapped one; for a wrapped target use
    ``rayguard.checkpoint.normalize_state_dict_keys(sd, like=model.state_dict())``."""
    from rayguard.checkpoint import normalize_state_dict_keys
    from rayguard.checkpoint.keys import WRAPPER_PREFIXES

    if not isinstance(state, dict):
        return state
    out = {}
    for key, value in state.items():
        if (isinstance(value, dict) and value and all(isinstance(k, str) for k in value)
                and any(k.startswith(WRAPPER_PREFIXES) for k in value)):
            value = normalize_state_dict_keys(value)
        out[key] = value
    return out


def _write_local(session: WorkerSession, payload: Any, final: str) -> Any:
    """Local/shared filesystem: write into the staging sibling of ``final``."""
    from rayguard import checkpoint as ck

    return ck.write_shard(str(ck.staging_dir_for(final)), session.ctx.rank, payload)


def _write_remote(session: WorkerSession, payload: Any, final: str) -> Any:
    """Remote filesystem: write and hash locally, then upload into ``final``."""
    from rayguard import checkpoint as ck
    from rayguard.checkpoint.remote import upload_shard

    local = tempfile.mkdtemp(prefix="rayguard-stage-")
    try:
        record = ck.write_shard(local, session.ctx.rank, payload)
        upload_shard(local, final, record, session.fs)
        return record
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _commit(session: WorkerSession, final: str, records: list[Any], step: int,
            described: tuple[list[dict[str, Any]], list[str]] | None = None) -> Any:
    """Rank 0 publishes; ``described``: (meshes, keys) of a sharded save."""
    from ray.train import Checkpoint

    from rayguard import checkpoint as ck
    from rayguard.checkpoint.remote import commit_remote, is_local

    ctx = session.ctx
    meta: dict[str, Any] = {"attempt": ctx.attempt}
    if described is not None:
        from rayguard.train.sharded import commit_sharded

        if is_local(session.fs):
            published = commit_sharded(final, records, world_size=ctx.world_size, step=step,
                                       meshes=described[0], keys=described[1], metadata=meta)
            return Checkpoint.from_directory(str(published))
        from rayguard.checkpoint import sharded as sh

        dcp_records = [f for r in records for f in r.files if f.path.startswith(f"{sh.DCP_DIR}/")]
        uploaded = [f.path.removeprefix(f"{sh.DCP_DIR}/") for f in dcp_records]
        sh.check_complete(dcp_records, uploaded, ctx.world_size)  # .metadata there, owners right
        meta[sh.SHARDED_KEY] = sh.describe_sharded(ctx.world_size, described[0], described[1])
    if is_local(session.fs):
        path = str(ck.commit(ck.staging_dir_for(final), final, records,
                             world_size=ctx.world_size, step=step, metadata=meta))
        return Checkpoint.from_directory(path)
    commit_remote(final, records, world_size=ctx.world_size, step=step, metadata=meta,
                  fs=session.fs)
    return Checkpoint(path=final, filesystem=session.fs)


def _discard(session: WorkerSession, final: str) -> None:
    from rayguard import checkpoint as ck
    from rayguard.checkpoint.remote import is_local

    if is_local(session.fs):
        shutil.rmtree(ck.staging_dir_for(final), ignore_errors=True)
    else:  # no manifest was written, so readers never saw it; tidy up anyway
        try:
            session.fs.delete_dir(final)
        except OSError:
            pass


class ShardedStateError(CheckpointError):
    """``state=``/``sharded=`` were misused (a DTensor in ``state=``, ``sharded=`` on some
    ranks only): the same on every attempt, so the run ends without a retry."""

    fatal = True


class _Intent(NamedTuple):
    has_state: bool
    step: int
    sharded: bool
    problem: str | None
    facts: Any = None
    """The model preflight's facts, at the first report only."""


def _problem(session: WorkerSession, state: Any, sharded: Any) -> str | None:
    from rayguard.checkpoint.sharded import dtensor_error_message, find_distributed_tensors

    paths = find_distributed_tensors(state)
    if paths:
        return dtensor_error_message(paths, session.ctx.rank)
    if sharded is not None:
        from rayguard.train.sharded import check_sharded_arg

        problem = check_sharded_arg(sharded)
        return None if problem is None else f"rank {session.ctx.rank}: {problem}"
    return None


def _agree(intents: list[_Intent]) -> None:
    """Raise the same ShardedStateError on every rank when any rank misused the arguments."""
    problems = [i.problem for i in intents if i.problem]
    if problems:
        raise ShardedStateError("; ".join(problems))
    flags = [i.sharded for i in intents]
    if any(flags) and not all(flags):
        raise ShardedStateError(
            f"ranks {[r for r, f in enumerate(flags) if not f]} did not pass sharded= while ranks "
            f"{[r for r, f in enumerate(flags) if f]} did: the sharded save is a collective. Fix: "
            "call report(..., sharded=...) with the same keys on every rank.")


def maybe_checkpoint(session: WorkerSession, state: Any, step: int, sharded: Any = None) -> Any:
    """Run the commit protocol if any rank passed a state; returns the Ray ``Checkpoint``
    for rank 0 (``None`` on other ranks or when nothing was saved)."""
    from rayguard import checkpoint as ck
    from rayguard.checkpoint.remote import is_local

    ctx = session.ctx
    started = time.perf_counter()
    tag = f"report{session.report_count}"
    first = session.report_count == 1
    facts = None
    if first:
        from rayguard.train.model_preflight import collect

        facts = collect(state, sharded)
    intent = _Intent(state is not None, step, sharded is not None,
                     _problem(session, state, sharded), facts)
    intents = [_Intent(*i) for i in session.gather(f"{tag}:intent", tuple(intent))]
    _agree(intents)
    if first and ctx.rank == 0:
        from rayguard.train.model_preflight import log_findings

        log_findings([i.facts for i in intents])
    if not any(i.has_state or i.sharded for i in intents):
        return None
    step = intents[0].step
    name = checkpoint_name(step, ctx.attempt)
    final = f"{ctx.run_dir.rstrip('/')}/{name}"
    payload = {_META: {"rng": ck.capture_rng_state(), "has_state": state is not None},
               "state": _canonical_keys(state)}
    described: Any = None
    try:
        if intents[0].sharded:
            from rayguard.train.sharded import write_for_session

            record, meshes, keys = write_for_session(session, payload, final, sharded)
            described = (meshes, keys)
        else:
            write = _write_local if is_local(session.fs) else _write_remote
            record = write(session, payload, final)
    except Exception as exc:
        record = CheckpointError(f"rank {ctx.rank} on node {ctx.node_id}: {exc}")
    if described is None:  # [memory tier] hook 1a: keep this rank's written shard in memory
        memory_tier.offer(session, final, step, payload, record)
    records = session.gather(f"{tag}:records", record)
    failures = [r for r in records if isinstance(r, BaseException)]
    if failures:
        if ctx.rank == 0:
            _discard(session, final)
        raise CheckpointError(
            f"checkpoint of step {step} was not saved (earlier checkpoints are intact): "
            + "; ".join(str(f) for f in failures))
    if ctx.rank != 0:
        return None
    checkpoint = _commit(session, final, records, step, described)
    memory_tier.committed(session, final, step)  # [memory tier] hook 1b: now servable
    total = sum(f.size_bytes for r in records for f in r.files)
    session.record("checkpoint_committed", f"checkpoint {name} committed ({total} bytes, "
                   f"{len(records)} shard(s))", step=step, path=final, bytes=total,
                   seconds=round(time.perf_counter() - started, 6))
    return checkpoint


def _reject(session: WorkerSession, path: str, why: str, *, persist: bool) -> None:
    from rayguard.checkpoint import rejections

    session.record("checkpoint_rejected", f"skipped {why}", path=path)
    if persist:
        rejections.reject(path, why)
    if session.coordinator is not None:
        session.coordinator.reject_checkpoint.remote(path, why)


def _rejected(session: WorkerSession) -> dict[str, str]:
    import ray

    from rayguard.checkpoint import rejections
    from rayguard.checkpoint.remote import is_local

    out = rejections.rejected(session.ctx.run_dir) if is_local(session.fs) else {}
    if session.coordinator is not None:
        out.update(ray.get(session.coordinator.rejected_checkpoints.remote()))
    return out


def _choose_local(session: WorkerSession) -> str | None:
    from rayguard import checkpoint as ck

    ck.cleanup_staging(session.ctx.run_dir)
    skip = set(_rejected(session))
    held = memory_tier.choose(session, skip)  # [memory tier] hook 2a: ranks verify in memory
    if held is not None:
        return held
    found = ck.scan(session.ctx.run_dir, skip=skip)
    for rejection in found.rejected:
        _reject(session, rejection.path, rejection.describe(), persist=True)
    return None if found.chosen is None else str(found.chosen)


def _choose_remote(session: WorkerSession) -> str | None:
    from rayguard import checkpoint as ck
    from rayguard.checkpoint.remote import download, list_remote
    from rayguard.exceptions import CheckpointCorruptError

    rejected = _rejected(session)
    for cand in list_remote(session.ctx.run_dir, session.fs):
        if cand.path in rejected:
            continue
        try:
            local = download(cand.path, session.fs)
        except CheckpointCorruptError as exc:
            _reject(session, cand.path, str(exc), persist=False)
            continue
        try:
            report = ck.verify(local)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        if report.ok:
            return cand.path
        problems = "; ".join(f"{p.file}: {p.what}" for p in report.problems)
        _reject(session, cand.path, f"{cand.path}: {problems}", persist=False)
    return None


def _choose_checkpoint(session: WorkerSession) -> str | None:
    """Rank 0: newest checkpoint that verifies; rejections are logged and remembered."""
    from rayguard.checkpoint.remote import is_local

    return _choose_local(session) if is_local(session.fs) else _choose_remote(session)


def load_state(session: WorkerSession, sharded: Any = None) -> Any:
    from rayguard.checkpoint.remote import download, is_local

    ctx = session.ctx
    session.injector.on_load()
    session.load_count += 1
    problem = None
    if sharded is not None:
        from rayguard.train.sharded import check_sharded_arg

        problem = check_sharded_arg(sharded)
    chosen = (_choose_checkpoint(session) if ctx.rank == 0 and problem is None and sharded is None
              else None)
    answers = session.gather(f"load{session.load_count}", (chosen, sharded is not None, problem))
    _agree([_Intent(False, 0, has, p) for _, has, p in answers])
    if sharded is not None:
        from rayguard.train.sharded import choose, restore

        verified = choose(session)
        session.watchdog.heartbeat()
        return None if verified is None else restore(session, verified, sharded)
    chosen = answers[0][0]
    session.watchdog.heartbeat()
    if chosen is None:
        return None
    if is_local(session.fs):
        memory: dict[int, Any] | None = None
        tier: dict[str, Any] = {"tier": "disk"}
        if memory_tier.enabled(session):  # [memory tier] hook 2b: fetch and verify from memory
            found, memory, tier = memory_tier.prepare(session, chosen, _choose_checkpoint)
            if found is None:
                return None
            chosen = found
        return _restore(session, chosen, chosen, memory=memory, **tier)
    local = download(chosen, session.fs)
    try:
        return _restore(session, chosen, local, tier="disk")
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _warn_unloaded_sharded(manifest: Any, chosen: str) -> None:
    from rayguard.checkpoint.sharded import sharded_info

    info = sharded_info(manifest)
    if info is not None:
        logger.warning("rayguard: %s also holds sharded state %s that load_state() without "
                       "sharded= does not load. Fix: load_state(sharded={...}) with the objects "
                       "passed to report(sharded=...)", chosen, info.get("keys"))


def _restore(session: WorkerSession, chosen: str, local: str, *, plain_optional: bool = False,
             note: str = "", memory: dict[int, Any] | None = None, **extra: Any) -> Any:
    """Read this rank's state from ``local`` (a verified checkpoint, maybe a download).

    ``plain_optional``: the sharded part was loaded; a checkpoint without plain state
    returns ``{}`` instead of raising. ``note`` and ``extra`` go into the ``restored`` event.
    ``memory``: payloads by saved rank already read and verified from the memory tier."""
    from rayguard import checkpoint as ck

    def read_shard(directory: str, rank: int) -> Any:  # [memory tier] hook 2c
        return memory[rank] if memory and rank in memory else ck.read_shard(directory, rank)

    ctx = session.ctx
    manifest = ck.read_manifest(Path(local))
    if not plain_optional and ctx.rank == 0:
        _warn_unloaded_sharded(manifest, chosen)
    # Same world size: a rank's own shard. After a resize, rank-local state follows the
    # worker (the rank its slot held before); replicated state comes from rank 0 below.
    source = ctx.rank if manifest.world_size == ctx.world_size else ctx.previous_rank
    own = read_shard(local, source) if source is not None and manifest.shard_files_of(source) else None
    meta = (own or {}).get(_META, {})
    if own is not None and meta.get("has_state"):
        state = own["state"]
    else:
        shared = read_shard(local, 0) if manifest.shard_files_of(0) else None
        if (shared is None or not shared.get(_META, {}).get("has_state")) and plain_optional:
            shared = {_META: {"has_state": True}, "state": {}}
        if shared is None or not shared.get(_META, {}).get("has_state"):
            raise CheckpointError(
                f"rank {ctx.rank}: checkpoint {chosen} has no state for this rank and no "
                "replicated state from rank 0. Fix: pass state= on rank 0 (replicated) or on "
                "every rank (sharded), with the same world size.")
        state = shared["state"]
    if own is not None and "rng" in meta:
        ck.restore_rng_state(meta["rng"])
    step = state.get("step") if isinstance(state, dict) else None
    if step is None and plain_optional:
        step = manifest.step
    session.last_step = step if isinstance(step, int) else session.last_step
    if ctx.rank == 0:
        session.record("restored", f"restored {os.path.basename(chosen)} (step {step}){note}",
                       step=step if isinstance(step, int) else None, path=chosen, **extra)
    return state
