"""Cluster work for a CLI command that never hangs: a child process does it, this one waits.

``ray.init(address=...)`` blocks inside Ray's C++ client (retrying "Failed to get cluster ID
from GCS server" for minutes, e.g. against a cluster with token auth) where Python signal
handlers never run, so Ctrl-C and SIGTERM are ignored. :func:`call_connected` runs the
connect and the work in a child process (its own session, so only this process gets the
terminal's Ctrl-C) and waits in pure Python:

- the connect is bounded (``connect_timeout_s``, from the moment the child starts
  ``ray.init``), the work after it by ``timeout_s``;
- an authentication refusal, seen in the child's log as soon as Ray prints it, ends the wait
  at once with :class:`ClusterUnavailableError` ``(kind="auth")`` and the fix;
- SIGINT / SIGTERM kill the child and exit at once with 130 / 143
  (:func:`install_exit_handlers`).

The child runs ``target(notify, **kwargs)`` (``"module:function"``); the function calls
``notify("connecting", address=...)`` just before ``ray.init`` and ``notify("connected")``
after it, and returns a JSON-able value.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from rayguard.exceptions import RayGuardError
from rayguard.inert import inert

DEFAULT_CONNECT_TIMEOUT_S = 15.0
"""How long ``ray.init(address=...)`` may take before a CLI command gives up."""
STARTUP_ALLOWANCE_S = 120.0
"""Time the child may take to import Ray before it starts connecting (a loaded machine)."""
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
_POLL_S = 0.2

# What Ray 2.60's client logs when the GCS refuses its token (gcs_client.cc, grpc status),
# and the Python error it raises for token problems.
AUTH_MARKERS = ("Unauthenticated", "InvalidAuthToken", "AuthenticationError",
                "Authentication token is missing or incorrect")

Notify = Callable[..., None]


class ClusterUnavailableError(RayGuardError):
    """A command could not reach or use the Ray cluster. ``kind``: ``auth`` (the cluster
    refused our token), ``timeout`` (no connect or no answer in time), ``unreachable``,
    ``failed`` (the work raised or the child died)."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.kind))


def is_auth_failure(text: str) -> bool:
    """Whether Ray's output says the cluster refused this process's authentication."""
    return any(marker in text for marker in AUTH_MARKERS)


def auth_message(command: str, address: str, local_hint: str) -> str:
    mode = os.environ.get("RAY_AUTH_MODE")
    sent = (f"RAY_AUTH_MODE={mode} here" if mode else
            "RAY_AUTH_MODE is unset here, so no token is sent to an explicit address")
    return (f"{command}: the Ray cluster at {address} refused this process's authentication "
            f"(Ray token auth: \"Unauthenticated ... InvalidAuthToken\"; {sent}). Fix: use the "
            "cluster's token here: export RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<token> (or "
            "RAY_AUTH_TOKEN_PATH=<file>, default ~/.ray/auth_token), or " + local_hint)


def init_ray(address: str, *, found_automatically: bool, notify: Notify | None = None,
             command: str = "rayguard") -> None:
    """``ray.init(address=...)`` for a CLI helper process, with Ray's own token rule: a
    cluster found automatically (``auto``) gets this user's token (``~/.ray/auth_token``)
    when RAY_AUTH_MODE is unset, as a bare ``ray.init()`` does; an explicit address does not
    (Ray 2.60, ``ray/_private/worker.py``). Except when the cluster found belongs to another
    user of this machine: then the token is not sent and ``notify("warning", ...)`` says so."""
    import logging

    import ray

    if found_automatically:
        warning = foreign_cluster_warning(address, command)
        if warning is None:
            from rayguard._ray.core import enable_default_token_auth

            enable_default_token_auth()
        elif notify is not None:
            notify("warning", message=warning)
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)


def foreign_cluster_warning(address: str, command: str = "rayguard") -> str | None:
    """A warning when the cluster ``--address auto`` found (``address``: the resolved one,
    or ``"auto"``) is run by another user of this machine; None when it is this user's or
    the owner cannot be told (a remote cluster)."""
    from rayguard.cluster_owner import foreign_owner, user_name

    if address == "auto":
        from rayguard._ray.core import resolve_auto_address

        try:
            address = resolve_auto_address() or ""
        except Exception:  # noqa: BLE001 - ray.init will say what is wrong
            return None
    uid = foreign_owner(address)
    if uid is None:
        return None
    return (f"{command}: warning: the Ray cluster found at {address} (--address auto) is run "
            f"by another user ({user_name(uid)}, uid {uid}), not by you; your Ray token is not "
            "sent to it. Fix: start your own cluster or pass its address (--address "
            "host:port); to use this one on purpose, pass --address "
            f"{address} with RAY_AUTH_MODE=token")


