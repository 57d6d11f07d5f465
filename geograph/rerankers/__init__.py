"""Rerankers: ``nn.Module`` s over a padded batch of candidates."""

from geograph.rerankers.maniscope import Maniscope
from geograph.rerankers.ricci import RicciFiltration

__all__ = ["Maniscope", "RicciFiltration"]
