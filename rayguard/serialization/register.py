"""Register the tensor serializers with Ray in this process.

Ray keeps custom serializers in one table per process (``ray.util.register_serializer``
writes ``ray.cloudpickle.CloudPickler.dispatch``), consulted only when *this* process
pickles. The payload names ``codec.decode`` by module path, so a receiving process needs
rayguard importable but no registration of its own; it needs registration only to *send*
tensors the fast way (task returns, ``ray.put`` in a worker, actor results). Hence: register
in the driver and in every worker process.

A process that *receives* a rayguard-encoded tensor also registers itself (once, unless it
called :func:`deregister_tensor_serializers` or ``RAYGUARD_SERIALIZERS=0``): processes that
relay tensors they were given, such as Ray Train's controller passing ``train_loop_config``
to the workers, would otherwise re-send them through torch's default pickling, which
cannot rebuild float8 tensors (``UntypedStorage has no attribute dtype``).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from rayguard.constants import SERIALIZERS_ENV_VAR  # "0": no registration on receipt
from rayguard.serialization.policy import SerializerPolicy, set_policy
from rayguard.serialization.receipt import set_receipt_hook

# Per process, not per worker (rayguard.runtime): Ray's dispatch table is one per process.
_lock = threading.RLock()
_previous: dict[type, Any] = {}  # reducers we replaced (e.g. Ray's zero-copy one)
_opted_out = False  # deregister_tensor_serializers() was called: never auto-register


def _tensor_types() -> tuple[type, ...]:
    import torch

    return (torch.Tensor, torch.nn.Parameter)


def _dispatch() -> Any:
    from rayguard._ray.serialization import dispatch_table

    return dispatch_table()


def register_tensor_serializers(cuda: str = "receiver", zero_copy: bool = True) -> None:
    """Make Ray ship torch tensors through rayguard's serializers in this process.

    Idempotent; calling it again only updates the receive policy. Works before or after
    ``ray.init``. ``cuda``: ``"receiver"`` (CUDA tensors land on this process's current
    device) or ``"cpu"`` (they arrive on CPU). ``zero_copy``: share large received CPU
    tensors copy-on-write (``False``: always copy). Usable as a Ray
    ``worker_process_setup_hook``: ``"rayguard.serialization.register_tensor_serializers"``.
    """
    global _opted_out
    from ray.util import register_serializer

    from rayguard.serialization.codec import decode, encode

    set_policy(SerializerPolicy(cuda=cuda, zero_copy=zero_copy))
    with _lock:
        for cls in _tensor_types():
            current = _dispatch().get(cls)
            if not _is_ours(current):
                _previous[cls] = current
            register_serializer(cls, serializer=encode, deserializer=decode)
        _opted_out = False


def register_if_enabled(enabled: bool = True) -> bool:
    """:func:`register_tensor_serializers` unless ``enabled`` is False (``GuardConfig(
    serializers=False)``) or ``RAYGUARD_SERIALIZERS=0``; returns whether it registered."""
    if not enabled or os.environ.get(SERIALIZERS_ENV_VAR, "1") == "0":
        return False
    register_tensor_serializers()
    return True


def deregister_tensor_serializers() -> None:
    """Undo :func:`register_tensor_serializers` in this process (idempotent).

    Restores whatever reducer was there before (Ray's default pickling, or Ray's zero-copy
    reducer when ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS`` was set) and the default policy.
    This process will then not re-register on receipt either.
    """
    global _opted_out
    from ray.util import deregister_serializer

    with _lock:
        for cls in _tensor_types():
            if not _is_ours(_dispatch().get(cls)):
                continue
            deregister_serializer(cls)
            previous = _previous.pop(cls, None)
            if previous is not None:
                _dispatch()[cls] = previous
        _opted_out = True
    set_policy(None)


def ensure_registered_on_receipt() -> None:
    """Called by the decoder: register in a receiving process that never opted out.

    Writes Ray's per-process dispatch table directly (what ``register_serializer`` does)
    without taking Ray's worker lock, since it runs in the middle of deserialization.
    """
    if _opted_out or os.environ.get(SERIALIZERS_ENV_VAR, "1") == "0":
        return
    if "ray" not in sys.modules:  # plain pickle outside Ray: nothing to register with
        return
    dispatch = _dispatch()
    with _lock:
        for cls in _tensor_types():
            current = dispatch.get(cls)
            if not _is_ours(current):
                _previous[cls] = current
                dispatch[cls] = _reduce


def _reduce(obj: Any) -> tuple:
    """The reducer installed on receipt (the same shape as Ray's wrapper)."""
    from rayguard.serialization.codec import decode, encode

    return decode, (encode(obj),)


def is_registered() -> bool:
    """Whether this process currently sends tensors through rayguard's serializers."""
    import torch

    return _is_ours(_dispatch().get(torch.Tensor))


def _is_ours(reducer: Any) -> bool:
    """Ray wraps our pair in a closure; recognise it by the deserializer it captured."""
    if reducer is None:
        return False
    if reducer is _reduce:
        return True
    from rayguard._ray.serialization import wraps_deserializer
    from rayguard.serialization.codec import decode

    return wraps_deserializer(reducer, decode)


set_receipt_hook(ensure_registered_on_receipt)  # the decoder calls it on first receipt
