"""Rerankers: ``nn.Module`` s over a padded batch of candidates."""
from geograph.rerankers.maniscope import Maniscope

__all__ = ["Maniscope"]
