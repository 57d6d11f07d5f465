"""geograph: batched PyTorch modules that rerank and retrieve passages by embedding-graph geometry."""

from geograph import _version, functional
from geograph.graphs import CorpusGraph, G3Graph
from geograph.outputs import RerankOutput, RetrievalOutput
from geograph.projection import PoincareProjection
from geograph.ranking import Ranker, Retriever
from geograph.rerankers import Maniscope, RicciFiltration
from geograph.retrievers import BM25Retriever, DenseRetriever, G3Retriever, ISORetriever
from geograph.scorers import CrossEncoderScorer

__version__ = _version.version()

__all__ = [
    "functional",
    "Ranker",
    "Retriever",
    "RerankOutput",
    "RetrievalOutput",
    "Maniscope",
    "RicciFiltration",
    "CrossEncoderScorer",
    "BM25Retriever",
    "DenseRetriever",
    "ISORetriever",
    "G3Graph",
    "G3Retriever",
    "CorpusGraph",
    "PoincareProjection",
    "__version__",
]
