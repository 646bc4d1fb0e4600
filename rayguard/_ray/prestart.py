"""Asking a node's raylet for one idle worker process of this worker's own runtime
environment (Ray's ``PrestartWorkers``): the warm spare of :mod:`rayguard._ray.spare`.

Relies on Ray's private gRPC stubs (``node_manager_pb2``, ``init_grpc_channel``,
``ProtoRuntimeEnvInfo``; Ray 2.59 and 2.60); any failure is a spare not asked for.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("rayguard")

KEEP_ALIVE_S = 600
"""Ray keeps an unused prestarted process at least this long; a run that ends without its
clean-up (its driver killed) leaves its spare no longer."""


def prestart(keep_alive_s: int = KEEP_ALIVE_S) -> bool:
    """Ask this node's raylet for one idle worker process of this worker's own runtime
    environment (False: it could not be asked)."""
    try:
        import ray
        from ray._private.grpc_utils import init_grpc_channel
        from ray._private.utils import ProtoRuntimeEnvInfo
        from ray.core.generated import common_pb2
        from ray.core.generated import node_manager_pb2 as pb
        from ray.core.generated import node_manager_pb2_grpc as pb_grpc
        from ray.runtime_env import RuntimeEnvConfig

        context = ray.get_runtime_context()
        me = context.get_node_id()
        node = next(n for n in ray.nodes() if n.get("NodeID") == me)
        info = ProtoRuntimeEnvInfo(serialized_runtime_env=context.get_runtime_env_string())
        info.runtime_env_config.CopyFrom(
            RuntimeEnvConfig.default_config().build_proto_runtime_env_config())
        request = pb.PrestartWorkersRequest(  # type: ignore[attr-defined]
            language=common_pb2.PYTHON,  # type: ignore[attr-defined]
            job_id=bytes.fromhex(context.get_job_id()),
            runtime_env_info=info, keep_alive_duration_secs=int(keep_alive_s), num_workers=1)
        channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
        try:
            pb_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=10)
        finally:
            channel.close()
        return True
    except Exception as exc:  # best effort: a replacement then starts a new process
        logger.debug("rayguard: no spare worker process prestarted: %s", exc)
        return False


__all__ = ["KEEP_ALIVE_S", "prestart"]
