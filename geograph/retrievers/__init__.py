"""Retrievers: ``nn.Module`` s over a corpus."""
from geograph.retrievers.dense import DenseRetriever
from geograph.retrievers.iso import ISORetriever

__all__ = ["DenseRetriever", "ISORetriever"]
