"""The Ray-internals boundary: the only package that imports ``ray.*._internal``,
``ray._private``, ``ray._raylet`` or touches a private attribute or method of a Ray object.

One module per Ray area, each stating what it relies on and checking it against the
installed Ray at import (or at first use), raising one :class:`RayVersionError` that names
the Ray version, the missing thing and the range to install:

* :mod:`rayguard._ray.core`: node labels, the GCS address, the CLI's token rule, Train's
  worker-context logger;
* :mod:`rayguard._ray.train`: Train V2's controller callbacks, failure and scaling policy
  classes, the worker list a callback may reorder, ``TorchTrainer``'s private hooks;
* :mod:`rayguard._ray.tune`: Tune's controller, its checkpoint manager, ``StorageContext``,
  ``_TrainingResult``, ``Tuner``'s stored run config;
* :mod:`rayguard._ray.serialization`: cloudpickle's per-process dispatch table and the
  shape of the reducer ``ray.util.register_serializer`` installs.

Version-conditional code lives only here. ``docs/compatibility.md`` lists every internal,
per Ray version, and what degrades without it; ``tests/unit/test_ray_boundary.py`` keeps
private Ray access out of every other module.
"""

from __future__ import annotations

from collections.abc import Iterable

from rayguard.exceptions import RayVersionError

__all__: list[str] = []  # the boundary is internal: nothing here is for users

RAYGUARD_VERSION = "0.1.0"
SUPPORTED_RAY = "2.59-2.60"
"""Ray versions rayguard is tested on (the oldest and the newest run in CI)."""
PIP_RANGE = "ray[train,tune]>=2.59,<2.61"
"""The pip requirement that installs a supported Ray."""


def ray_version() -> str:
    import ray

    return str(getattr(ray, "__version__", "unknown"))


def version_error(thing: str, feature: str = "") -> RayVersionError:
    """The one error for a Ray that lacks ``thing`` (what rayguard feature needs it)."""
    needs = f" (needed by {feature})" if feature else ""
    return RayVersionError(
        f"rayguard {RAYGUARD_VERSION} supports Ray {SUPPORTED_RAY}; this Ray ({ray_version()}) "
        f"lacks {thing}{needs}. Fix: pip install '{PIP_RANGE}'")


def require_attrs(obj: object, names: Iterable[str], owner: str, feature: str = "") -> None:
    """Raise :func:`version_error` naming every attribute of ``names`` that ``obj`` lacks."""
    absent = [n for n in names if not hasattr(obj, n)]
    if absent:
        raise version_error(", ".join(f"{owner}.{n}" for n in absent), feature)
