"""Checkpoints from the side of someone who can write the shared run directory: a FIFO or a
link where a manifest should be, links inside a reported directory, a checkpoint unsealed
or resealed without the key. Real files, no Ray."""

from __future__ import annotations

import json
import os
import threading

import pytest

from rayguard import runtime
from rayguard.checkpoint import auth, unsealed, verify
from rayguard.checkpoint.fsio import NotRegularFileError, read_bounded
from rayguard.checkpoint.manifest import MANIFEST_NAME
from rayguard.checkpoint.reported import hash_directory, seal
from rayguard.cli import main
from rayguard.exceptions import ConfigError, UnsealableCheckpointError
from rayguard.failures.fatal import fatal_cause
from rayguard.train.reported_choice import verify_reported
from rayguard.train.store import LocalStore


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv(auth.KEY_FILE_ENV_VAR, raising=False)
    auth.use(None)
    yield
    auth.use(None)


def _sealed(tmp_path, name="checkpoint_1", data=b"weights" * 100):
    d = tmp_path / name
    d.mkdir()
    (d / "model.pt").write_bytes(data)
    seal(d, [hash_directory(d, 0)], world_size=1, step=3)
    return d


def _key(tmp_path, text="k" * 32, name="key"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _finishes(fn, *args):
    """Run ``fn`` in a thread; its result, or a failure when it is still blocked after 10 s."""
    out: list = []

    def run():
        try:
            out.append((fn(*args), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out.append((None, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), f"{fn.__name__} blocked (a FIFO was opened for reading)"
    result, error = out[0]
    if error is not None:
        raise error
    return result


# -- finding 5: a FIFO where a manifest should be -------------------------------------------
def test_a_fifo_manifest_never_blocks_verify_ls_or_the_choosing_rank(tmp_path, capsys):
    d = tmp_path / "checkpoint_9"
    d.mkdir()
    (d / "model.pt").write_bytes(b"x")
    os.mkfifo(d / MANIFEST_NAME)
    assert _finishes(main, ["checkpoint", "verify", str(d)]) == 1
    assert "not a regular file (a FIFO)" in capsys.readouterr().out
    assert _finishes(main, ["checkpoint", "ls", str(tmp_path)]) == 1
    problems, _, unverified = _finishes(verify_reported, LocalStore(str(tmp_path)), str(d))
    assert problems and not unverified  # rejected, not offered as "unsealed"


def test_the_shared_reader_refuses_links_fifos_and_folders(tmp_path):
    (tmp_path / "real").write_bytes(b"abc")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    assert read_bounded(tmp_path / "real", 10) == b"abc"
    assert read_bounded(tmp_path / "real", 1) == b"ab"  # one past the bound: "too long"
    for name in ("link", "fifo"):
        with pytest.raises(NotRegularFileError):
            _finishes(read_bounded, tmp_path / name, 10)
    with pytest.raises(NotRegularFileError, match="directory"):
        read_bounded(tmp_path, 10)


def test_a_linked_manifest_is_not_read_through(tmp_path):
    d = _sealed(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    os.replace(d / MANIFEST_NAME, elsewhere)
    os.symlink(elsewhere, d / MANIFEST_NAME)
    report = verify(d)
    assert not report.ok and "symbolic link" in report.describe()


# -- finding 6: links inside a reported checkpoint --------------------------------------------
@pytest.mark.parametrize("kind", ["file link", "folder link", "fifo"])
def test_a_reported_directory_with_a_link_or_fifo_is_refused_when_reported(tmp_path, kind):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model.pt").write_bytes(b"m")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "big.bin").write_bytes(b"b")
    if kind == "file link":
        os.symlink(tmp_path / "outside" / "big.bin", d / "big.bin")
    elif kind == "folder link":
        os.symlink(tmp_path / "outside", d / "data")
    else:
        os.mkfifo(d / "pipe")
    with pytest.raises(UnsealableCheckpointError) as info:
        hash_directory(d, 1)
    message = str(info.value)
    assert "rank 1" in message and "Fix:" in message
    assert ("symbolic link" in message) == (kind != "fifo")
    assert fatal_cause(info.value) == "checkpoint"  # the loop would do it again: not retried


# -- finding 4: a checkpoint the run sealed is never offered unsealed -------------------------
def test_an_unsealed_checkpoint_is_offered_only_when_it_can_predate_rayguard():
    decide = unsealed.refusal
    base = dict(committed=(), older_sealed=False, key_set=False, accept_unsealed=True)
    assert decide("checkpoint_b", **base) == ""  # reported before rayguard: a warning only
    assert "checkpoint_committed" in decide("checkpoint_b", **{**base, "committed": ["checkpoint_b"]})
    assert decide("checkpoint_b", **{**base, "committed": ["checkpoint_a"]}) == ""
    assert "older checkpoint" in decide("checkpoint_b", **{**base, "older_sealed": True})
    assert "key is set" in decide("checkpoint_b", **{**base, "key_set": True})
    assert "accept_unsealed=False" in decide("checkpoint_b", **{**base, "accept_unsealed": False})


def test_the_runs_log_names_what_it_committed(tmp_path):
    lines = [{"kind": "checkpoint_committed", "time": 1.0, "path": str(tmp_path / "checkpoint_a")},
             {"kind": "checkpoint_committed", "time": 2.0, "path": 7},
             {"kind": "restored", "time": 3.0, "path": str(tmp_path / "checkpoint_b")}]
    (tmp_path / "rayguard_events.jsonl").write_text(
        "\n".join(json.dumps(e) for e in lines) + "\nnot json\n")
    assert unsealed.committed_names(str(tmp_path)) == {"checkpoint_a"}
    assert unsealed.committed_names(str(tmp_path / "missing")) == set()
    os.replace(tmp_path / "rayguard_events.jsonl", tmp_path / "log")
    os.mkfifo(tmp_path / "rayguard_events.jsonl")  # a FIFO as the log: nothing, no hang
    assert _finishes(unsealed.committed_names, str(tmp_path)) == set()


# -- authenticated checkpoints ---------------------------------------------------------------
def _reseal(d, data=b"evil" * 10):
    """What someone without the key can do: change the state, hash it again, reseal."""
    (d / "model.pt").write_bytes(data)
    os.unlink(d / MANIFEST_NAME)
    seal(d, [hash_directory(d, 0)], world_size=1, step=3)


@pytest.mark.parametrize("scheme", ["blake3", "sha256"])
def test_a_resealed_checkpoint_is_refused_under_the_key_and_accepted_without(tmp_path, scheme,
                                                                           monkeypatch):
    from rayguard.checkpoint import schemes

    monkeypatch.setattr(runtime.current(), "hash_scheme", schemes.CONFIG_NAMES[scheme])
    key = auth.load_key(_key(tmp_path))
    auth.use(key)
    d = _sealed(tmp_path)
    doc = json.loads((d / MANIFEST_NAME).read_text())
    assert doc["auth"]["mac"] == auth.MACS[schemes.CONFIG_NAMES[scheme]]
    assert doc["auth"]["key_id"] == key.key_id and "k" * 16 not in json.dumps(doc)
    assert verify(d).ok and verify(d).manifest.key_id == key.key_id
    auth.use(None)
    _reseal(d)  # by someone without the key
    assert verify(d).ok  # integrity alone cannot tell
    auth.use(key)
    report = verify(d)
    assert not report.ok and "not authenticated" in report.describe()
    assert "no keyed digest" in report.describe()


def test_a_manifest_edited_after_signing_or_signed_with_another_key_is_refused(tmp_path):
    auth.use(auth.load_key(_key(tmp_path)))
    d = _sealed(tmp_path)
    doc = json.loads((d / MANIFEST_NAME).read_text())
    doc["step"] = 99  # resume from "another step", digests untouched
    (d / MANIFEST_NAME).write_text(json.dumps(doc))
    assert "does not match" in verify(d).describe()
    other = _sealed(tmp_path, "checkpoint_2")
    auth.use(auth.load_key(_key(tmp_path, "z" * 40, "other")))
    assert "signed with key id" in verify(other).describe()


def test_the_cli_verifies_with_a_key_file_or_the_environment(tmp_path, capsys, monkeypatch):
    key_path = _key(tmp_path)
    auth.use(auth.load_key(key_path))
    d = _sealed(tmp_path)
    auth.use(None)
    _reseal(_sealed(tmp_path, "checkpoint_2"))
    assert main(["checkpoint", "verify", str(d), "--key-file", str(key_path)]) == 0
    assert "signed with key" in capsys.readouterr().out
    auth.use(None)
    monkeypatch.setenv(auth.KEY_FILE_ENV_VAR, str(key_path))
    assert main(["checkpoint", "verify", str(tmp_path / "checkpoint_2")]) == 1
    assert "not authenticated" in capsys.readouterr().out
    monkeypatch.setenv(auth.KEY_FILE_ENV_VAR, str(_key(tmp_path, "short", "weak")))
    assert main(["checkpoint", "ls", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "RAYGUARD_CHECKPOINT_KEY_FILE" in err and "5 bytes" in err and "Fix" in err


def test_a_bad_key_file_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"CheckpointConfig.key_file=.*cannot open"):
        auth.load_key(tmp_path / "missing")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="not a regular file"):
        _finishes(auth.load_key, tmp_path / "fifo")
    assert "secret" not in repr(auth.load_key(_key(tmp_path, "secret" * 4)))
    from rayguard import CheckpointConfig

    with pytest.raises(ConfigError, match="key_file"):
        CheckpointConfig(key_file=5)
    with pytest.raises(ConfigError, match="accept_unsealed"):
        CheckpointConfig(accept_unsealed="no")


def test_an_unsealed_reported_checkpoint_is_rejected_under_a_key(tmp_path):
    d = tmp_path / "checkpoint_1"
    d.mkdir()
    (d / "model.pt").write_bytes(b"plain TorchTrainer checkpoint")
    store = LocalStore(str(tmp_path))
    assert verify_reported(store, str(d)) == ("", None, True)  # no manifest: "unsealed"
    assert unsealed.refusal(d.name, committed=(), older_sealed=False,
                            key_set=auth.active() is not None, accept_unsealed=True) == ""
    auth.use(auth.load_key(_key(tmp_path)))
    assert "key is set" in unsealed.refusal(d.name, committed=(), older_sealed=False,
                                            key_set=auth.active() is not None,
                                            accept_unsealed=True)
