"""Retrievers: ``nn.Module`` s over a corpus."""

from geograph.retrievers.bm25 import BM25Retriever
from geograph.retrievers.dense import DenseRetriever
from geograph.retrievers.g3 import G3Retriever
from geograph.retrievers.iso import ISORetriever

__all__ = ["BM25Retriever", "DenseRetriever", "ISORetriever", "G3Retriever"]
