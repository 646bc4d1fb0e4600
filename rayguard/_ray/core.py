"""Ray core internals: node labels, the GCS address, the CLI's token rule, and the logger of
Train's worker context (the console's report filter).

Relies on (each checked at first use; all present in Ray 2.59 and 2.60):

* ``ray._raylet.RAY_NODE_ID_KEY``: the label every node carries with its node id, used to
  place the run's coordinator on the driver's node (:func:`node_id_label`);
* ``ray._private.services.canonicalize_bootstrap_address``: what ``ray.init("auto")``
  resolves, for ``rayguard doctor --address auto`` (:func:`resolve_auto_address`);
* ``ray._private.authentication.authentication_token_setup
  .maybe_enable_token_auth_if_token_available``: optional (absent before Ray 2.59; the CLI
  then keeps ``ray.init``'s own behaviour);
* ``ray.train.v2._internal.execution.context.logger``: the logger of Train's worker context
  module, which logs every report at INFO.
"""

from __future__ import annotations

import logging
from typing import Any

from rayguard._ray import version_error


def node_id_label() -> str:
    """The label key whose value is a node's id (``label_selector={key: node_id}``)."""
    try:
        from ray._raylet import RAY_NODE_ID_KEY  # type: ignore[attr-defined]
    except ImportError as exc:
        raise version_error("ray._raylet.RAY_NODE_ID_KEY", "the run coordinator") from exc
    return str(RAY_NODE_ID_KEY)


def resolve_auto_address() -> str | None:
    """The cluster ``ray.init("auto")`` would join (RAY_ADDRESS, else the latest local
    cluster); raises ``ConnectionError`` when there is none."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError as exc:
        raise version_error("ray._private.services.canonicalize_bootstrap_address",
                            "rayguard doctor --address auto") from exc
    return canonicalize_bootstrap_address("auto")


def train_context_logger() -> logging.Logger:
    """The logger of Ray Train's worker context module, which logs every report at INFO.
    Ray 2.60 names it by the module's file path."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError as exc:
        raise version_error("ray.train.v2._internal.execution.context",
                            "the console's report filter") from exc
    return getattr(context, "logger", None) or logging.getLogger(context.__file__)


def enable_default_token_auth() -> None:
    """What a bare ``ray.init()`` does for a cluster it finds itself (Ray 2.60,
    ``ray/_private/worker.py``): send this user's token (``~/.ray/auth_token``) when
    RAY_AUTH_MODE is unset. A Ray without this helper keeps ``ray.init``'s own behaviour."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def actor_id(handle: Any) -> str:
    """The id of the actor behind ``handle`` (hex), as ``get_runtime_context().get_actor_id()``
    gives it inside that actor (Ray has no public accessor on a handle)."""
    return handle._actor_id.hex()


def alive_node_resources() -> dict[str, dict[str, float]]:
    """Total resources of every alive node, by node id."""
    import ray

    return {n["NodeID"]: dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")}
