"""Checks of the process-level rendezvous variables (RANK ... MASTER_PORT) and
TORCH_DISTRIBUTED_DEBUG. Pure functions over a :class:`~rayguard.doctor.probe.NodeProbe`."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from rayguard.doctor.findings import Finding
from rayguard.doctor.probe import NodeProbe

INT_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
ENV_INIT_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
MASTER_VARS = ("MASTER_ADDR", "MASTER_PORT")


def parse_ints(env: Mapping[str, str]) -> tuple[dict[str, int], list[Finding]]:
    """The integer rendezvous variables that parse, and a finding for each that does not."""
    values: dict[str, int] = {}
    findings = []
    for name in INT_VARS:
        raw = env.get(name)
        if raw is None:
            continue
        try:
            values[name] = int(raw.strip())
        except ValueError:
            findings.append(Finding("PROC_NOT_INT", "error", name,
                                    f"{name}={raw!r} is not an integer",
                                    f"set {name} to a non-negative integer, or unset it"))
    return values, findings


def _range(v: dict[str, int]) -> list[Finding]:
    out = []

    def bad(subject: str, message: str, fix: str) -> None:
        out.append(Finding("PROC_OUT_OF_RANGE", "error", subject, message, fix))

    for name in ("RANK", "LOCAL_RANK", "NODE_RANK"):
        if v.get(name, 0) < 0:
            bad(name, f"{name}={v[name]} is negative", f"set {name} >= 0")
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        if name in v and v[name] < 1:
            bad(name, f"{name}={v[name]} must be >= 1", f"set {name} to the number of processes")
    pairs = (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    for rank, size in pairs:
        if rank in v and size in v and v[size] >= 1 and not v[rank] < v[size]:
            bad(rank, f"{rank}={v[rank]} is not below {size}={v[size]}: the rendezvous "
                "can never complete (init_process_group hangs or fails)",
                f"ranks run 0..{size}-1; fix the launcher that set {rank}")
    if v.get("LOCAL_WORLD_SIZE", 0) > v.get("WORLD_SIZE", 1 << 30):
        bad("LOCAL_WORLD_SIZE", f"LOCAL_WORLD_SIZE={v['LOCAL_WORLD_SIZE']} exceeds "
            f"WORLD_SIZE={v['WORLD_SIZE']}", "LOCAL_WORLD_SIZE counts this node's processes only")
    return out


def _master(env: Mapping[str, str], v: dict[str, int]) -> list[Finding]:
    out = []
    port = env.get("MASTER_PORT")
    if port is not None:
        if not port.strip().isdigit() or not 0 < int(port) < 65536:
            out.append(Finding("MASTER_PORT_INVALID", "error", "MASTER_PORT",
                               f"MASTER_PORT={port!r} is not a port number in 1..65535",
                               "set MASTER_PORT to a free TCP port on the rank-0 host, e.g. 29500"))
        elif int(port) < 1024:
            out.append(Finding("MASTER_PORT_PRIVILEGED", "warning", "MASTER_PORT",
                               f"MASTER_PORT={port} is a privileged port (< 1024)",
                               "use a port >= 1024, e.g. 29500"))
    addr = env.get("MASTER_ADDR")
    multi_node = v.get("WORLD_SIZE", 1) > v.get("LOCAL_WORLD_SIZE", v.get("WORLD_SIZE", 1))
    if addr and multi_node and _is_loopback(addr):
        out.append(Finding("MASTER_ADDR_LOOPBACK", "error", "MASTER_ADDR",
                           f"MASTER_ADDR={addr} is a loopback address but WORLD_SIZE="
                           f"{v['WORLD_SIZE']} > LOCAL_WORLD_SIZE={v['LOCAL_WORLD_SIZE']} "
                           "(other nodes cannot reach it)",
                           "set MASTER_ADDR to the rank-0 node's routable IP or hostname"))
    return out


def _is_loopback(addr: str) -> bool:
    if addr.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _missing(env: Mapping[str, str], process_group: bool | None) -> list[Finding]:
    """Rendezvous variables that cannot work together, for every rendezvous Ray Train's
    ``TorchConfig`` supports: ``init_method="env"`` (env://: Ray sets MASTER_ADDR/PORT,
    RANK, WORLD_SIZE) and ``init_method="tcp"`` (tcp://host:port in the URL: Ray sets RANK
    and WORLD_SIZE but no MASTER_*). In a process whose process group already exists the
    rendezvous has succeeded, whatever its mode: nothing to report."""
    if process_group:
        return []
    present = [n for n in ENV_INIT_VARS if env.get(n)]
    if not present or ("RANK" not in present and "WORLD_SIZE" not in present):
        return []  # no env:// rendezvous configured (or only MASTER_* for a launcher)
    masters = [n for n in MASTER_VARS if n in present]
    if not masters:
        # RANK/WORLD_SIZE alone: what TorchConfig(init_method="tcp") leaves (the address
        # travels in the tcp:// URL). Valid; only env:// would fail.
        return [Finding("PROC_NO_MASTER", "info", "MASTER_ADDR",
                        f"{', '.join(present)} are set without MASTER_ADDR/MASTER_PORT: right "
                        "for a tcp:// rendezvous (TorchConfig(init_method='tcp')); "
                        "init_process_group(init_method='env://') would fail",
                        "nothing for tcp://; for env:// set MASTER_ADDR and MASTER_PORT too "
                        "(TorchConfig(init_method='env'), the default, sets them)")]
    missing = [n for n in ENV_INIT_VARS if n not in present]
    return [Finding("PROC_MISSING", "error", name,
                    f"{name} is unset while {', '.join(present)} are set: "
                    "init_process_group(init_method='env://') fails",
                    f"set {name} too (or let the launcher/Ray Train set all of them)")
            for name in missing]


def _network(probe: NodeProbe) -> list[Finding]:
    env, out = probe.env, []
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if probe.master_resolved == []:
        out.append(Finding("MASTER_ADDR_UNRESOLVABLE", "error", "MASTER_ADDR",
                           f"MASTER_ADDR={addr!r} does not resolve on this node",
                           "use an IP address, or add the name to DNS or /etc/hosts on every node"))
    if probe.master_connect == "refused":
        out.append(Finding("MASTER_NOT_LISTENING", "info", "MASTER_PORT",
                           f"nothing listens on {addr}:{port} yet (expected before rank 0 starts)",
                           "if training is already running, check that rank 0 uses this port"))
    elif probe.master_connect is not None and probe.master_connect != "ok":
        out.append(Finding("MASTER_UNREACHABLE", "warning", "MASTER_ADDR",
                           f"TCP connect to {addr}:{port} failed: {probe.master_connect}",
                           "check firewalls/security groups between the nodes for this port"))
    return out


def check_torch_debug(env: Mapping[str, str]) -> list[Finding]:
    raw = env.get("TORCH_DISTRIBUTED_DEBUG")
    if raw is None:
        return []
    value = raw.strip().upper()
    if value not in ("OFF", "INFO", "DETAIL"):
        return [Finding("TORCH_DISTRIBUTED_DEBUG_INVALID", "error", "TORCH_DISTRIBUTED_DEBUG",
                        f"TORCH_DISTRIBUTED_DEBUG={raw!r}: torch accepts OFF, INFO or DETAIL",
                        "set TORCH_DISTRIBUTED_DEBUG=OFF (or unset it)")]
    if value == "OFF":
        return []
    return [Finding("TORCH_DISTRIBUTED_DEBUG_ON", "warning" if value == "DETAIL" else "info",
                    "TORCH_DISTRIBUTED_DEBUG", f"TORCH_DISTRIBUTED_DEBUG={value} adds checks to "
                    "every collective (DETAIL: synchronising ones)",
                    "unset it for production runs; keep it for debugging desyncs")]


def check_process_env(probe: NodeProbe) -> list[Finding]:
    """RANK/WORLD_SIZE/LOCAL_*/NODE_RANK/MASTER_* types, ranges, consistency, reachability."""
    values, findings = parse_ints(probe.env)
    return (findings + _range(values) + _missing(probe.env, probe.process_group) + _master(probe.env, values)
            + _network(probe) + check_torch_debug(probe.env))
