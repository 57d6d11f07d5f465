"""Result containers shared by the rerankers and retrievers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class RerankOutput:
    """What a reranker returns for a padded batch of candidates.

    Attributes:
        scores: ``(B, N)`` final scores, ``-inf`` at padding (and at dropped candidates for
            filters that drop).
        order: ``(B, N)`` long, candidate indices by descending score; padding (and dropped
            candidates) last, in index order.
        keep: ``(B, N)`` bool, candidates the method keeps; False at padding.
        geodesic: ``(B, N)`` geodesic distance from the anchor (Maniscope), ``+inf`` where
            unreachable or padding; ``None`` for other methods.
        query_edge_length: ``(B, N)`` flowed length of the query edge (Ricci-Filtration).
        query_edge_curvature: ``(B, N)`` curvature of the query edge (Ricci-Filtration).
    """

    scores: Tensor
    order: Tensor
    keep: Tensor
    geodesic: Optional[Tensor] = None
    query_edge_length: Optional[Tensor] = None
    query_edge_curvature: Optional[Tensor] = None


@dataclass(frozen=True)
class RetrievalOutput:
    """Top-k passages per query from a corpus.

    Attributes:
        indices: ``(B, k)`` long corpus indices, best first.
        scores: ``(B, k)`` the retriever's scores for them.
    """

    indices: Tensor
    scores: Tensor


# pytree nodes, so that torch.export / torch.compile return them as they are
torch.export.register_dataclass(RerankOutput, serialized_type_name="geograph.RerankOutput")
torch.export.register_dataclass(RetrievalOutput, serialized_type_name="geograph.RetrievalOutput")


def order_by_score(scores: Tensor) -> Tensor:
    """Indices ``(B, N)`` that sort ``scores`` descending; ``-inf`` entries last in index order.

    A stable sort, so equal scores keep their input order.

    Example:
        >>> order_by_score(torch.tensor([[0.1, float("-inf"), 0.5]]))
        tensor([[2, 0, 1]])
    """
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices
