"""The train-side checkpoint protocol (save/load over a Collective and a CheckpointStore),
with N ranks as threads (ThreadGroup) on real files, crashed at every point of the protocol.

A crash freezes the rank's thread where it is (no clean-up runs, as after a SIGKILL) and its
peers' gathers fail. Each test then checks what a new start sees: the old committed
checkpoint only, or the new one whole; and load() returns the newest that verifies."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from rayguard.checkpoint import fsio, verify
from rayguard.checkpoint.commit import STAGING_PREFIX
from rayguard.checkpoint.rng import capture_rng_state
from rayguard.exceptions import CheckpointError
from rayguard.testing.collective import PeerLost, ThreadGroup
from rayguard.testing.forge import flip_byte
from rayguard.train import protocol
from rayguard.train.collective import Collective
from rayguard.train.store import CheckpointStore, LocalStore, RemoteStore, store_for

WORLD = 3


def _payload(rank: int, step: int) -> Any:
    state = {"step": step, "w": torch.full((300_000,), float(rank * 100 + step))}  # > 1 MiB
    return protocol.make_payload(state, rng=capture_rng_state())


def _save(group: ThreadGroup, store: CheckpointStore, step: int, attempt: int = 0) -> list[Any]:
    return group.run(lambda c: protocol.save(c, store, _payload(c.rank, step), step=step,
                                             attempt=attempt, tag=f"report{step}"))


def _load(root: Path, group: ThreadGroup | None = None, **kwargs: Any) -> list[Any]:
    group = group or ThreadGroup(WORLD)
    return group.run(lambda c: protocol.load(c, LocalStore(str(root)), tag="load1", **kwargs))


def _committed(root: Path) -> list[str]:
    """Directories a reader would consider (staging is never read)."""
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith(STAGING_PREFIX))


def _assert_old_or_new_whole(root: Path, *, new_visible: bool) -> None:
    old, new = protocol.checkpoint_name(1, 0), protocol.checkpoint_name(2, 0)
    visible = _committed(root)
    assert visible == ([old, new] if new_visible else [old])
    for name in visible:
        assert verify(root / name).ok, name
    restored = _load(root)
    expected_step = 2 if new_visible else 1
    for rank, r in enumerate(restored):
        assert isinstance(r, protocol.Restored), r
        assert r.step == expected_step
        assert torch.equal(r.state["w"], torch.full((300_000,), float(rank * 100 + expected_step)))
    assert not [p for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)]  # cleaned up


@contextmanager
def _hooks(phase: Callable[[str, str], None] | None = None,
           write: Callable[[str, int, int], None] | None = None) -> Iterator[None]:
    old_phase = fsio.set_phase_hook(phase)
    old_write = fsio.set_write_fault_hook(write)
    try:
        yield
    finally:
        fsio.set_phase_hook(old_phase)
        fsio.set_write_fault_hook(old_write)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    results = _save(ThreadGroup(WORLD), LocalStore(str(tmp_path)), step=1)
    assert isinstance(results[0], protocol.Committed) and results[1:] == [None] * (WORLD - 1)
    return tmp_path


def test_a_save_commits_one_verified_checkpoint_and_load_reads_each_rank(root: Path) -> None:
    group = ThreadGroup(WORLD)
    results = _save(group, LocalStore(str(root)), step=2)
    committed = results[0]
    assert committed.step == 2 and committed.shards == WORLD and committed.bytes > 3 * 1_200_000
    assert [e["kind"] for e in group.events] == ["checkpoint_committed"]
    _assert_old_or_new_whole(root, new_visible=True)


def test_a_commit_in_the_loop_says_it_blocked_the_loop_throughout(root: Path) -> None:
    group = ThreadGroup(WORLD)
    _save(group, LocalStore(str(root)), step=2)
    (event,) = group.events
    assert event["blocked_s"] == event["seconds"] >= 0  # goodput's checkpoint time


def _crash_at_phase(group: ThreadGroup, name: str, rank: int) -> Callable[[str, str], None]:
    def hook(phase: str, path: str) -> None:
        if phase == name and group.current_rank() == rank:
            group.freeze_here()
    return hook


@pytest.mark.parametrize(("point", "crashed", "new_visible"), [
    ("shard-opened", 1, False),        # crash before the shard is written (empty file)
    ("shard-written", 2, False),       # written and fsynced, before the records gather
    ("manifest-written", 0, False),    # at commit: manifest in staging, before the rename
    ("published", 0, True),            # after the rename: the new one is whole
])
def test_a_crash_at_each_phase_leaves_old_only_or_new_whole(root: Path, point: str, crashed: int,
                                                            new_visible: bool) -> None:
    group = ThreadGroup(WORLD)
    try:
        with _hooks(phase=_crash_at_phase(group, point, crashed)):
            results = _save(group, LocalStore(str(root)), step=2)
        assert group.dead == {crashed}
        if crashed != 0:  # the peers never get every record
            assert all(isinstance(r, PeerLost) for r in results)
        else:  # rank 0 died committing; the others had handed over their records
            assert results[1:] == [None] * (WORLD - 1)
        _assert_old_or_new_whole(root, new_visible=new_visible)
    finally:
        group.release()


def test_a_crash_mid_write_leaves_a_partial_shard_that_no_reader_accepts(root: Path) -> None:
    group = ThreadGroup(WORLD)

    def hook(path: str, offset: int, nbytes: int) -> None:
        if group.current_rank() == 1 and "shard-rank00001" in path and offset > 0:
            group.freeze_here()  # the header is on disk, the tensor is not

    try:
        with _hooks(write=hook):
            _save(group, LocalStore(str(root)), step=2)
        staging = root / f"{STAGING_PREFIX}{protocol.checkpoint_name(2, 0)}"
        assert 0 < (staging / "shard-rank00001.safetensors").stat().st_size < 1_000_000
        _assert_old_or_new_whole(root, new_visible=False)
    finally:
        group.release()


def test_a_crash_at_commit_before_the_manifest_is_written(root: Path) -> None:
    group = ThreadGroup(WORLD)

    def hook(path: str, offset: int, nbytes: int) -> None:
        if "rayguard_manifest" in path:
            group.freeze_here()

    try:
        with _hooks(write=hook):
            results = _save(group, LocalStore(str(root)), step=2)
        assert group.dead == {0} and results[1:] == [None] * (WORLD - 1)  # peers went on
        _assert_old_or_new_whole(root, new_visible=False)
    finally:
        group.release()


class _FailingStore(LocalStore):
    """A store whose shard upload fails on one rank (a full disk, an I/O error)."""

    def __init__(self, root: str, rank: int, err: int) -> None:
        super().__init__(root)
        self.rank, self.err = rank, err

    def upload(self, staged: str, final: str, record: Any) -> None:
        if record.rank == self.rank:
            raise OSError(self.err, os.strerror(self.err), final)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_a_failing_peer_fails_the_save_on_every_rank_and_changes_nothing(root: Path,
                                                                          err: int) -> None:
    group = ThreadGroup(WORLD)
    results = _save(group, _FailingStore(str(root), rank=1, err=err), step=2)
    for r in results:
        assert isinstance(r, CheckpointError)
        assert "checkpoint of step 2 was not saved (earlier checkpoints are intact)" in str(r)
        assert "rank 1 on node local" in str(r) and os.strerror(err) in str(r)
    assert not [p for p in root.iterdir() if p.name.startswith(STAGING_PREFIX)]  # discarded
    _assert_old_or_new_whole(root, new_visible=False)


def test_a_disk_full_mid_write_fails_cleanly(root: Path) -> None:
    with fsio.inject_write_error(errno.ENOSPC, after_bytes=1000, path_contains="shard-rank00002"):
        results = _save(ThreadGroup(WORLD), LocalStore(str(root)), step=2)
    assert all(isinstance(r, CheckpointError) and "No space left" in str(r) for r in results)
    _assert_old_or_new_whole(root, new_visible=False)


def test_load_skips_a_corrupt_newest_checkpoint_and_remembers_it(root: Path) -> None:
    _save(ThreadGroup(WORLD), LocalStore(str(root)), step=2)
    shard = root / protocol.checkpoint_name(2, 0) / "shard-rank00001.safetensors"
    flip_byte(shard, -10)
    group = ThreadGroup(WORLD)
    restored = _load(root, group)
    assert [r.step for r in restored] == [1] * WORLD
    rejected = [e for e in group.events if e["kind"] == "checkpoint_rejected"]
    assert len(rejected) == 1 and rejected[0]["path"].endswith(protocol.checkpoint_name(2, 0))
    assert list(group.rejections) == [rejected[0]["path"]]
    assert str(root / protocol.checkpoint_name(2, 0)) in LocalStore(str(root)).rejected()


def test_a_checkpoint_the_crash_loop_rule_rejected_is_skipped_and_the_one_read_named(
        root: Path) -> None:
    """What ``load_state()`` does for the crash-loop rule (the controller's, proved in
    tests/unit/controller/test_harness_crash_loop.py): ``on_chosen`` is told, on every rank,
    the checkpoint it is about to read (rank 0 names it to the run's coordinator), and a
    checkpoint the rule rejected, though it verifies, is not offered again."""
    _save(ThreadGroup(WORLD), LocalStore(str(root)), step=2)
    newest, older = (str(root / protocol.checkpoint_name(s, 0)) for s in (2, 1))
    chosen: list[str | None] = []
    _load(root, on_chosen=chosen.append)
    assert chosen == [newest] * WORLD
    chosen.clear()
    group = ThreadGroup(WORLD)
    group.rejections[newest] = "attempts 1-2 resumed from it and failed the same way"
    restored = _load(root, group, on_chosen=chosen.append)
    assert [r.step for r in restored] == [1] * WORLD and chosen == [older] * WORLD
    assert not [e for e in group.events if e["kind"] == "checkpoint_rejected"]  # not again
    chosen.clear()
    _load(root / "empty", on_chosen=chosen.append)
    assert chosen == [None] * WORLD  # a fresh start names none


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_a_later_fit_reaching_a_step_again_commits_beside_the_earlier_ones_checkpoint(
        tmp_path: Path, remote: bool) -> None:
    """A second fit() of the same run directory (a sweep restarting its trial from an earlier
    checkpoint, which rejects the later ones) reaches step 2 again in its attempt 0: its
    checkpoint gets a name of its own, the rejected one stays as it was, and a resume takes
    the new one (the rejection names the old path only). The ranks look for a free name one
    after another (rank 0 already uploading into its choice): they still choose the same."""
    import pyarrow.fs as pafs

    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()) if remote else None
    run = tmp_path / "run"
    run.mkdir()
    store = _SlowRemote("run", fs) if remote else _SlowLocal(str(run))
    _save(ThreadGroup(WORLD), store, step=1)
    first = _save(ThreadGroup(WORLD), store, step=2)[0]
    store.remember_rejection(first.path, "taken after the anomaly")
    manifest = (run / protocol.checkpoint_name(2, 0) / "rayguard_manifest.json").read_bytes()
    again = _save(ThreadGroup(WORLD), store, step=2)
    assert isinstance(again[0], protocol.Committed), again
    assert again[0].path.endswith(protocol.checkpoint_name(2, 0) + ".1"), again[0].path
    assert (run / protocol.checkpoint_name(2, 0) / "rayguard_manifest.json").read_bytes() == manifest
    third = _save(ThreadGroup(WORLD), store, step=2)[0]
    assert third.path.endswith(protocol.checkpoint_name(2, 0) + ".2"), third.path
    group = ThreadGroup(WORLD)
    restored = group.run(lambda c: protocol.load(c, store, tag="load1"))
    assert [r.step for r in restored] == [2] * WORLD
    assert not [e for e in group.events if e["kind"] == "checkpoint_rejected"]


class _SlowRemote(RemoteStore):
    """Its ranks look for a taken name one after another: the first to ask at once, the next
    0.1 s later, ... (as the ranks of a real run arrive)."""

    def taken(self, final: str) -> bool:
        return _looked(self, super().taken, final)


class _SlowLocal(LocalStore):
    def taken(self, final: str) -> bool:
        return _looked(self, super().taken, final)


def _looked(store: Any, look: Callable[[str], bool], final: str) -> bool:
    import threading

    order = store.__dict__.setdefault("order", {})
    time.sleep(0.1 * order.setdefault(threading.get_ident(), len(order)))
    return look(final)


def test_load_on_an_empty_run_returns_none(tmp_path: Path) -> None:
    assert _load(tmp_path) == [None] * WORLD


def test_the_protocols_are_met() -> None:
    group = ThreadGroup(2)
    assert isinstance(group.member(0), Collective)
    assert isinstance(LocalStore("/x"), CheckpointStore)


def test_the_remote_store_commits_and_loads_through_a_pyarrow_filesystem(tmp_path: Path) -> None:
    import pyarrow.fs as pafs

    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    store = store_for("run", fs)
    assert isinstance(store, RemoteStore) and isinstance(store_for(str(tmp_path), None), LocalStore)
    _save(ThreadGroup(WORLD), store, step=1)
    results = _save(ThreadGroup(WORLD), _FailingRemote("run", fs), step=2)  # nothing visible
    assert all(isinstance(r, CheckpointError) for r in results)
    assert store.candidates(set()) == [f"run/{protocol.checkpoint_name(1, 0)}"]
    assert verify(tmp_path / "run" / protocol.checkpoint_name(1, 0)).ok
    group = ThreadGroup(WORLD)
    restored = group.run(lambda c: protocol.load(c, store, tag="load1"))
    assert [r.step for r in restored] == [1] * WORLD
    assert torch.equal(restored[2].state["w"], torch.full((300_000,), 201.0))


class _FailingRemote(RemoteStore):
    def upload(self, staged: str, final: str, record: Any) -> None:
        if record.rank == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), final)
        super().upload(staged, final, record)


def test_the_protocol_imports_no_ray() -> None:
    import subprocess
    import sys

    code = ("import sys, rayguard.train.protocol, rayguard.train.store, "
            "rayguard.train.collective, rayguard.testing.collective; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _FakeTier:
    """The memory tier's hooks, recorded; it serves payloads it was offered."""

    def __init__(self) -> None:
        self.offered: dict[tuple[str, int], Any] = {}
        self.committed_paths: list[str] = []

    def enabled(self) -> bool:
        return True

    def offer(self, final: str, step: int, payload: Any, record: Any) -> None:
        self.offered[(final, record.rank)] = payload

    def committed(self, final: str, step: int) -> None:
        self.committed_paths.append(final)

    def choose(self, skip: set[str]) -> str | None:
        return self.committed_paths[-1] if self.committed_paths else None

    def prepare(self, chosen: str, choose_on_disk: Callable[[], str | None]) -> Any:
        held = {rank: p for (final, rank), p in self.offered.items() if final == chosen}
        return chosen, held, {"tier": "memory"}


def test_the_memory_tier_hooks_see_each_shard_and_serve_the_load(tmp_path: Path) -> None:
    tier = _FakeTier()
    store = LocalStore(str(tmp_path))
    ThreadGroup(WORLD).run(lambda c: protocol.save(c, store, _payload(c.rank, 1), step=1,
                                                   attempt=0, tag="r1", tier=tier))
    final = store.final_path(protocol.checkpoint_name(1, 0))
    assert sorted(r for _, r in tier.offered) == list(range(WORLD))
    assert tier.committed_paths == [final]  # once, by rank 0, after the commit
    for key in tier.offered:  # mark the memory copies, to see which tier served the load
        tier.offered[key]["state"]["w"] = tier.offered[key]["state"]["w"] + 0.5
    group = ThreadGroup(WORLD)
    restored = group.run(lambda c: protocol.load(c, store, tag="load1", tier=tier))
    for rank, r in enumerate(restored):
        assert torch.equal(r.state["w"], torch.full((300_000,), rank * 100 + 1.5))
    (event,) = [e for e in group.events if e["kind"] == "restored"]
    assert event["tier"] == "memory"
    assert 0 <= event["load_s"] < 60  # the restore's own phase (choose, verify, read)
