"""Maniscope scores: cosine mixed with geodesic similarity on the candidates' k-NN graph."""

from __future__ import annotations

import torch
from torch import Tensor

from geograph._checks import check_candidates, check_positive_int, check_unit_interval, tracing
from geograph.ops.adjacency import knn_lists
from geograph.ops.similarity import normalize

__all__ = ["maniscope_scores"]


def maniscope_scores(
    query: Tensor,
    docs: Tensor,
    mask: Tensor | None = None,
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
            way; ``False`` runs the fixed ``N - 1`` steps, and so does a traced call under
            ``torch.compile`` / ``torch.export``, where the check would be a host sync).

    Returns:
        ``(scores, geodesic)``, both ``(B, N)``: scores ``-inf`` at padding, geodesic
        distances ``+inf`` where unreachable or padding. An all-padding row gives all
        ``-inf`` scores; ``N = 0`` (no candidates) gives two empty ``(B, 0)`` tensors.

    References:
        W. G. Gong, Reranker Optimization via Geodesic Distances on k-NN Manifolds (Maniscope),
        arXiv:2602.15860, TMLR 2026.

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
    if n == 0:
        return docs.new_zeros(b, 0), docs.new_zeros(b, 0)
    if mask is not None:
        docs = torch.where(mask.unsqueeze(-1), docs, torch.zeros((), dtype=docs.dtype, device=docs.device))
    # Inputs are validated above; the internals below skip the public ops' re-validation.
    docs_n = normalize(docs)
    sim = torch.bmm(docs_n, docs_n.transpose(1, 2)).clamp_(-1.0, 1.0)
    q_cos = torch.bmm(docs_n, normalize(query).unsqueeze(-1)).squeeze(-1).clamp_(-1.0, 1.0)
    eps = torch.finfo(docs.dtype).eps
    anchor = (q_cos if mask is None else q_cos.masked_fill(~mask, float("-inf"))).argmax(dim=-1)
    at_source = torch.arange(n, device=docs.device).unsqueeze(0) == anchor.unsqueeze(1)
    if mask is not None:
        at_source = at_source & mask
    kk = min(k, n - 1)
    if kk == 0:
        inf = torch.full((), float("inf"), dtype=docs.dtype, device=docs.device)
        geo = torch.where(at_source, torch.zeros((), dtype=docs.dtype, device=docs.device), inf)
    else:
        values, idx = knn_lists(sim, kk, mask)
        inf = torch.full((), float("inf"), dtype=docs.dtype, device=docs.device)
        w = torch.where(values > float("-inf"), (1.0 - values).clamp(eps, 2.0), inf)
        geo = _relax_knn(idx, w, at_source, n - 1, early_stop, 4)
    sim_geo = 1.0 / (1.0 + geo)  # +inf -> exactly 0
    scores = alpha * q_cos + (1.0 - alpha) * sim_geo
    if mask is None:
        return scores, geo
    return torch.where(mask, scores, torch.full((), float("-inf"), dtype=docs.dtype, device=docs.device)), geo


def _relax_knn(idx: Tensor, w: Tensor, at_source: Tensor, steps: int, early_stop: bool, check_every: int) -> Tensor:
    """Bellman-Ford on the union of directed k-NN links (from ``knn_lists``), ``O(B N k)`` a step.

    A link ``i -> idx[i, m]`` of length ``w[i, m]`` is an undirected edge: it relaxes ``i``
    from its neighbour (gather) and the neighbour from ``i`` (scatter with ``amin``). The
    result equals the dense relaxation on the symmetric adjacency, at a fraction of the work.
    """
    b, n, kk = idx.shape
    flat = idx.reshape(b, n * kk)
    dist = torch.where(
        at_source,
        torch.zeros((), dtype=w.dtype, device=w.device),
        torch.full((), float("inf"), dtype=w.dtype, device=w.device),
    )
    prev = dist
    for t in range(steps):
        pull = (dist.gather(1, flat).view(b, n, kk) + w).amin(dim=-1)
        push = dist.scatter_reduce(1, flat, (dist.unsqueeze(-1) + w).reshape(b, n * kk), reduce="amin")
        dist = torch.minimum(torch.minimum(dist, pull), push)
        if early_stop and not tracing() and (t + 1) % check_every == 0:
            if torch.equal(dist, prev):
                break
            prev = dist
    return dist
