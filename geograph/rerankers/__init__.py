"""Rerankers: ``nn.Module`` s over a padded batch of candidates, one per registered reranker
(``geograph.rerankers.Maniscope``, ...), read from the method registry on first use."""

from typing import Any

from geograph import registry


def _classes() -> dict[str, type]:
    return {s.module.__name__: s.module for s in registry.METHODS.values() if s.kind == "reranker"}


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return list(_classes())
    classes = _classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_classes()))
