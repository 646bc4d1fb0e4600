"""Ray's custom-serializer table, as rayguard's tensor serializers use it.

Relies on (checked at first use; present in Ray 2.59 and 2.60):

* ``ray.cloudpickle.CloudPickler.dispatch``: the per-process table ``ray.util.register_serializer``
  writes; rayguard reads it (what is registered now) and writes it directly where Ray's lock
  cannot be taken (in the middle of deserialization) or to put back the reducer it replaced;
* the reducer ``register_serializer`` installs is a closure over the deserializer it was
  given (how rayguard recognises its own registration).
"""

from __future__ import annotations

from typing import Any

from rayguard._ray import require_attrs


def dispatch_table() -> Any:
    """This process's ``{type: reducer}`` table that Ray's pickler consults."""
    import ray.cloudpickle

    require_attrs(ray.cloudpickle.CloudPickler, ("dispatch",), "ray.cloudpickle.CloudPickler",
                  "rayguard's tensor serializers")
    return ray.cloudpickle.CloudPickler.dispatch


def wraps_deserializer(reducer: Any, deserializer: Any) -> bool:
    """Whether ``reducer`` is Ray's wrapper around ``deserializer`` (its closure holds it)."""
    cells = getattr(reducer, "__closure__", None) or ()
    return any(getattr(c, "cell_contents", None) is deserializer for c in cells)
