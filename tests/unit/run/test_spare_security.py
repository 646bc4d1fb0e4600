"""The warm spare from the side of another local user of the node (a shared temporary
directory): a folder, file, link or FIFO planted where the spares live never makes a run
write through it, import from it, signal or delete anything of the victim's, hang, or fail
a worker's start. The tests run as root: "another user" is a uid of 65534 given by chown."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from rayguard import runtime
from rayguard._ray import spare, spare_dir

OTHER = 65534
RUN_ID = "fedcba9876543210"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """``(shared tmp, the run's SPARE_DIR_ENV value)``; this process's temporary directory
    is ``tmp_path`` (the node's shared /tmp), and no spare warning is remembered."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spare_dir, "_warned", set())
    monkeypatch.setattr(runtime.current(), "spare_recorded", -1)
    value = os.path.join(spare_dir.base_dir(), RUN_ID)
    monkeypatch.setenv(spare.SPARE_DIR_ENV, value)
    return tmp_path, value


def _victim(tmp_path, name="precious.txt", text="the victim's data\n"):
    path = tmp_path / "victim" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def _planted_base(tmp_path, mode=0o755, owner=OTHER):
    """The spares base made first by another user, holding the run's folder."""
    base = tmp_path / f"rayguard-spares-{os.getuid()}"
    (base / RUN_ID).mkdir(parents=True)
    os.chmod(base, mode)
    os.chmod(base / RUN_ID, mode)
    os.chown(base, owner, owner)
    os.chown(base / RUN_ID, owner, owner)
    return base / RUN_ID


def _warm_no_imports(monkeypatch):
    """``spare.warm`` whose waiting thread returns at once (no spare loop in the test)."""
    monkeypatch.setattr(spare, "_outlive_no_run", lambda *args: None)


# -- finding 1: the folder belongs to whoever makes it first; files opened through links ------
def test_a_base_another_user_made_is_refused_and_nothing_is_written_through_it(node, caplog,
                                                                              monkeypatch):
    tmp_path, value = node
    run = _planted_base(tmp_path)
    victim = _victim(tmp_path)
    os.symlink(victim, run / spare.MODULES_FILE)
    os.symlink(victim, run / str(os.getpid()))
    _warm_no_imports(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="rayguard"):
        spare.warm()  # never raises
        spare.record_modules()
        spare.touch()
    assert victim.read_text() == "the victim's data\n"  # neither overwritten nor truncated
    assert sorted(os.listdir(run)) == sorted([spare.MODULES_FILE, str(os.getpid())])
    assert sum("no warm spare on this node" in r.message for r in caplog.records) == 1
    assert "belongs to uid 65534" in caplog.text


def test_release_signals_only_this_runs_spares_and_deletes_nothing_outside(node):
    tmp_path, value = node
    fd = spare_dir.open_private(value, create=True)
    os.close(fd)
    victim = _victim(tmp_path, "12345")  # a victim's file named like a pid
    env = {k: v for k, v in os.environ.items() if k != spare.SPARE_DIR_ENV}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                                  "default_worker"], env=env)  # a worker of ours, another run
    try:
        deadline = time.monotonic() + 30
        while not spare_dir.is_ray_worker(bystander.pid):  # its exec done: it reads as a worker
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.symlink(victim, os.path.join(value, "12345"))  # a planted pid entry: a link
        open(os.path.join(value, str(bystander.pid)), "w").close()  # not this run's spare
        assert spare.idle_spares(value) == []
        assert spare.release_spares(value) == 0
        assert bystander.poll() is None  # never signalled
        assert victim.read_text() == "the victim's data\n"
        assert not os.path.exists(value)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_run_folder_that_is_a_link_is_not_followed(node, monkeypatch):
    tmp_path, value = node
    base = os.path.dirname(value)
    os.mkdir(base, 0o700)
    elsewhere = tmp_path / "victim-folder"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "keep").write_text("x")
    os.symlink(elsewhere, value)
    spare.record_modules()
    assert spare.release_spares(value) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep"]
    assert spare_dir.open_private(value) is None


