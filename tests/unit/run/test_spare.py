"""The warm spare process of a live run (``rayguard._ray.spare``): its list on the node, the
process that claims itself out of it, the end of the spares left, and the environment that
names the hook (never over a user's own)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest

from rayguard import runtime
from rayguard._ray import spare, spare_dir

RUN_ID = "0123456789abcdef"


@pytest.fixture
def run(tmp_path, monkeypatch):
    """The run's spares folder value (:data:`spare.SPARE_DIR_ENV`) with this user's base in
    ``tmp_path`` (the node's temporary directory here, for this process and the spares it
    starts); the folder itself is ``spare_dir.run_folder(value)``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return os.path.join(spare_dir.base_dir(), RUN_ID)


def _made(value):
    """Make the run's folder as a worker would (private), and return it as a Path."""
    import pathlib

    fd = spare_dir.open_private(value, create=True)
    assert fd is not None
    os.close(fd)
    return pathlib.Path(value)


def _fake_worker(run=None):
    """A process whose command line reads as a Ray worker's (``default_worker``), once its
    exec is done (until then /proc shows the parent's command line); ``run``: the spares
    folder its environment carries (a spare of that run)."""
    env = dict(os.environ, **({spare.SPARE_DIR_ENV: run} if run else {}))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "default_worker"], env=env)
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


def test_the_list_keeps_live_ray_workers_and_drops_stale_entries(run):
    folder = _made(run)
    proc = _fake_worker(run)
    try:
        (folder / str(proc.pid)).touch()
        (folder / "999999999").touch()  # gone
        (folder / str(os.getpid())).touch()  # alive, but no Ray worker
        assert spare.idle_spares(run) == [proc.pid]
        assert sorted(os.listdir(folder)) == [str(proc.pid)]
        assert spare.release_spares(run) == 1
        assert proc.wait(timeout=10) != 0  # ended
        assert not folder.exists()  # a spare still starting sees it gone
    finally:
        proc.kill()


def test_a_process_that_becomes_a_worker_leaves_the_list(run, monkeypatch):
    monkeypatch.setenv(spare.SPARE_DIR_ENV, run)
    folder = _made(run)
    (folder / str(os.getpid())).touch()
    spare.claim_process()
    assert not (folder / str(os.getpid())).exists()
    assert spare._claimed.is_set()
    spare._claimed.clear()


def _idle_spare_ends_itself(run, bounds: str) -> None:
    """An idle spare process of the run (``spare.warm()``, no Ray: it runs no actor) with
    ``bounds`` set in its ``spare`` module ends itself (status 0) before its 30 s sleep,
    and leaves no run folder behind."""
    code = (f"import os, sys, tempfile; tempfile.tempdir = {os.path.dirname(os.path.dirname(run))!r}; "
            f"sys.argv.append('default_worker'); os.environ[{spare.SPARE_DIR_ENV!r}] = {run!r}; "
            f"from rayguard._ray import spare; {bounds}; spare._idle = lambda: True; "
            "spare.warm(); import time; time.sleep(30); sys.exit(3)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert proc.wait(timeout=60) == 0  # ended itself, not after its sleep
        assert not os.path.exists(run)  # (an orphan took its entry, the last, with it)
    finally:
        proc.kill()


def test_an_orphaned_spare_ends_itself(run):
    _made(run)  # the run's first worker on the node made it
    _idle_spare_ends_itself(run, "spare.ORPHAN_S, spare.POLL_S = 0.5, 0.2")


def test_a_spare_started_after_its_runs_end_ends_itself_and_makes_no_folder(run):
    """The run ended on the node (its folder removed) while the spare it asked for was
    still starting: the spare neither makes the folder again nor waits ``ORPHAN_S``."""
    _idle_spare_ends_itself(run, "spare.UNLISTED_S = 0.5")


def test_a_new_worker_that_found_no_folder_is_not_ended(run, monkeypatch):
    """A worker of the run's first attempt starts before any folder is made on its node:
    once it runs its actor the spare's thread leaves it alone."""
    monkeypatch.setattr(spare, "UNLISTED_S", 0.0)
    monkeypatch.setattr(spare, "_idle", lambda: False)
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail("a worker was ended"))
    spare._outlive_no_run(run, listed=False)
    assert not os.path.exists(run)


