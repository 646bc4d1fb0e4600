"""The warm spare process of a live run (``rayguard._ray.spare``): its list on the node, the
process that claims itself out of it, the end of the spares left, and the environment that
names the hook (never over a user's own)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rayguard._ray import spare


def _fake_worker():
    """A process whose command line reads as a Ray worker's (``default_worker``), once its
    exec is done (until then /proc shows the parent's command line)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "default_worker"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                if b"default_worker" in f.read():
                    return proc
        except OSError:
            pass
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the fake worker never showed its command line")


def test_the_list_keeps_live_ray_workers_and_drops_stale_entries(tmp_path):
    proc = _fake_worker()
    try:
        (tmp_path / str(proc.pid)).touch()
        (tmp_path / "999999999").touch()  # gone
        (tmp_path / str(os.getpid())).touch()  # alive, but no Ray worker
        assert spare.idle_spares(str(tmp_path)) == [proc.pid]
        assert sorted(os.listdir(tmp_path)) == [str(proc.pid)]
        assert spare.release_spares(str(tmp_path)) == 1
        assert proc.wait(timeout=10) != 0  # ended
        assert not tmp_path.exists()  # a spare still starting sees it gone
    finally:
        proc.kill()


def test_a_process_that_becomes_a_worker_leaves_the_list(tmp_path, monkeypatch):
    monkeypatch.setenv(spare.SPARE_DIR_ENV, str(tmp_path))
    (tmp_path / str(os.getpid())).touch()
    spare.claim_process()
    assert not (tmp_path / str(os.getpid())).exists()
    assert spare._claimed.is_set()
    spare._claimed.clear()


def test_an_orphaned_spare_ends_itself(tmp_path):
    code = (f"import os, sys; sys.argv.append('default_worker'); "
            f"os.environ[{spare.SPARE_DIR_ENV!r}] = {str(tmp_path / 'run')!r}; "
            "from rayguard._ray import spare; spare.ORPHAN_S, spare.POLL_S = 0.5, 0.2; "
            "spare.warm(); import time; time.sleep(30); sys.exit(3)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert proc.wait(timeout=60) == 0  # ended itself, not after its sleep
        assert not (tmp_path / "run").exists()  # and took its entry (the last) with it
    finally:
        proc.kill()


def test_a_tick_keeps_the_spare(tmp_path, monkeypatch):
    monkeypatch.setenv(spare.SPARE_DIR_ENV, str(tmp_path))
    os.utime(tmp_path, (0, 0))
    spare.touch()
    assert time.time() - tmp_path.stat().st_mtime < 60


def test_no_spare_without_the_environment(monkeypatch):
    monkeypatch.delenv(spare.SPARE_DIR_ENV, raising=False)
    assert spare.idle_spares() == [] and spare.ensure_spare() is False
    assert spare.release_spares() == 0


def test_the_environment_is_the_runs_own_and_names_the_hook():
    from ray._private import ray_constants

    first, second = spare.spare_env(), spare.spare_env()
    assert first[ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR] == spare.HOOK
    assert first[spare.SPARE_DIR_ENV] != second[spare.SPARE_DIR_ENV]  # spares of one run


def test_a_users_own_hook_is_kept(monkeypatch):
    from ray._private import ray_constants

    from rayguard._ray.spare import has_setup_hook

    assert has_setup_hook({ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR: "mine.hook"})
    assert not has_setup_hook({"OTHER": "1"})


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_live_spare_takes_a_bool(value):
    import rayguard

    with pytest.raises(rayguard.ConfigError, match="live_spare"):
        rayguard.HealthConfig(live_spare=value)
