"""Whose Ray cluster is it? ``--address auto`` joins whatever cluster Ray finds on this
machine (``RAY_ADDRESS``, the latest ``ray start``, any GCS process), possibly another
user's; with Ray's token rule it would also send this user's token there. The owner of a
local cluster is the user whose process listens on its GCS port, read from the kernel's
socket tables (``/proc/net/tcp``, ``/proc/net/tcp6``: the ``uid`` column), which show
every user's sockets. Linux only; elsewhere, or for a remote address, the owner is unknown
(``None``)."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable

SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"


def _split(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _hex_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as the kernel prints it: little-endian 32-bit words in hex."""
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listener_uid(address: str, tables: Iterable[str] = SOCKET_TABLES) -> int | None:
    """The uid of the process listening on ``address`` (``ip:port``) on this machine, or
    None when no local socket listens there (a remote cluster) or it cannot be told."""
    parts = _split(address)
    if parts is None:
        return None
    try:
        wanted = ipaddress.ip_address(parts[0])
    except ValueError:
        return None  # a host name: not resolved here (no DNS wait)
    if not _is_local(wanted):
        return None  # another machine's cluster: its sockets are not in these tables
    for table in tables:
        try:
            with open(table, encoding="ascii", errors="replace") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            uid = _listening_uid(row.split(), wanted, parts[1])
            if uid is not None:
                return uid
    return None


def _listening_uid(cols: list[str], wanted: ipaddress.IPv4Address | ipaddress.IPv6Address,
                   port: int) -> int | None:
    if len(cols) < 8 or cols[3] != _LISTEN:
        return None
    ip_hex, _, port_hex = cols[1].partition(":")
    try:
        if int(port_hex, 16) != port or not cols[7].isdigit():
            return None
    except ValueError:
        return None
    ip = _hex_ip(ip_hex)
    if ip is None:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    if ip == wanted or mapped == wanted or ip.is_unspecified:
        return int(cols[7])
    return None


def _is_local(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``ip`` is one of this machine's addresses (it can be bound to)."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def foreign_owner(address: str) -> int | None:
    """The uid owning the local cluster at ``address`` when it is not this user; else None."""
    uid = listener_uid(address)
    return uid if uid is not None and uid != os.getuid() else None