def test_the_spare_is_asked_for_after_the_delay_and_not_after_the_runs_end(run, monkeypatch):
    asked, slept = [], []
    monkeypatch.setenv(spare.SPARE_DIR_ENV, run)
    monkeypatch.setattr(spare, "prestart", lambda: asked.append(1) or True)
    monkeypatch.setattr(spare.time, "sleep", slept.append)
    assert spare.ensure_spare(after_s=60.0) is False  # no folder: the run ended here
    assert slept == [60.0] and asked == []
    _made(run)
    assert spare.ensure_spare(after_s=0.0) is True and asked == [1]
    assert slept == [60.0]  # at once: no sleep


def test_the_lowest_rank_of_a_node_asks_for_the_spare_with_the_configured_delay(run,
                                                                               monkeypatch):
    import types

    from rayguard.train import live

    calls = []
    monkeypatch.setenv(spare.SPARE_DIR_ENV, run)
    monkeypatch.setattr(spare, "ensure_spare", calls.append)
    infos = [{"rank": 0, "node_id": "a"}, {"rank": 1, "node_id": "a"}]
    live.keep_spare(types.SimpleNamespace(rank=1, node_id="a"), infos, after_s=60.0)
    assert calls == []  # not the node's lowest rank
    live.keep_spare(types.SimpleNamespace(rank=0, node_id="a"), infos, after_s=60.0)
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [60.0]


@pytest.mark.parametrize("value", [-1, "60", True, float("nan"), 3601])
def test_live_spare_after_s_takes_seconds(value):
    import rayguard

    with pytest.raises(rayguard.ConfigError, match="live_spare_after_s"):
        rayguard.HealthConfig(live_spare_after_s=value)
    assert rayguard.HealthConfig().live_spare_after_s == 60.0
    assert rayguard.HealthConfig(live_spare_after_s=0).live_spare_after_s == 0


def test_a_tick_keeps_the_spare(run, monkeypatch):
    monkeypatch.setenv(spare.SPARE_DIR_ENV, run)
    folder = _made(run)
    os.utime(folder, (0, 0))
    spare.touch()
    assert time.time() - folder.stat().st_mtime < 60


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


def _module(tmp_path, name, body):
    """A module ``name`` on ``tmp_path`` whose import runs ``body``."""
    (tmp_path / f"{name}.py").write_text(body)
    return name


def test_the_recording_rank_lists_its_modules_and_again_once_it_imports_more(tmp_path, run,
                                                                             monkeypatch):
    monkeypatch.setenv(spare.SPARE_DIR_ENV, run)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(runtime.current(), "spare_recorded", -1)
    folder = __import__("pathlib").Path(run)
    spare.touch()  # not the recording rank: nothing written
    assert not (folder / spare.MODULES_FILE).exists()
    spare.record_modules()
    names = (folder / spare.MODULES_FILE).read_text().split()
    assert "rayguard._ray.spare" in names and "json" in names
    assert not any(n.partition(".")[0] in ("__main__", "pytest", "_pytest") for n in names)
    assert [p.name for p in folder.iterdir()] == [spare.MODULES_FILE]  # whole
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct((folder / spare.MODULES_FILE).stat().st_mode & 0o777) == "0o600"
    name = _module(tmp_path, "rg_spare_later", "X = 1\n")
    __import__(name)
    try:
        spare.touch()  # the loop imported more: listed again
        assert name in (folder / spare.MODULES_FILE).read_text().split()
    finally:
        sys.modules.pop(name, None)


