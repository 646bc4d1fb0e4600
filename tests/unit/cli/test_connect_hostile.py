"""The CLI helper process (``rayguard doctor``, ``rayguard topology --address``) from the
attacker's side: a ``json.py`` planted where the user runs the command is never imported;
``--env`` values never appear in the helper's argv (``ps``); ``--address auto`` warns, and
keeps the user's token, when the cluster it found is another user's. Real processes,
real sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import rayguard
from rayguard.cluster_owner import foreign_owner, listener_uid

BOUND_S = 180
PLANTED = """import os
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "IMPORTED"), "w").write("x")
raise ImportError("planted json.py was imported")
"""
# The parent itself must not take the current directory (as the `rayguard` script does not)
PARENT = "import sys; sys.path.pop(0); from rayguard.cli import main; sys.exit(main())"


def _env(**extra: str) -> dict[str, str]:
    drop = ("RAY_ADDRESS", "RAY_AUTH_", "NCCL_", "RAYGUARD_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    root = str(Path(rayguard.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return {**env, **extra}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], cwd: str | None = None, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PARENT, *args], cwd=cwd, env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("command", [["doctor"], ["topology"]])
def test_a_planted_json_py_in_the_current_directory_is_not_imported(tmp_path, command):
    (tmp_path / "json.py").write_text(PLANTED)
    args = [*command, "--address", f"127.0.0.1:{_closed_port()}", "--connect-timeout", "5"]
    proc = _start(args, cwd=str(tmp_path))
    out, err = proc.communicate(timeout=BOUND_S)
    assert not (tmp_path / "IMPORTED").exists(), err
    assert proc.returncode == 2, out + err
    assert "planted json.py" not in err


def _children(pid: int) -> list[int]:
    """The children of ``pid``: only processes numbered after it are read (a child's number
    is higher unless the numbers wrapped, and then the test fails as "never seen"), as a
    loaded machine runs hundreds of processes and reading each one's /proc entry every 20 ms
    took about half a core (300 processes beside it)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) > pid:
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_doctor_env_values_are_not_in_the_helpers_argv():
    secret = f"hunter2-{uuid.uuid4().hex}"
    args = ["doctor", "--address", f"127.0.0.1:{_closed_port()}", "--connect-timeout", "5",
            "--env", f"DB_PASSWORD={secret}"]
    proc = _start(args)
    # a child forked but not yet exec'd shows the parent's command line: known in advance,
    # as /proc may still show something else when read just after the parent started
    parents = {_cmdline(proc.pid),
               b"\0".join(a.encode() for a in [sys.executable, "-c", PARENT, *args]) + b"\0"}
    seen: list[bytes] = []
    deadline = time.monotonic() + BOUND_S
    while proc.poll() is None and time.monotonic() < deadline:
        seen += [c for c in map(_cmdline, _children(proc.pid)) if c and c not in parents]
        time.sleep(0.02)  # each look reads every process's /proc entry; the helper lives 5 s
    proc.communicate(timeout=BOUND_S)
    assert seen, "the helper process was never seen"
    assert not any(secret.encode() in c for c in seen), seen[0]


@pytest.fixture
def foreign_cluster():
    """A silent "GCS" whose listening socket belongs to another user (uid 65534), as the
    kernel's socket table shows it: made while this (root) process acts as that user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a socket as another user")
    os.seteuid(65534)
    try:
        server = socket.socket()
    finally:
        os.seteuid(0)
    server.bind(("0.0.0.0", 0))  # Ray resolves 127.0.0.1 to this node's address
    server.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_auto_address_warns_when_the_cluster_is_another_users(foreign_cluster):
    assert listener_uid(foreign_cluster) == 65534 and foreign_owner(foreign_cluster) == 65534
    proc = _start(["doctor", "--connect-timeout", "3"], RAY_ADDRESS=foreign_cluster)
    out, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 2, out + err  # the silent port never answers
    assert "is run by another user" in err and "uid 65534" in err, err
    assert "your Ray token is not sent" in err


def test_own_cluster_is_not_foreign():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        assert listener_uid(address) == os.getuid() and foreign_owner(address) is None
    assert listener_uid(f"127.0.0.1:{_closed_port()}") is None
    assert listener_uid("198.51.100.7:6379") is None  # not this machine
