"""Bit-exact, zero-copy, write-isolated torch tensor serializers for Ray's object store.

See docs/serialization.md. Register in the driver *and* in every worker process::

    from rayguard.serialization import register_tensor_serializers
    register_tensor_serializers()
    ray.init(address="local",  # or your cluster's address
             runtime_env={"worker_process_setup_hook":
                          "rayguard.serialization.register_tensor_serializers"})
"""

from __future__ import annotations

from rayguard.serialization.policy import SerializerPolicy
from rayguard.serialization.register import (
    deregister_tensor_serializers,
    is_registered,
    register_tensor_serializers,
)

__all__ = [
    "SerializerPolicy",
    "deregister_tensor_serializers",
    "is_registered",
    "register_tensor_serializers",
]
