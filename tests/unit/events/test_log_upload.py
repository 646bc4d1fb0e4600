"""A remote run's event log is uploaded while the run goes on: every few seconds when it has
grown, and once more at the end; a reader on the remote filesystem sees it mid-run. Real
files on a pyarrow filesystem rooted elsewhere (what rayguard treats as remote storage)."""

from __future__ import annotations

import json
import time

import pyarrow.fs as pafs

from rayguard.events.read import read
from rayguard.events.upload import LogUploader


def _append(path, kind, at):
    with open(path, "a") as f:
        f.write(json.dumps({"kind": kind, "time": at}) + "\n")


def test_the_log_reaches_storage_during_the_run_and_at_its_end(tmp_path):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    remote = pafs.SubTreeFileSystem(str(bucket), pafs.LocalFileSystem())
    local = tmp_path / "driver" / "rayguard_events.jsonl"
    local.parent.mkdir()
    _append(local, "start", 1.0)
    uploader = LogUploader(str(local), "exp/run", remote, interval_s=0.05).start()
    deadline = time.monotonic() + 10
    while uploader.uploads < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["kind"] for e in read("exp/run", remote)] == ["start"]  # mid-run, from storage
    idle = uploader.uploads
    time.sleep(0.3)
    assert uploader.uploads == idle  # unchanged log: no upload
    _append(local, "attempt_started", 2.0)
    deadline = time.monotonic() + 10
    while uploader.uploads == idle and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["kind"] for e in read("exp/run", remote)] == ["start", "attempt_started"]
    _append(local, "finished", 3.0)
    uploader.stop()  # fit() ends: the last lines too
    assert [e["kind"] for e in read("exp/run", remote)][-1] == "finished"


def test_a_failing_upload_warns_once_and_never_raises(tmp_path, caplog):
    class Broken:
        def create_dir(self, *args, **kwargs):
            raise OSError("bucket gone")

    local = tmp_path / "rayguard_events.jsonl"
    _append(local, "start", 1.0)
    uploader = LogUploader(str(local), "run", Broken())
    assert uploader.upload() is False and uploader.upload() is False
    assert sum("could not upload the event log" in r.message for r in caplog.records) == 1
    uploader.stop()
