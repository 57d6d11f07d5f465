"""Retrievers: ``nn.Module`` s over a corpus: the lexical :class:`BM25Retriever` and one per registered
retriever (``geograph.retrievers.DenseRetriever``, ...), read from the method registry on first use."""

from geograph import registry
from geograph.retrievers.bm25 import BM25Retriever

__getattr__, __dir__ = registry.lazy_exports(
    __name__,
    lambda: {"BM25Retriever": BM25Retriever, **registry.method_classes("retriever")},
    [],
    lambda: list(globals()),
)
