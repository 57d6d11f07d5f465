"""Retrievers: ``nn.Module`` s over a corpus."""
from geograph.retrievers.dense import DenseRetriever

__all__ = ["DenseRetriever"]