def process_elapsed_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``), imports included; None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def install_exit_handlers(on_signal: Callable[[], None] | None = None) -> Callable[[], None]:
    """SIGINT exits 130 and SIGTERM 143 at once, whatever the process is doing in Python
    (``on_signal`` runs first, e.g. to kill a child). Returns a function that puts the
    previous handlers back. Main thread only; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        if on_signal is not None:
            try:
                on_signal()
            except Exception:  # noqa: BLE001, S110 - exiting anyway
                pass
        name = "interrupted" if signum == signal.SIGINT else "terminated"
        try:
            os.write(2, f"\nrayguard: {name}\n".encode())
        except OSError:
            pass
        os._exit(EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _read_lines(stream: IO[bytes], out: queue.Queue[dict[str, Any] | None]) -> None:
    for raw in stream:
        try:
            out.put(json.loads(raw))
        except ValueError:
            continue
    out.put(None)


class _Waiter:
    """The parent's side: reads the child's messages and its log, applies the bounds."""

    def __init__(self, proc: subprocess.Popen[bytes], log: IO[bytes], *, command: str,
                 address: str, local_hint: str, connect_timeout_s: float,
                 timeout_s: float, progress: IO[str] | None) -> None:
        self.proc, self.log, self.command, self.address = proc, log, command, address
        self.local_hint, self.progress = local_hint, progress
        self.connect_timeout_s, self.timeout_s = connect_timeout_s, timeout_s
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        assert proc.stdout is not None
        threading.Thread(target=_read_lines, args=(proc.stdout, self.messages),
                         daemon=True).start()
        self.phase = "starting"
        self.deadline = time.monotonic() + STARTUP_ALLOWANCE_S
        self.log_text = ""

    def fail(self, message: str, kind: str) -> ClusterUnavailableError:
        _kill_group(self.proc)
        return ClusterUnavailableError(message, kind)

    def _log_tail(self) -> str:
        lines = [ln for ln in self.log_text.splitlines() if ln.strip()]
        return lines[-1][-300:] if lines else "(no output)"

    def _on_message(self, msg: dict[str, Any]) -> Any:
        phase = msg.get("phase")
        if phase == "connecting":
            self.phase, self.address = "connecting", msg.get("address") or self.address
            self.deadline = time.monotonic() + self.connect_timeout_s
            if self.progress is not None:
                print(f"{self.command}: connecting to the Ray cluster at {self.address} (up to "
                      f"{self.connect_timeout_s:.0f} s; Ctrl-C stops)", file=self.progress,
                      flush=True)
        elif phase == "warning":
            print(inert(msg.get("message", "")), file=sys.stderr, flush=True)
        elif phase == "connected":
            self.phase = "connected"
            self.deadline = time.monotonic() + self.timeout_s
        elif phase == "error":
            message = str(msg.get("message", "unknown error"))
            self.log_text += self.log.read().decode(errors="replace")
            if is_auth_failure(self.log_text + message):
                raise self.fail(auth_message(self.command, self.address, self.local_hint), "auth")
            if not message.startswith(self.command):
                message = (f"{self.command}: {message}. Fix: check the address and `ray status` "
                           f"on the head node, or {self.local_hint}")
            raise self.fail(message, msg.get("kind", "failed"))
        return msg

    def _timed_out(self) -> ClusterUnavailableError:
        if self.phase == "connected":
            return self.fail(f"{self.command}: the Ray cluster at {self.address} did not answer "
                             f"within {self.timeout_s:.0f} s. Fix: check `ray status` there, or "
                             "raise --timeout", "timeout")
        if self.phase == "connecting":
            return self.fail(f"{self.command}: could not connect to the Ray cluster at "
                             f"{self.address} within {self.connect_timeout_s:.0f} s (Ray said: "
                             f"{self._log_tail()}). Fix: check the address and `ray status` "
                             f"on the head node, raise --connect-timeout, or {self.local_hint}",
                             "timeout")
        return self.fail(f"{self.command}: the helper process did not start within "
                         f"{STARTUP_ALLOWANCE_S:.0f} s (machine overloaded?)", "timeout")

    def wait(self) -> Any:
        while True:
            try:
                msg = self.messages.get(timeout=_POLL_S)
            except queue.Empty:
                msg = {}
            if msg is None:  # the child closed its output: it ended
                self.proc.wait()
                self.log_text += self.log.read().decode(errors="replace")
                if is_auth_failure(self.log_text):
                    raise self.fail(auth_message(self.command, self.address, self.local_hint), "auth")
                raise self.fail(f"{self.command}: the helper process ended (exit "
                                f"{self.proc.returncode}) without an answer: {self._log_tail()}",
                                "failed")
            if msg:
                msg = self._on_message(msg)
                if msg.get("phase") == "result":
                    self.proc.wait()
                    return msg.get("value")
            self.log_text += self.log.read().decode(errors="replace")
            if self.phase != "connected" and is_auth_failure(self.log_text):
                raise self.fail(auth_message(self.command, self.address, self.local_hint), "auth")
            if time.monotonic() > self.deadline:
                raise self._timed_out()


def call_connected(target: str, kwargs: dict[str, Any], *, command: str, address: str,
                   local_hint: str, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                   timeout_s: float = 60.0, progress: IO[str] | None = None) -> Any:
    """Run ``target(notify, **kwargs)`` in a child process and return its result.

    Args:
        target: ``"module:function"``, importable in a fresh interpreter.
        kwargs: JSON-able keyword arguments.
        command: how messages name the command (``"rayguard doctor"``).
        address: the cluster, for messages (the child may report the resolved one).
        local_hint: the last words of a fix, e.g. ``"pass --address none to check only this
            machine"``.
        connect_timeout_s: bound on the child's ``ray.init`` (from its ``connecting`` notice).
        timeout_s: bound on the work after ``connected``.
        progress: where to say "connecting ..." (e.g. ``sys.stderr``); None: silent.

    Raises:
        ClusterUnavailableError: auth refused, a bound passed, or the work failed.
    """
    payload = json.dumps({"target": target, "kwargs": kwargs}).encode()
    with tempfile.NamedTemporaryFile(prefix="rayguard-connect-", suffix=".log") as log, \
            open(log.name, "rb") as reader:  # own offset: reads what the child appends
        # the request (doctor --env values included) goes over stdin, never into argv (ps)
        proc = subprocess.Popen(child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=log, start_new_session=True)
        _send(proc, payload)
        restore = install_exit_handlers(lambda: _kill_group(proc))
        try:
            waiter = _Waiter(proc, reader, command=command, address=address,
                             local_hint=local_hint, connect_timeout_s=connect_timeout_s,
                             timeout_s=timeout_s, progress=progress)
            return waiter.wait()
        finally:
            _kill_group(proc)
            restore()


def import_paths() -> list[str]:
    """Where the helper imports from besides the interpreter's own: the folder holding this
    rayguard, then PYTHONPATH's absolute entries; never the current directory."""
    here = os.path.realpath(os.getcwd())
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out: list[str] = []
    for path in [package_parent, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]:
        if (path and os.path.isabs(path) and path not in out
                and (path == package_parent or os.path.realpath(path) != here)):
            out.append(path)
    return out


