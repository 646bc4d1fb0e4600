"""The manifest at 16,384 ranks x 4 files: the committer's merge is exact (every file once,
every rank present, rank order), the text round-trips, the checks stay those of a small
manifest, and the fast paths (plain relative paths, symlink-free files, the verification
plan's heap) decide as the full checks do. No wall-time assertions (see
tests/benchmarks/bench_manifest.py for the figures)."""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil

import pytest

from rayguard import runtime
from rayguard.checkpoint import auth
from rayguard.checkpoint import sharded as sh
from rayguard.checkpoint.manifest import (
    MANIFEST_NAME,
    FileRecord,
    Manifest,
    ShardRecord,
    check_relative_path_fully,
    dumps_document,
    is_plain_relative,
    parse_manifest,
)
from rayguard.checkpoint.verify import plain_file, verify
from rayguard.exceptions import CheckpointCorruptError, CheckpointError

commit_mod = importlib.import_module("rayguard.checkpoint.commit")

RANKS, PER_RANK = 16_384, 4


def _names(rank: int) -> list[str]:
    return [f"shard-rank{rank:05d}.safetensors"] + [f"dcp/__{rank}_{k}.distcp" for k in range(PER_RANK - 1)]


def _records(ranks: int = RANKS) -> list[ShardRecord]:
    return [ShardRecord(r, tuple(FileRecord(p, r, r + k, f"{r:x}-{k}", (f"c{r}",))
                                 for k, p in enumerate(_names(r))))
            for r in range(ranks)]


@pytest.fixture(scope="module")
def records() -> list[ShardRecord]:
    return _records()


def test_merge_of_16384_ranks_lists_every_file_once_in_rank_order(records):
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)  # the gather's order does not matter
    files = commit_mod.merge_shards(shuffled, RANKS)
    assert len(files) == RANKS * PER_RANK
    assert [f.path for f in files] == [p for r in range(RANKS) for p in _names(r)]
    assert len({f.path for f in files}) == len(files)
    assert sorted({f.rank for f in files}) == list(range(RANKS))
    assert all(f is g for f, g in zip(files, (f for r in records for f in r.files), strict=True))


def test_16384_rank_manifest_round_trips_with_its_checks(records):
    files = commit_mod.merge_shards(records, RANKS)
    manifest = Manifest(world_size=RANKS, step=7, files=files, metadata={"attempt": 0})
    text = manifest.to_json()
    back = parse_manifest(text, "scale")
    assert back.files == files and back.ranks == list(range(RANKS)) and back.step == 7
    doc = json.loads(text)
    assert doc["ranks"] == list(range(RANKS)) and len(doc["files"]) == RANKS * PER_RANK
    doc["files"].append(dict(doc["files"][RANKS]))  # one file listed twice, among 65,537
    with pytest.raises(CheckpointCorruptError, match="listed twice"):
        parse_manifest(json.dumps(doc), "scale")
    doc["files"].pop()
    doc["ranks"] = doc["ranks"][:-1]
    with pytest.raises(CheckpointCorruptError, match=r"do not match .*\(16384 in all\)"):
        parse_manifest(json.dumps(doc), "scale")


def test_16384_rank_manifest_signed_with_a_key_round_trips(records, monkeypatch):
    monkeypatch.setattr(runtime.current(), "auth_key", auth.Key(b"k" * 32, "test"))
    manifest = Manifest(world_size=RANKS, step=1, files=commit_mod.merge_shards(records, RANKS))
    doc = json.loads(manifest.to_json())
    assert doc[auth.AUTH_KEY]["key_id"] == auth.active().key_id
    assert parse_manifest(json.dumps(doc), "scale").files == manifest.files
    doc["files"][RANKS * 2]["size_bytes"] += 1
    with pytest.raises(CheckpointCorruptError, match="does not match the manifest"):
        parse_manifest(json.dumps(doc), "scale")


@pytest.mark.parametrize("edit, match", [
    (lambda rs: rs + [rs[3]], "rank 3 twice"),
    (lambda rs: rs + [ShardRecord(RANKS, ())], "outside"),
    (lambda rs: rs[:-1] + [ShardRecord(rs[-1].rank, rs[-1].files + (rs[5].files[1],))],
     r"'dcp/__5_0.distcp' is claimed by ranks \[5, 16383\]"),
    (lambda rs: rs[:-1] + [ShardRecord(rs[-1].rank, (FileRecord("../x", rs[-1].rank, 0, "d"),))],
     "outside its checkpoint directory"),
])
def test_merge_refuses_what_would_make_an_unreadable_manifest(records, edit, match):
    with pytest.raises((CheckpointError, CheckpointCorruptError), match=match):
        commit_mod.merge_shards(edit(records[:]), RANKS)


