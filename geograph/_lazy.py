"""Names a package exports but imports on first use, so that importing the package loads nothing
heavy (:mod:`geograph`, :mod:`geograph.data` and :mod:`geograph.serve` export this way)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, homes: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name of ``homes`` is imported from the module
    ``homes[name]`` on first use (the module itself where that is ``package.name``) and kept in
    ``namespace`` (the package's globals: later lookups do not come here); any other name raises
    ``AttributeError``, so ``from package import submodule`` still imports the submodule.

    Example:
        >>> names = {}
        >>> get = lazy_getattr("pkg", {"sqrt": "math"}, names)
        >>> get("sqrt")(4.0), "sqrt" in names
        (2.0, True)
    """

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    return getattr_
