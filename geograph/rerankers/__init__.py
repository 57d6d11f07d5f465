"""Rerankers: ``nn.Module`` s over a padded batch of candidates, one per registered reranker
(``geograph.rerankers.Maniscope``, ...), read from the method registry on first use."""

from geograph import registry

__getattr__, __dir__ = registry.lazy_exports(
    __name__, lambda: registry.method_classes("reranker"), [], lambda: list(globals())
)