def child_command() -> list[str]:
    """The helper's command line. Isolated mode (``-I``, Python 3.10 included) puts neither
    the current directory nor the user site on ``sys.path`` and ignores PYTHON* variables;
    the paths of :func:`import_paths` are set before the first rayguard import, so a
    ``json.py`` in the directory where a user runs ``rayguard doctor`` is never imported."""
    boot = (f"import sys; sys.path[:0] = {import_paths()!r}; "
            "from rayguard.connect import child_entry; child_entry()")
    return [sys.executable, "-I", "-c", boot]


def _send(proc: subprocess.Popen[bytes], payload: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except OSError:  # the child died at once: the waiter reports its last words
        pass


def child_entry() -> None:
    """The helper's first call: the request from stdin, then :func:`_child_main`."""
    payload = sys.stdin.buffer.read().decode("utf-8")
    os._exit(_child_main(payload))


def _child_main(payload: str) -> int:
    """The child: protocol lines on the original stdout, everything else to stderr."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # prints from Ray or user code must not corrupt the protocol

    def notify(phase: str, **data: Any) -> None:
        protocol.write(json.dumps({"phase": phase, **data}, default=str) + "\n")
        protocol.flush()

    request = json.loads(payload)
    module_name, _, func_name = request["target"].partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        value = func(notify, **request["kwargs"])
    except ClusterUnavailableError as exc:
        notify("error", message=str(exc), kind=exc.kind)
        return 2
    except Exception as exc:  # noqa: BLE001 - handed to the parent as a message
        notify("error", message=f"{type(exc).__name__}: {exc}", kind="failed")
        return 2
    notify("result", value=value)
    return 0
