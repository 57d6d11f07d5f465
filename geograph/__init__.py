"""geograph: batched PyTorch modules that rerank and retrieve passages by embedding-graph geometry.

Every public name is imported on first use: the methods' modules (``geograph.Maniscope``,
``geograph.ISORetriever``, ...) from the method registry, so a method added as a folder or an
installed plugin is exported like a built-in one, and the rest (``geograph.CorpusGraph``,
``geograph.functional``, ...) from their modules. ``import geograph`` itself loads no torch, so
a process that needs only a part of the package (the command line's ``--help``, the server's
metrics process) does not pay for the rest.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from geograph import _version
from geograph._lazy import lazy_getattr

if TYPE_CHECKING:  # the names below, as the type checker and the reader see them
    from geograph import functional
    from geograph.graphs import CorpusGraph, G3Graph
    from geograph.outputs import RerankOutput, RetrievalOutput
    from geograph.projection import PoincareProjection
    from geograph.ranking import Ranker, Retriever
    from geograph.retrievers.bm25 import BM25Retriever
    from geograph.scorers import CrossEncoderScorer

__version__ = _version.version()

#: the package's own names and the modules that hold them (``functional``: the subpackage itself)
_HOMES = {
    "functional": "geograph.functional",
    "Ranker": "geograph.ranking",
    "Retriever": "geograph.ranking",
    "RerankOutput": "geograph.outputs",
    "RetrievalOutput": "geograph.outputs",
    "CrossEncoderScorer": "geograph.scorers",
    "BM25Retriever": "geograph.retrievers.bm25",
    "G3Graph": "geograph.graphs",
    "CorpusGraph": "geograph.graphs",
    "PoincareProjection": "geograph.projection",
}
_STATIC = [*_HOMES, "__version__"]


def _modules() -> dict[str, Any]:
    registry = importlib.import_module("geograph.registry")
    return registry.method_classes()  # type: ignore[no-any-return]


_own = lazy_getattr(__name__, _HOMES, globals())


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return _own(name)
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # ``from geograph import <submodule>`` asks here before it imports the submodule
        return importlib.import_module(f"{__name__}.{name}")
    registry = importlib.import_module("geograph.registry")
    getattr_, _ = registry.lazy_exports(__name__, _modules, _STATIC, lambda: list(globals()))
    return getattr_(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES) | set(_modules()))