def test_merge_keeps_partial_worlds_and_refuses_world_size_zero():
    files = commit_mod.merge_shards(_records(4)[1:3], 4)
    assert sorted({f.rank for f in files}) == [1, 2]
    with pytest.raises(CheckpointError, match="world_size=0"):
        commit_mod.merge_shards([], 0)


def test_commit_of_many_ranks_verifies(tmp_path):
    """A real, tiny-file checkpoint through commit and verify (1,024 ranks keeps it quick;
    the bench runs 16,384)."""
    ranks = 1024
    final = tmp_path / "checkpoint_000001"
    staging = commit_mod.prepare_staging(final)
    (staging / "dcp").mkdir()
    from rayguard.checkpoint.hashing import digest_bytes
    from rayguard.checkpoint.schemes import current

    records = []
    for r in range(ranks):
        files = []
        for p in _names(r):
            data = p.encode()
            (staging / p).write_bytes(data)
            files.append(FileRecord(p, r, len(data), *digest_bytes(data, scheme=current()),
                                    scheme=current()))
        records.append(ShardRecord(r, tuple(files)))
    commit_mod.commit(staging, final, records[::-1], world_size=ranks, step=1)
    report = verify(final)
    assert report.ok and report.files_hashed == ranks * PER_RANK
    assert report.manifest is not None and report.manifest.ranks == list(range(ranks))
    (final / _names(700)[2]).write_bytes(b"changed!" * 3)
    assert [p.file for p in verify(final).problems] == [_names(700)[2]]


# -- the text --------------------------------------------------------------------------------

def test_document_text_reads_as_the_indented_dump():
    doc = {"format": "f", "step": None, "files": [{"path": "a\nb\u2028\"}, {", "rank": 0},
                                                  {"path": "é", "rank": 1}],
           "metadata": {"nested": [1, {"x": 2.5}]}, "empty": [], "auth": {"mac": "m"}}
    text = dumps_document(doc)
    assert json.loads(text) == doc == json.loads(json.dumps(doc, indent=1))
    assert list(json.loads(text)) == list(doc)  # key order kept (the auth entry last)
    assert text.count("\n") == len(doc) + 2 + len(doc["files"])  # a line a key, a file, "]"
    assert '"files": [' in text and '"step": null' in text
    assert dumps_document({"files": []}) == '{\n "files": []\n}'
    with pytest.raises(ValueError):
        dumps_document({"x": float("nan")})


# -- the fast paths decide as the full checks --------------------------------------------------

ODD = ["", ".", "..", "a/../b", "a//b", "/a", "a/", "./a", "a/./b", "C:x", "c:/x", "1:x", "a:b",
       "\\\\srv\\share", "a\\b", "//srv/share/x", "a\x00b", "..a", "a..", "...", "dcp/.metadata",
       "shard-rank00001.safetensors", "dcp/__1_0.distcp", "é/ü", " a", "a ", "~", "$HOME", "a/b/c"]


@pytest.mark.parametrize("rel", ODD)
def test_plain_relative_paths_pass_the_full_check(rel):
    if is_plain_relative(rel):
        check_relative_path_fully(rel)  # never raises for a path the fast check clears


def test_plain_relative_agrees_with_the_full_check_on_random_paths():
    rng = random.Random(1)
    alphabet = "ab./\\:\x00C~ é"
    for _ in range(20_000):
        rel = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        if is_plain_relative(rel):
            check_relative_path_fully(rel)


