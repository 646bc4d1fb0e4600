"""Checks of NCCL_* and TORCH_NCCL_* variables against the node's interfaces and InfiniBand
devices, NCCL's documented bounds, deprecated/misspelled names, timeouts and debug levels.
Pure functions over a NodeProbe."""

from __future__ import annotations

from collections.abc import Mapping

from rayguard.doctor.findings import Finding, closest
from rayguard.doctor.nccl_names import DEPRECATED, NCCL_KNOWN, TORCH_NCCL_KNOWN
from rayguard.doctor.probe import NodeProbe

MAX_SOCKET_NTHREADS = 16
MAX_SOCKETS_TOTAL = 64  # NCCL_SOCKET_NTHREADS * NCCL_NSOCKS_PERTHREAD
LOOPBACK_PREFIXES = ("lo",)


def match_filter(spec: str, names: list[str]) -> list[str]:
    """Names selected by an NCCL interface/HCA filter: ``eth,ib`` (prefixes), ``=eth0``
    (exact), ``^docker`` (exclude prefixes), ``^=docker0`` (exclude exact). ``mlx5_0:1``
    entries are matched on the part before ``:``."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    parts = [p.strip().split(":")[0] for p in spec.split(",") if p.strip()]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in parts)

    return [n for n in names if hit(n) != exclude]


def _int(env: Mapping[str, str], name: str, lo: int, hi: int | None, out: list[Finding]) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < lo or (hi is not None and value > hi):
        bounds = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        code = "NCCL_SOCKET_THREADS_RANGE" if "SOCK" in name and value is not None else "NCCL_BAD_VALUE"
        out.append(Finding(code, "error", name, f"{name}={raw!r} must be an integer in {bounds}",
                           f"set {name} within {bounds}, or unset it to use the default"))
        return None
    return value


def _ifname(probe: NodeProbe) -> list[Finding]:
    out = []
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        spec = probe.env.get(var)
        if not spec or not probe.interfaces:
            continue
        # Gloo takes exact names, comma-separated; NCCL takes prefixes with ^ and = modifiers.
        chosen = match_filter(spec if var.startswith("NCCL") else "=" + spec, probe.interfaces)
        have = ", ".join(probe.interfaces)
        if not chosen:
            out.append(Finding("NCCL_IFNAME_NO_MATCH", "error", var,
                               f"{var}={spec!r} selects no interface on this node (it has {have}); "
                               "the process group cannot bootstrap", f"set {var} to one of: {have}"))
        elif all(n.startswith(LOOPBACK_PREFIXES) for n in chosen):
            out.append(Finding("NCCL_IFNAME_LOOPBACK_ONLY", "warning", var,
                               f"{var}={spec!r} leaves only loopback ({', '.join(chosen)}): "
                               "ranks on other nodes cannot connect", f"pick a routable one of: {have}"))
    return out


def _ib(probe: NodeProbe) -> list[Finding]:
    out: list[Finding] = []
    disable = _int(probe.env, "NCCL_IB_DISABLE", 0, 1, out)
    has_ib = bool(probe.ib_devices)
    if disable == 0 and not has_ib:
        out.append(Finding("NCCL_IB_NO_DEVICES", "warning", "NCCL_IB_DISABLE",
                           "NCCL_IB_DISABLE=0 but /sys/class/infiniband is empty: NCCL falls back "
                           "to TCP sockets", "unset NCCL_IB_DISABLE on nodes without InfiniBand, "
                           "or check the IB driver (ibv_devices) on this node"))
    if disable == 1 and has_ib:
        out.append(Finding("NCCL_IB_DISABLED_WITH_IB", "warning", "NCCL_IB_DISABLE",
                           f"NCCL_IB_DISABLE=1 although the node has IB devices "
                           f"({', '.join(probe.ib_devices)}): collectives go over TCP",
                           "unset NCCL_IB_DISABLE to use InfiniBand/RoCE"))
    hca = probe.env.get("NCCL_IB_HCA")
    if hca and has_ib and disable != 1 and not match_filter(hca, probe.ib_devices):
        out.append(Finding("NCCL_IB_HCA_NO_MATCH", "error", "NCCL_IB_HCA",
                           f"NCCL_IB_HCA={hca!r} selects none of {', '.join(probe.ib_devices)}",
                           f"set NCCL_IB_HCA to some of: {', '.join(probe.ib_devices)}"))
    return out


def _socket_threads(probe: NodeProbe) -> list[Finding]:
    out: list[Finding] = []
    nthreads = _int(probe.env, "NCCL_SOCKET_NTHREADS", 1, MAX_SOCKET_NTHREADS, out)
    nsocks = _int(probe.env, "NCCL_NSOCKS_PERTHREAD", 1, MAX_SOCKETS_TOTAL, out)
    if nthreads and nsocks and nthreads * nsocks > MAX_SOCKETS_TOTAL:
        out.append(Finding("NCCL_SOCKET_THREADS_PRODUCT", "error", "NCCL_SOCKET_NTHREADS",
                           f"NCCL_SOCKET_NTHREADS={nthreads} x NCCL_NSOCKS_PERTHREAD={nsocks} = "
                           f"{nthreads * nsocks} > {MAX_SOCKETS_TOTAL}, NCCL's limit",
                           "lower one so that the product is <= 64 (e.g. 4 x 4)"))
    ib_used = bool(probe.ib_devices) and probe.env.get("NCCL_IB_DISABLE", "0").strip() != "1"
    if ib_used and ((nthreads or 1) > 1 or (nsocks or 1) > 1):
        out.append(Finding("NCCL_SOCKET_THREADS_WITH_IB", "warning", "NCCL_SOCKET_NTHREADS",
                           "socket threads are tuned while InfiniBand carries the traffic: they "
                           "only burn CPU (and mask a fallback to sockets)",
                           "unset NCCL_SOCKET_NTHREADS/NCCL_NSOCKS_PERTHREAD on IB nodes"))
    return out


def _names(env: Mapping[str, str]) -> list[Finding]:
    out = []
    known = NCCL_KNOWN | TORCH_NCCL_KNOWN
    for name in sorted(env):
        if name in DEPRECATED:
            new = DEPRECATED[name]
            out.append(Finding("NCCL_DEPRECATED_VAR", "warning", name,
                               f"{name} is deprecated (ignored by current NCCL/torch)",
                               f"use {new} instead"))
        elif name.startswith(("NCCL_", "TORCH_NCCL_")) and name not in known:
            guess = closest(name, known)
            hint = f"did you mean {guess}?" if guess else "check the spelling against the NCCL docs"
            out.append(Finding("NCCL_UNKNOWN_VAR", "warning", name,
                               f"{name} is not a variable NCCL or torch reads", hint))
    return out


def _timeouts(env: Mapping[str, str], num_nodes: int) -> list[Finding]:
    out: list[Finding] = []
    ib_timeout = _int(env, "NCCL_IB_TIMEOUT", 1, 31, out)
    small = 18 if num_nodes >= 32 else 14
    if ib_timeout is not None and ib_timeout < small:
        out.append(Finding("NCCL_TIMEOUT_SMALL", "warning", "NCCL_IB_TIMEOUT",
                           f"NCCL_IB_TIMEOUT={ib_timeout} (4.096us x 2^{ib_timeout} = "
                           f"{4.096e-6 * 2**ib_timeout:.3g} s) is small for {num_nodes} node(s): "
                           "congestion turns into 'transport retry counter exceeded'",
                           f"use NCCL_IB_TIMEOUT >= {small} (NCCL's default is 20)"))
    elif ib_timeout is not None and ib_timeout > 24:
        out.append(Finding("NCCL_TIMEOUT_LARGE", "warning", "NCCL_IB_TIMEOUT",
                           f"NCCL_IB_TIMEOUT={ib_timeout} waits {4.096e-6 * 2**ib_timeout:.0f} s "
                           "per retry: a dead link is noticed very late", "use 20-22"))
    _int(env, "NCCL_IB_RETRY_CNT", 0, 7, out)
    beat = _int(env, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", 1, None, out)
    if beat is not None and beat < 60:
        out.append(Finding("NCCL_TIMEOUT_SMALL", "warning", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
                           f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={beat}: the watchdog kills healthy "
                           "ranks that are briefly busy (checkpointing, compiling)",
                           "use >= 60 s (torch's default is 480)"))
    elif beat is not None and beat > 3600:
        out.append(Finding("NCCL_TIMEOUT_LARGE", "warning", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
                           f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={beat}: a hung collective is "
                           "noticed after more than an hour", "use the default (480 s)"))
    return out


def _debug_and_errors(env: Mapping[str, str]) -> list[Finding]:
    out: list[Finding] = []
    level = env.get("NCCL_DEBUG")
    if level is not None:
        up = level.strip().upper()
        if up not in ("VERSION", "WARN", "INFO", "TRACE", ""):
            out.append(Finding("NCCL_BAD_VALUE", "warning", "NCCL_DEBUG",
                               f"NCCL_DEBUG={level!r} is not VERSION, WARN, INFO or TRACE",
                               "use NCCL_DEBUG=WARN"))
        elif up in ("INFO", "TRACE"):
            out.append(Finding("NCCL_DEBUG_ON", "warning" if up == "TRACE" else "info",
                               "NCCL_DEBUG", f"NCCL_DEBUG={up} logs every connection "
                               f"{'and call ' if up == 'TRACE' else ''}on every rank",
                               "set NCCL_DEBUG=WARN once the problem is found"))
    aeh = _int(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING", 0, 3, out)
    bw = _int(env, "TORCH_NCCL_BLOCKING_WAIT", 0, 1, out)
    if aeh == 0 and bw != 1:
        out.append(Finding("NCCL_NO_ERROR_HANDLING", "warning", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                           "TORCH_NCCL_ASYNC_ERROR_HANDLING=0 without TORCH_NCCL_BLOCKING_WAIT=1: "
                           "a timed-out collective hangs instead of raising",
                           "unset TORCH_NCCL_ASYNC_ERROR_HANDLING (Ray Train sets it to 1)"))
    return out


def check_nccl(probe: NodeProbe, *, num_nodes: int | None = None) -> list[Finding]:
    """Every NCCL/TORCH_NCCL check; ``num_nodes`` scales the timeout thresholds."""
    if num_nodes is None:
        try:
            num_nodes = max(1, int(probe.env.get("WORLD_SIZE", "1"))
                            // max(1, int(probe.env.get("LOCAL_WORLD_SIZE", "1"))))
        except ValueError:
            num_nodes = 1
    return (_ifname(probe) + _ib(probe) + _socket_threads(probe) + _names(probe.env)
            + _timeouts(probe.env, num_nodes) + _debug_and_errors(probe.env))
