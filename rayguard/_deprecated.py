"""Names that left a package's public surface still import, with a ``DeprecationWarning``
that names their home, for one minor release (0.2). A package lists them in a table
``{old name: defining module}`` and hands it to :func:`moved`."""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any

REMOVED_IN = "0.3"


def _warn(package: str, name: str, home: str, *, why: str = "internal",
          stacklevel: int = 3) -> None:
    if why == "module":
        text = (f"{package} is deprecated: {package}.{name} is {home}.{name}, and {package} "
                f"goes in rayguard {REMOVED_IN}. Fix: import it from {home}.")
    elif why == "moved":
        text = (f"{package}.{name} moved to {home}.{name}; the old name goes in rayguard "
                f"{REMOVED_IN}. Fix: import it from {home}.")
    else:
        text = (f"{package}.{name} is internal and leaves {package}'s public names in rayguard "
                f"{REMOVED_IN}. Fix: import it from {home} (or use the public API that wraps "
                "it).")
    warnings.warn(text, DeprecationWarning, stacklevel=stacklevel)


def moved(package: str, table: dict[str, str], *, why: str = "internal",
          stacklevel: int = 3) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each name of ``table`` from its defining module, with
    a warning; any other name raises AttributeError as usual. ``why``: ``"internal"`` (the
    name leaves the package's public names), ``"moved"`` (the name moved to a module of its
    own; the old module stays), ``"module"`` (the whole old module is deprecated).
    ``stacklevel``: 4 when the package's own ``__getattr__`` calls this one (the warning
    then points at the user's import)."""

    def __getattr__(name: str) -> Any:
        home = table.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn(package, name, home, why=why, stacklevel=stacklevel)
        return getattr(importlib.import_module(home), name)

    return __getattr__


def shadowing(package: str, func: Callable[..., Any], home: str) -> Callable[..., Any]:
    """``func`` under its old package-level name where a submodule of the same name would
    otherwise take its place (``rayguard.checkpoint.commit``): each call warns."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _warn(package, func.__name__, home)
        return func(*args, **kwargs)

    return wrapper
