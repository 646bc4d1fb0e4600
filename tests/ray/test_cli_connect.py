"""CLI commands that connect to a cluster never hang: ``rayguard doctor`` and ``rayguard
topology --address`` against a closed port, a port that never answers (a bounded connect),
a real Ray cluster with token auth that refuses us (named as such, with the fix), and
SIGINT / SIGTERM during the connect (exit 130 / 143 at once). Real subprocesses, real
sockets, real signals; the bounds asserted are the tests' own generous timeouts, not speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BOUND_S = 240  # generous: a loaded 2-core machine; the commands' own bounds are far lower


def _env(**extra: str) -> dict[str, str]:
    drop = ("RAY_ADDRESS", "RAY_AUTH_", "NCCL_", "RAYGUARD_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, **extra}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rayguard", *args], env=env or _env(),
                          capture_output=True, text=True, timeout=BOUND_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def silent_gcs() -> Iterator[str]:
    """A TCP port that accepts connections and never says a word (a hung GCS)."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(128)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


@pytest.fixture(scope="module")
def auth_token() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


@pytest.fixture(scope="module")
def token_home(tmp_path_factory: pytest.TempPathFactory, auth_token: str) -> str:
    """A HOME whose ~/.ray/auth_token is the cluster's token (the user's own default token,
    as `ray start` leaves it), without touching the real home."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(auth_token)
    return str(home)


@pytest.fixture(scope="module")
def auth_cluster(auth_token: str) -> Iterator[str]:
    """A real one-node Ray 2.60 cluster with token authentication (RAY_AUTH_MODE=token),
    in its own process group and temp dir; stopped by killing that group only."""
    # Not under tmp_path: Ray's socket paths under it (session folder and all) must stay
    # within the 107 bytes a Unix socket's path may have, and pytest's folder is deep.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-auth-"))
    port = _free_port()
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=auth_token, RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
         f"--ray-client-server-port={_free_port()}", f"--temp-dir={temp_dir}",
         "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + BOUND_S
        while (temp_dir / "ray_current_cluster").exists() is False:
            assert proc.poll() is None, "ray start --head with token auth failed"
            assert time.monotonic() < deadline, "the token-auth cluster did not start"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the cluster's processes, nobody else's
        except ProcessLookupError:
            pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_doctor_closed_port_exits_2_with_a_clear_message():
    port = _free_port()  # bound, then closed: nothing listens
    proc = _cli("doctor", "--address", f"127.0.0.1:{port}")
    assert proc.returncode == 2, proc.stderr
    assert f"no Ray cluster answers at '127.0.0.1:{port}'" in proc.stderr
    assert "--address none" in proc.stderr


def test_doctor_connect_is_bounded(silent_gcs):
    proc = _cli("doctor", "--address", silent_gcs, "--connect-timeout", "2")
    assert proc.returncode == 2, proc.stderr
    assert f"could not connect to the Ray cluster at {silent_gcs} within 2 s" in proc.stderr
    assert "--connect-timeout" in proc.stderr and "--address none" in proc.stderr
    data = json.loads(_cli("doctor", "--json", "--address", silent_gcs,
                           "--connect-timeout", "2").stdout)
    assert data["ok"] is None and data["reason"] == "timeout"


def test_topology_connect_is_bounded(silent_gcs):
    proc = _cli("topology", "--address", silent_gcs, "--connect-timeout", "2")
    assert proc.returncode == 2, proc.stderr
    assert "rayguard topology: could not connect" in proc.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("command", ["doctor", "topology"])
def test_signal_during_connect_ends_it_at_once(silent_gcs, sig, code, command):
    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "rayguard", command, "--address", silent_gcs,
                             "--connect-timeout", str(BOUND_S * 4)],
                            env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once the helper is inside ray.init
        assert "connecting to the Ray cluster" in line, line
        helpers = psutil.Process(proc.pid).children(recursive=True)
        assert helpers, "the connect runs in a helper process"
        time.sleep(1.0)  # well inside Ray's C++ connect loop
        proc.send_signal(sig)
        assert proc.wait(timeout=BOUND_S) == code
        assert "rayguard: " in proc.stderr.read()
        _, alive = psutil.wait_procs(helpers, timeout=30)
        assert not alive, "the helper process must not outlive the command"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_doctor_names_a_token_auth_refusal_with_the_fix(auth_cluster):
    proc = _cli("doctor", "--address", auth_cluster)  # no token in this environment
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    assert "refused this process's authentication" in err and "InvalidAuthToken" in err
    assert "RAY_AUTH_MODE=token" in err and "RAY_AUTH_TOKEN" in err and "--address none" in err
    data = json.loads(_cli("doctor", "--json", "--address", auth_cluster).stdout)
    assert data["reason"] == "auth"
    topo = _cli("topology", "--address", auth_cluster)
    assert topo.returncode == 2 and "refused this process's authentication" in topo.stderr


def test_doctor_with_the_right_token_checks_the_cluster(auth_cluster, auth_token):
    """Not a false positive: with the cluster's token the same command gets a report."""
    proc = _cli("doctor", "--json", "--address", auth_cluster,
                env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=auth_token))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["address"] is not None and len(data["nodes"]) == 1


def test_doctor_auto_sends_this_users_token_as_ray_init_does(auth_cluster, token_home):
    """``--address auto`` finding a cluster: with RAY_AUTH_MODE unset, the user's default
    token goes along (Ray's rule for a cluster found automatically); an explicit address
    gets none, so that refusal is reported with the fix."""
    env = _env(HOME=token_home, RAY_ADDRESS=auth_cluster)
    found = _cli("doctor", "--json", env=env)
    assert found.returncode in (0, 1), found.stderr[-2000:]
    assert json.loads(found.stdout)["address"] is not None
    explicit = _cli("doctor", "--address", auth_cluster, env=_env(HOME=token_home))
    assert explicit.returncode == 2 and "RAY_AUTH_MODE is unset here" in explicit.stderr


def test_doctor_without_cluster_says_it_checked_this_machine_only():
    proc = _cli("doctor", env=_env(RAY_ADDRESS="127.0.0.1:1"))  # "auto" finds nothing alive
    assert proc.returncode in (0, 1), proc.stderr
    head = proc.stdout.splitlines()[0]
    assert head.startswith("rayguard doctor: no Ray cluster found: checked this machine only, ")
    seconds = float(head.rsplit(", ", 1)[1].removesuffix(" s"))
    assert seconds > 0.0  # the real elapsed time (it printed "0.0 s")
