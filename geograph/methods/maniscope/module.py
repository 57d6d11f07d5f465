"""Maniscope: geodesic reranking on the candidates' k-NN graph."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from geograph._checks import check_bool, check_positive_int, check_unit_interval
from geograph.methods.maniscope.functional import maniscope_scores
from geograph.outputs import RerankOutput, order_by_score


class Maniscope(nn.Module):
    r"""Rerank top-M candidates by cosine mixed with geodesic similarity on their k-NN graph.

    .. math:: \mathrm{score}_i = \alpha \cos(q, c_i) + (1 - \alpha) \frac{1}{1 + d_{geo}(a, c_i)}

    with ``a`` the candidate nearest the query and ``d_geo`` the exact shortest-path distance
    on the undirected k-NN graph of the candidates (lengths ``1 - cos``). See
    :func:`geograph.functional.maniscope_scores` for the details. Every real candidate is
    kept; only the order changes.

    Compilation: ``torch.compile(model, fullgraph=True)`` and ``torch.export.export`` work
    (tested on padded batches): no graph break and no host synchronisation in the forward.
    A traced call skips the NaN checks (shape checks remain) and runs the fixed ``N - 1``
    relaxation steps instead of the early stop.

    Args:
        k: neighbours per candidate in the k-NN graph (clamps to ``N - 1``).
        alpha: weight of the cosine term. 0.3 is the value of the authors' published
            benchmark scripts (their engine's UI defaults to 0.5).
        early_stop: let the shortest-path relaxation stop once converged (same result; set
            ``False`` for a fixed ``N - 1`` steps with no host sync, e.g. under CUDA graphs).

    Shape:
        - query ``(B, D)``, docs ``(B, N, D)``, mask ``(B, N)`` bool (True = real).
        - output :class:`~geograph.RerankOutput` with ``scores``, ``order``, ``keep`` and
          ``geodesic``, all ``(B, N)``.

    References:
        W. G. Gong, Reranker Optimization via Geodesic Distances on k-NN Manifolds (Maniscope),
        arXiv:2602.15860, TMLR 2026.

    Example:
        >>> q = torch.tensor([[1.0, 0.0]])
        >>> docs = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [0.8, 0.6]]])
        >>> Maniscope(k=1, alpha=0.5)(q, docs).order
        tensor([[1, 2, 0]])
    """

    def __init__(self, *, k: int = 5, alpha: float = 0.3, early_stop: bool = True) -> None:
        super().__init__()
        self.k = check_positive_int(k, "k")
        self.alpha = check_unit_interval(alpha, "alpha")
        self.early_stop = check_bool(early_stop, "early_stop")

    def forward(self, query: Tensor, docs: Tensor, mask: Tensor | None = None) -> RerankOutput:
        scores, geo = maniscope_scores(query, docs, mask, k=self.k, alpha=self.alpha, early_stop=self.early_stop)
        keep = torch.isfinite(scores)
        return RerankOutput(scores=scores, order=order_by_score(scores), keep=keep, geodesic=geo)

    def extra_repr(self) -> str:
        return f"k={self.k}, alpha={self.alpha}"
