"""Ray internals rayguard relies on outside its older modules (the console's report filter,
the CLI's token rule), kept in one place so that they are easy to find and to check against
a new Ray."""

from __future__ import annotations

import logging


def train_context_logger() -> logging.Logger:
    """The logger of Ray Train's worker context module, which logs every report at INFO.
    Ray 2.60 names it by the module's file path."""
    from ray.train.v2._internal.execution import context

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