def _spare_process(tmp_path, directory, extra=""):
    code = (f"import os, sys, tempfile; tempfile.tempdir = {str(tmp_path)!r}; "
            f"sys.argv.append('default_worker'); sys.path.insert(0, {str(tmp_path)!r}); "
            f"os.environ[{spare.SPARE_DIR_ENV!r}] = {directory!r}; "
            "from rayguard._ray import spare; spare.POLL_S = spare.FIRST_S = 0.2; "
            "spare._idle = lambda: True; "  # no Ray here: it runs no actor
            f"spare._cuda_loaded = lambda: 'rg_spare_cuda' in sys.modules; {extra}"
            "spare.warm(); import time; time.sleep(60)")
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_for(path, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def test_a_spare_imports_what_the_workers_imported_before_and_after_it_started(tmp_path, run):
    """The list at its start (a module that fails or exits on import is skipped, the others
    still imported), and a list written while it waits."""
    value, run = run, _made(run)
    bad = _module(tmp_path, "rg_spare_bad", "raise SystemExit(7)\n")
    first = _module(tmp_path, "rg_spare_first",
                    f"open({str(tmp_path / 'first.imported')!r}, 'w').close()\n")
    (run / spare.MODULES_FILE).write_text(f"{bad}\n__main__\n{first}\n")
    proc = _spare_process(tmp_path, value)
    try:
        assert _wait_for(tmp_path / "first.imported")
        assert proc.poll() is None  # the module that exits did not end the spare
        later = _module(tmp_path, "rg_spare_later2",
                        f"open({str(tmp_path / 'later.imported')!r}, 'w').close()\n")
        part = run / ".part"
        part.write_text(f"{first}\n{later}\n")
        os.replace(part, run / spare.MODULES_FILE)
        assert _wait_for(tmp_path / "later.imported")
    finally:
        proc.kill()
        proc.wait()


def test_a_claimed_process_or_one_with_an_actor_imports_nothing_more(tmp_path, run,
                                                                    monkeypatch):
    (_made(run) / spare.MODULES_FILE).write_text("rg_spare_never\n")
    _module(tmp_path, "rg_spare_never", "raise AssertionError('imported after the claim')\n")
    monkeypatch.setattr(spare, "_idle", lambda: True)
    spare._claimed.set()
    try:
        assert spare.import_recorded(run) == 0
    finally:
        spare._claimed.clear()
    monkeypatch.setattr(spare, "_idle", lambda: False)  # Ray gave it an actor
    assert spare.import_recorded(run) == 0


def test_outside_a_ray_worker_no_process_counts_as_idle():
    code = ("import ray; from rayguard._ray import spare; "
            "assert spare._idle() is False; assert not ray.is_initialized()")  # none started
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_spare_whose_imports_touch_cuda_ends_itself_and_the_next_imports_no_list(tmp_path,
                                                                                  run):
    value, run = run, _made(run)
    cuda = _module(tmp_path, "rg_spare_cuda", "X = 1\n")  # reads as a CUDA call (see above)
    (run / spare.MODULES_FILE).write_text(f"{cuda}\n")
    proc = _spare_process(tmp_path, value)
    try:
        assert proc.wait(timeout=60) == 0  # ended itself, not after its sleep
    finally:
        proc.kill()
    assert (run / spare.CUDA_FILE).exists()
    assert [p.name for p in run.iterdir() if p.name.isdigit()] == []  # left the list
    first = _module(tmp_path, "rg_spare_after", f"open({str(tmp_path / 'after')!r}, 'w').close()\n")
    (run / spare.MODULES_FILE).write_text(f"{first}\n")
    proc = _spare_process(tmp_path, value)
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.isdigit() for p in run.iterdir()):  # its hook is done
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(1.0)  # five times its wait before the list (FIRST_S = 0.2 here)
        assert proc.poll() is None and not (tmp_path / "after").exists()  # no list imported
    finally:
        proc.kill()
        proc.wait()
