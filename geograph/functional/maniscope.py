"""Maniscope scores: cosine mixed with geodesic similarity on the candidates' k-NN graph."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from geograph._checks import check_finite_where, check_mask, check_positive_int, check_tensor, check_unit_interval
from geograph.functional.graphs import knn_from_similarity
from geograph.functional.paths import single_source_shortest_paths
from geograph.functional.similarity import cosine_similarity, normalize

__all__ = ["maniscope_scores", "check_candidates"]


def check_candidates(query: Tensor, docs: Tensor, mask: Optional[Tensor]) -> Optional[Tensor]:
    """Validate a padded candidate batch ``query (B, D)``, ``docs (B, N, D)``, ``mask (B, N)``."""
    check_tensor(query, "query", 2)
    check_tensor(docs, "docs", 3, finite=False)
    if docs.shape[0] != query.shape[0] or docs.shape[2] != query.shape[1]:
        raise ValueError(
            f"docs must have shape (B={query.shape[0]}, N, D={query.shape[1]}) to match "
            f"query {tuple(query.shape)}, got {tuple(docs.shape)}"
        )
    if docs.dtype != query.dtype:
        raise ValueError(f"query and docs must share a dtype, got {query.dtype} and {docs.dtype}")
    mask = check_mask(mask, docs.shape[:2], "mask")
    check_finite_where(docs, mask, "docs")
    return mask


def maniscope_scores(
    query: Tensor,
    docs: Tensor,
    mask: Optional[Tensor] = None,
    *,
    k: int = 5,
    alpha: float = 0.3,
    early_stop: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""Maniscope reranking scores for a padded batch of candidates.

    The candidates (not the query) form an undirected k-NN graph by cosine
    (:func:`~geograph.functional.knn_from_similarity`) with edge length ``1 - cos``, clamped to
    ``[eps, 2]`` (``eps`` of the dtype, so that duplicates keep their edge). The anchor ``a``
    is the candidate nearest the query. With ``d`` the exact geodesic distance from ``a``:

    .. math:: \mathrm{score}_i = \alpha \cos(q, c_i) + (1 - \alpha)\, \frac{1}{1 + d(a, c_i)}

    where the geodesic term is 0 for a candidate the anchor cannot reach.

    Args:
        query: ``(B, D)`` query embeddings.
        docs: ``(B, N, D)`` candidate embeddings.
        mask: ``(B, N)`` bool, True = real candidate; ``None`` = all real.
        k: neighbours per candidate (clamps to the number of other real candidates).
        alpha: weight of the cosine term, in ``[0, 1]`` (the paper's :math:`\alpha`).
        early_stop: stop the shortest-path relaxation once it has converged (exact either
            way; ``False`` runs the fixed ``N - 1`` steps, for graph capture).

    Returns:
        ``(scores, geodesic)``, both ``(B, N)``: scores ``-inf`` at padding, geodesic
        distances ``+inf`` where unreachable or padding. An all-padding row gives all
        ``-inf`` scores.

    References:
        Maniscope: reranker optimization via geodesic distances on k-NN manifolds
        (../shared/papers/maniscope.txt).

    Example:
        >>> q = torch.tensor([[1.0, 0.0]])
        >>> docs = torch.tensor([[[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]])
        >>> scores, geo = maniscope_scores(q, docs, k=1, alpha=0.5)
        >>> scores.round(decimals=4), geo.round(decimals=4)
        (tensor([[1.0000, 0.8167, 0.3125]]), tensor([[0.0000, 0.2000, 0.6000]]))
    """
    check_positive_int(k, "k")
    alpha = check_unit_interval(alpha, "alpha")
    mask = check_candidates(query, docs, mask)
    b, n, _ = docs.shape
    if mask is None:
        mask = torch.ones(b, n, dtype=torch.bool, device=docs.device)
    neg_inf = torch.full((), float("-inf"), dtype=docs.dtype, device=docs.device)
    sim = cosine_similarity(docs, mask=mask)
    docs_n = normalize(torch.where(mask.unsqueeze(-1), docs, torch.zeros((), dtype=docs.dtype, device=docs.device)))
    q_cos = torch.bmm(docs_n, normalize(query).unsqueeze(-1)).squeeze(-1).clamp(-1.0, 1.0)
    adj = knn_from_similarity(sim, k, mask)
    eps = torch.finfo(docs.dtype).eps
    lengths = (1.0 - sim).clamp(eps, 2.0)
    anchor = q_cos.masked_fill(~mask, float("-inf")).argmax(dim=-1)
    geo = single_source_shortest_paths(lengths, adj, anchor, mask, early_stop=early_stop)
    sim_geo = 1.0 / (1.0 + geo)  # +inf -> exactly 0
    scores = alpha * q_cos + (1.0 - alpha) * sim_geo
    return torch.where(mask, scores, neg_inf), geo
