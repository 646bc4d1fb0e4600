"""A DCP checkpoint written by another torch that this torch cannot parse is reported as such
(both versions, the fix) and kept; under the same torch release the same failure is
corruption. Another torch is simulated: the manifest records another version and
``dcp/.metadata`` is a pickle this torch's DCP classes cannot unpickle (a
``TensorProperties`` state one field longer than this torch's: ``too many values to
unpack``, what 2.14 says of 2.15's metadata)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import metadata as dcp_md

from rayguard import checkpoint as ck
from rayguard.checkpoint import fallback, rejections
from rayguard.checkpoint import sharded as sh
from rayguard.checkpoint.commit import commit, staging_dir_for
from rayguard.checkpoint.manifest import MANIFEST_NAME, library_versions, release_of
from rayguard.checkpoint.rng import capture_rng_state
from rayguard.checkpoint.torch_compat import CheckpointVersionError, running_torch, version_mismatch
from rayguard.checkpoint.writer import write_shard
from rayguard.exceptions import CheckpointCorruptError, CheckpointError
from rayguard.testing.collective import ThreadGroup
from rayguard.testing.forge import forge_file
from rayguard.train import checkpointing, protocol
from rayguard.train.store import LocalStore

OTHER = "2.99.0"
"""The torch a simulated checkpoint was written by (never this one)."""


# -- the pure decision ---------------------------------------------------------------------
def test_another_release_is_a_version_mismatch_naming_both_and_the_fix() -> None:
    message = version_mismatch("2.15.0", "2.14.1", "ValueError: too many values to unpack")
    assert message is not None
    assert "written by torch 2.15.0" in message and "this torch (2.14.1)" in message
    assert "too many values to unpack" in message and "not corrupt" in message
    assert "torch==2.15.0" in message and "re-save" in message


@pytest.mark.parametrize(("saved", "running"), [
    ("2.15.0", "2.15.0"),
    ("2.15.0", "2.15.0+cu132"),  # default wheels: metadata without, __version__ with a label
    ("2.13.0+cpu", "2.13.0"),
    (None, "2.15.0"),
    ("not installed", "2.15.0"),
    ("", "2.15.0"),
    ("2.15.0", None),
])
def test_the_same_release_or_an_unknown_version_is_no_mismatch(saved: str | None,
                                                               running: str | None) -> None:
    assert version_mismatch(saved, running, "ValueError: x") is None


def test_release_of_strips_the_local_label_only() -> None:
    assert release_of("2.15.0+cu132") == "2.15.0" == release_of("2.15.0")
    assert release_of("2.16.0.dev20260101+cpu") == "2.16.0.dev20260101"
    assert running_torch() == release_of(torch.__version__)


def test_the_manifest_records_torch_and_reads_it_back_as_a_release(tmp_path: Path) -> None:
    final = _checkpoint(tmp_path, 1)
    manifest = ck.read_manifest(final)
    assert manifest.versions["torch"] == library_versions()["torch"]  # written as is
    assert manifest.torch_version == release_of(torch.__version__)  # read as a release
    assert ck.Manifest(1, 1, (), versions={}).torch_version is None


# -- a simulated checkpoint of another torch -----------------------------------------------
class _LongerState:
    """Pickles as a ``TensorProperties`` whose state has one field more than this torch's."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (dcp_md.TensorProperties, (), (torch.float32, torch.strided, False, 0, False, 1))


def _checkpoint(root: Path, step: int) -> Path:
    import torch.distributed.checkpoint as dcp

    final = root / f"checkpoint_{step:09d}_a0"
    staging = staging_dir_for(final)
    dcp.save({"model": {"w": torch.full((8,), float(step))}}, checkpoint_id=str(staging / sh.DCP_DIR),
             no_dist=True)
    plain = write_shard(staging, 0, protocol.make_payload({"step": step}, capture_rng_state()))
    record = ck.ShardRecord(0, plain.files + sh.record_dcp_files(staging, 0))
    meta = {sh.SHARDED_KEY: sh.describe_sharded(1, [], ["model"])}
    return commit(staging, final, [record], world_size=1, step=step, metadata=meta)