# -- finding 2: the "only this user's list" check -----------------------------------------------
@pytest.fixture
def own_run(node):
    tmp_path, value = node
    fd = spare_dir.open_private(value, create=True)
    os.close(fd)
    return tmp_path, value


def test_a_linked_list_is_neither_imported_from_nor_written_through(own_run, monkeypatch):
    tmp_path, value = own_run
    evil = f"evilmod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{evil}.py").write_text("RAN = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    victim = _victim(tmp_path, text=f"{evil}\n")  # a file of the victim's, with the name
    os.symlink(victim, os.path.join(value, spare.MODULES_FILE))
    monkeypatch.setattr(spare, "_idle", lambda: True)
    assert spare.import_recorded(value) == 0
    assert evil not in sys.modules
    spare.record_modules()  # replaces the link itself
    assert victim.read_text() == f"{evil}\n"
    assert not os.path.islink(os.path.join(value, spare.MODULES_FILE))


def test_a_fifo_list_never_blocks_the_spare(own_run, monkeypatch):
    _, value = own_run
    os.mkfifo(os.path.join(value, spare.MODULES_FILE))
    monkeypatch.setattr(spare, "_idle", lambda: True)
    done = []
    thread = threading.Thread(target=lambda: done.append(spare.import_recorded(value)),
                              daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and done == [0]


def test_a_list_of_another_user_or_of_odd_names_is_not_imported(own_run, monkeypatch):
    tmp_path, value = own_run
    listed = os.path.join(value, spare.MODULES_FILE)
    with open(listed, "w") as f:
        f.write("json\n")
    os.chown(listed, OTHER, OTHER)
    monkeypatch.setattr(spare, "_idle", lambda: True)
    assert spare_dir.read_own(spare_dir.open_private(value), spare.MODULES_FILE) is None
    assert spare_dir.module_names(b"os; import evil\n../x\nos.path\nx-y\n__main__\n") == [
        "os.path", "__main__"]
    assert not spare._importable("__main__") and not spare._importable("os;import")


@pytest.mark.parametrize("marker", ["link", "another user's file"])
def test_a_planted_cuda_marker_does_not_turn_the_list_off(own_run, marker, monkeypatch):
    tmp_path, value = own_run
    wanted = f"rg_listed_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{wanted}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with open(os.path.join(value, spare.MODULES_FILE), "w") as f:
        f.write(f"{wanted}\n")
    cuda = os.path.join(value, spare.CUDA_FILE)
    if marker == "link":
        os.symlink(_victim(tmp_path), cuda)
    else:
        open(cuda, "w").close()
        os.chown(cuda, OTHER, OTHER)
    monkeypatch.setattr(spare, "_idle", lambda: True)
    monkeypatch.setattr(spare, "_cuda_loaded", lambda: False)
    fd = spare_dir.open_private(value)
    try:
        spare._import_list(fd)  # the planted marker is no reason to import nothing
        imported = wanted in sys.modules
    finally:
        os.close(fd)
        sys.modules.pop(wanted, None)
    assert imported


# -- finding 3: anyone could stop every live run on the node ------------------------------------
@pytest.mark.parametrize("planted", ["file", "open folder"])
def test_a_file_or_an_open_folder_at_the_base_turns_the_spare_off_never_the_worker(
        node, planted, caplog, monkeypatch):
    tmp_path, value = node
    base = tmp_path / f"rayguard-spares-{os.getuid()}"
    if planted == "file":
        base.write_text("")
    else:
        base.mkdir(mode=0o755)
        os.chmod(base, 0o777)
    _warm_no_imports(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="rayguard"):
        spare.warm()  # Ray's set-up hook: a raise here failed every worker's start
        spare.claim_process()
    assert "no warm spare on this node" in caplog.text
    assert spare.idle_spares(value) == [] and spare.release_spares(value) == 0
    if planted == "file":
        assert base.read_text() == ""


def test_the_environment_names_only_a_run_id(node):
    tmp_path, _ = node
    assert spare_dir.run_folder("/tmp/rayguard-spares-0/../../etc") is None
    assert spare_dir.run_folder("/elsewhere/" + RUN_ID) == os.path.join(
        spare_dir.base_dir(), RUN_ID)  # each node uses its own base, whatever the driver's