def test_plain_file_declines_links_and_odd_paths(tmp_path):
    root = tmp_path / "ckpt"
    (root / "dcp").mkdir(parents=True)
    (root / "dcp" / "f").write_bytes(b"x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "g").write_bytes(b"y")
    os.symlink(tmp_path / "outside", root / "linked")
    os.symlink(root / "dcp" / "f", root / "inner")
    real = os.path.realpath(root)
    found = plain_file(real, "dcp/f")
    assert found is not None and found[0] == os.path.join(real, "dcp", "f") and found[1].st_size == 1
    for rel in ("linked/g", "inner", "dcp/missing", "dcp/f/x", "../ckpt/dcp/f", "./dcp/f"):
        assert plain_file(real, rel) is None, rel


def test_verify_still_refuses_links_that_escape_and_keeps_those_that_do_not(tmp_path):
    root = tmp_path / "ckpt"
    staging = commit_mod.prepare_staging(root)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "g").write_bytes(b"y")
    (staging / "a").write_bytes(b"x")
    from rayguard.checkpoint.hashing import digest_bytes
    from rayguard.checkpoint.schemes import current

    rec = ShardRecord(0, (FileRecord("a", 0, 1, *digest_bytes(b"x", scheme=current()),
                                     scheme=current()),
                          FileRecord("sub/g", 0, 1, *digest_bytes(b"y", scheme=current()),
                                     scheme=current())))
    (staging / "sub").mkdir()
    (staging / "sub" / "g").write_bytes(b"y")
    commit_mod.commit(staging, root, [rec], world_size=1, step=1)
    assert verify(root).ok
    (root / "sub" / "g").unlink()
    (root / "sub").rmdir()
    os.symlink(tmp_path / "outside", root / "sub")  # the directory now leads outside
    problems = verify(root).problems
    assert [p.file for p in problems] == ["sub/g"] and "symlink escapes" in problems[0].what
    os.unlink(root / "sub")
    (root / "sub").mkdir()
    os.symlink(root / "a", root / "sub" / "g")  # a link inside to a file inside: as before
    assert [p.file for p in verify(root).problems] == ["sub/g"]  # digest of "x" is not "y"'s
    assert "mismatch" in verify(root).problems[0].what
    assert (root / MANIFEST_NAME).exists()


# -- the verification plan at another world size --------------------------------------------

def _plan_by_scan(manifest: Manifest, world_size: int) -> list[list[str]]:
    """The plan as it was computed before the heap (a scan of every rank per file)."""
    plan: list[list[str]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for f in sorted(manifest.files, key=lambda f: (-f.size_bytes, f.path)):
        r = min(range(world_size), key=lambda i: (load[i], i))
        plan[r].append(f.path)
        load[r] += f.size_bytes
    return plan


@pytest.mark.parametrize("seed", range(5))
def test_plan_verification_heap_matches_the_scan(seed):
    rng = random.Random(seed)
    files = tuple(FileRecord(f"f{i}", i % 7, rng.choice([0, 1, 5, 5, 100, rng.randint(0, 999)]), "d")
                  for i in range(300))
    manifest = Manifest(world_size=7, step=0, files=files)
    for world in (1, 2, 3, 8, 64, 301):
        assert sh.plan_verification(manifest, world) == _plan_by_scan(manifest, world)


def test_plan_verification_of_16384_ranks_onto_another_size_covers_every_file_once(records):
    manifest = Manifest(world_size=RANKS, step=0, files=commit_mod.merge_shards(records, RANKS))
    plan = sh.plan_verification(manifest, 12_288)
    flat = [p for share in plan for p in share]
    assert len(flat) == len(set(flat)) == RANKS * PER_RANK
    assert max(map(len, plan)) - min(map(len, plan)) <= 2  # similar sizes spread evenly


def test_remote_commit_merges_through_the_same_checks(tmp_path):
    import pyarrow.fs as pafs

    from rayguard.checkpoint.manifest import read_manifest
    from rayguard.checkpoint.remote import commit_remote, download

    fs, remote = pafs.LocalFileSystem(), str(tmp_path / "remote" / "checkpoint_000001")
    fs.create_dir(remote, recursive=True)
    records = _records(64)
    commit_remote(remote, records[::-1], world_size=64, step=1, metadata={}, fs=fs)
    manifest = read_manifest(remote)  # a LocalFileSystem: the remote directory is local
    assert [f.path for f in manifest.files] == [p for r in range(64) for p in _names(r)]
    with pytest.raises(CheckpointError, match="rank 9 twice"):
        commit_remote(remote, records + [records[9]], world_size=64, step=1, metadata={}, fs=fs)
    local = download(remote, fs, ranks=range(64))  # none of the files exist: only the manifest
    try:
        assert [name for _, _, names in os.walk(local) for name in names] == [MANIFEST_NAME]
    finally:
        shutil.rmtree(local)
