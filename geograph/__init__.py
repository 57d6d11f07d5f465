"""geograph: batched PyTorch modules that rerank and retrieve passages by embedding-graph geometry.

The methods' modules (``geograph.Maniscope``, ``geograph.ISORetriever``, ...) are read from the
method registry on first use, so a method added as a folder or an installed plugin is exported
like a built-in one.
"""

from typing import Any

from geograph import _version, functional
from geograph.graphs import CorpusGraph, G3Graph
from geograph.outputs import RerankOutput, RetrievalOutput
from geograph.projection import PoincareProjection
from geograph.ranking import Ranker, Retriever
from geograph.retrievers.bm25 import BM25Retriever
from geograph.scorers import CrossEncoderScorer

__version__ = _version.version()

_STATIC = [
    "functional",
    "Ranker",
    "Retriever",
    "RerankOutput",
    "RetrievalOutput",
    "CrossEncoderScorer",
    "BM25Retriever",
    "G3Graph",
    "CorpusGraph",
    "PoincareProjection",
    "__version__",
]


def _modules() -> dict[str, Any]:
    from geograph import registry

    return registry.method_classes()


def __getattr__(name: str) -> Any:
    from geograph import registry

    getattr_, _ = registry.lazy_exports(__name__, _modules, _STATIC, lambda: list(globals()))
    return getattr_(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_modules()))
