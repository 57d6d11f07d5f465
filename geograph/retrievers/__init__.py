"""Retrievers: ``nn.Module`` s over a corpus: the lexical :class:`BM25Retriever` and one per registered
retriever (``geograph.retrievers.DenseRetriever``, ...), read from the method registry on first use."""

from typing import Any

from geograph import registry
from geograph.retrievers.bm25 import BM25Retriever


def _classes() -> dict[str, type]:
    found: dict[str, type] = {"BM25Retriever": BM25Retriever}
    for s in registry.METHODS.values():  # the first registered of two same-named classes is exported
        if s.kind == "retriever":
            found.setdefault(s.module.__name__, s.module)
    return found


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return list(_classes())
    classes = _classes()
    if name in classes:
        return classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_classes()))
