"""The public names of rayguard.serialization, pinned."""

from __future__ import annotations

import inspect

import rayguard.serialization as ser


def test_public_names() -> None:
    assert sorted(ser.__all__) == ["SerializerPolicy", "deregister_tensor_serializers",
                                   "is_registered", "register_tensor_serializers"]
    for name in ser.__all__:
        assert getattr(ser, name) is not None


def test_register_usable_as_a_setup_hook_and_signatures() -> None:
    sig = inspect.signature(ser.register_tensor_serializers)
    assert all(p.default is not inspect.Parameter.empty for p in sig.parameters.values())
    assert list(sig.parameters) == ["cuda", "zero_copy"]
    assert not inspect.signature(ser.deregister_tensor_serializers).parameters