def _written_by(path: Path, torch_version: str) -> Path:
    """Make ``path`` look written by ``torch_version`` with metadata this torch cannot parse."""
    manifest = path / MANIFEST_NAME
    doc = json.loads(manifest.read_text(encoding="utf-8"))
    doc["versions"]["torch"] = torch_version
    manifest.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    forge_file(path, "dcp/.metadata", pickle.dumps(_LongerState()))
    return path


def _load_state(root: Path) -> Any:
    target = {"model": {"w": torch.zeros(8)}}
    [out] = ThreadGroup(1).run(lambda c: checkpointing.load_state(
        c, LocalStore(str(root)), target, load_count=1, previous_rank=None))
    return out


def test_another_torchs_checkpoint_is_reported_not_rejected_and_stays_offered(tmp_path: Path) -> None:
    old = _checkpoint(tmp_path, 1)
    new = _written_by(_checkpoint(tmp_path, 2), f"{OTHER}+cu132")
    report = ck.verify(new)
    assert report.ok and [n.file for n in report.notes] == ["dcp/.metadata"]
    note = report.notes[0].what
    assert f"written by torch {OTHER}" in note and f"this torch ({running_torch()})" in note
    assert "too many values to unpack" in note and f"torch=={OTHER}" in note
    assert fallback.scan(tmp_path) == fallback.ScanResult(new, report, ())  # not skipped for old
    out = _load_state(tmp_path)
    assert isinstance(out, CheckpointError) and not isinstance(out, CheckpointCorruptError), out
    assert f"written by torch {OTHER}" in str(out)
    assert rejections.rejected(tmp_path) == {}  # a run on torch 2.99 still resumes from it
    assert ck.verify(old).ok


def test_the_safe_reader_raises_the_version_error_not_a_refusal(tmp_path: Path) -> None:
    from rayguard.checkpoint.dcp_safe import SafeReader

    new = _written_by(_checkpoint(tmp_path, 2), OTHER)
    reader = SafeReader(new, ck.read_manifest(new))
    with pytest.raises(CheckpointVersionError, match=f"written by torch {OTHER}"):
        reader.read_metadata()
    with pytest.raises(CheckpointVersionError):  # DCP's rank-local fallback: the same answer
        reader.read_metadata(rank=0)
    assert reader.refusal is None and reader.version_error is not None


@pytest.mark.parametrize("recorded", ["same", "same+cu132"])
def test_under_the_same_torch_the_parse_failure_is_still_corruption(tmp_path: Path,
                                                                     recorded: str) -> None:
    old = _checkpoint(tmp_path, 1)
    same = release_of(library_versions()["torch"])
    new = _written_by(_checkpoint(tmp_path, 2), recorded.replace("same", same))
    report = ck.verify(new)
    assert not report.ok and not report.notes
    [problem] = report.problems
    assert problem.file == "dcp/.metadata" and "not a DCP metadata file" in problem.what
    assert "too many values to unpack" in problem.what
    result = fallback.scan(tmp_path)
    assert result.chosen == old and [r.path for r in result.rejected] == [str(new)]
    restored = _load_state(tmp_path)
    assert isinstance(restored, protocol.Restored) and restored.path == str(old), restored
    assert "not a DCP metadata file" in rejections.rejected(tmp_path)[str(new)]


def test_the_cli_says_ok_with_a_note(tmp_path: Path, run_cli) -> None:
    new = _written_by(_checkpoint(tmp_path, 2), OTHER)
    out = run_cli(["checkpoint", "verify", new])
    assert out.rc == 0, out.stdout + out.stderr
    assert out.stdout.startswith("OK ") and "note: dcp/.metadata: " in out.stdout
    assert f"written by torch {OTHER}" in out.stdout
