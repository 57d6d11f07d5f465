"""Batched ranking metrics over padded relevance tensors.

Every metric takes

* ``gains (B, K)``: the graded relevance of the retrieved items of each query, in rank
  order (0 = not relevant; pad short runs with 0);
* ``relevant (B, R)``: the graded relevance of every judged-relevant item of each query in
  any order (pad with 0), needed for recall, nDCG and HitAll.

An item counts as relevant when its gain is > 0, as in trec_eval. nDCG uses linear gains
and the ``log2(rank + 1)`` discount (trec_eval's ``ndcg_cut``, which BEIR reports). A query
with no relevant item scores 0 on every metric. :func:`geograph.evaluation.relevance_tensors`
builds both tensors from a run and qrels.

:func:`hit_answer_at_k` instead takes ``contains (B, K)`` bool: whether the passage at each
rank contains an answer string (:func:`geograph.evaluation.answer_hits` builds it from texts).
"""

from __future__ import annotations

import torch
from torch import Tensor

from geograph._checks import check_positive_int

__all__ = ["recall_at_k", "precision_at_k", "ndcg_at_k", "mrr_at_k", "hit_all_at_k", "hit_answer_at_k"]


def _check(gains: Tensor, relevant: Tensor | None, k: int) -> None:
    check_positive_int(k, "k")
    if gains.dim() != 2:
        raise ValueError(f"gains must be (B, K), got shape {tuple(gains.shape)}")
    if relevant is not None and (relevant.dim() != 2 or relevant.shape[0] != gains.shape[0]):
        raise ValueError(f"relevant must be (B={gains.shape[0]}, R), got shape {tuple(relevant.shape)}")


def _hits(gains: Tensor, k: int) -> Tensor:
    return (gains[:, :k] > 0).to(torch.float64)


def precision_at_k(gains: Tensor, k: int) -> Tensor:
    r"""Precision@k, :math:`|\mathrm{rel} \cap \mathrm{top}_k| / k` (trec_eval ``P_k``), ``(B,)`` float64.

    Example:
        >>> precision_at_k(torch.tensor([[1.0, 0.0, 2.0]]), k=2)
        tensor([0.5000], dtype=torch.float64)
    """
    _check(gains, None, k)
    return _hits(gains, k).sum(-1) / k


def recall_at_k(gains: Tensor, relevant: Tensor, k: int) -> Tensor:
    r"""Recall@k, :math:`|\mathrm{rel} \cap \mathrm{top}_k| / |\mathrm{rel}|`, ``(B,)`` float64.

    Example:
        >>> recall_at_k(torch.tensor([[1.0, 0.0, 2.0]]), torch.tensor([[1.0, 2.0, 1.0]]), k=2)
        tensor([0.3333], dtype=torch.float64)
    """
    _check(gains, relevant, k)
    n_rel = (relevant > 0).sum(-1).to(torch.float64)
    return _hits(gains, k).sum(-1) / n_rel.clamp_min(1.0)


def hit_all_at_k(gains: Tensor, relevant: Tensor, k: int) -> Tensor:
    """HitAll@k: 1 when every relevant item is in the top k, else 0, ``(B,)`` float64.

    Example:
        >>> hit_all_at_k(torch.tensor([[1.0, 0.0, 2.0]]), torch.tensor([[1.0, 2.0]]), k=3)
        tensor([1.], dtype=torch.float64)
    """
    _check(gains, relevant, k)
    n_rel = (relevant > 0).sum(-1)
    return ((_hits(gains, k).sum(-1) == n_rel) & (n_rel > 0)).to(torch.float64)


def hit_answer_at_k(contains: Tensor, k: int) -> Tensor:
    r"""HitAns@k: 1 when some passage among the top k contains an answer string, else 0, ``(B,)`` float64.

    .. math:: \mathrm{HitAns@k} = \max_{r \le k} \mathbb{1}[\text{passage}_r \ni \text{answer}]

    Args:
        contains: ``(B, K)`` bool (or 0/1) per rank, best first; pad short runs with False.
        k: cut-off.

    Returns:
        ``(B,)`` float64 in {0, 1}.

    Example:
        >>> hit_answer_at_k(torch.tensor([[False, False, True], [True, False, False]]), k=2)
        tensor([0., 1.], dtype=torch.float64)
    """
    _check(contains, None, k)
    return (contains[:, :k] != 0).any(-1).to(torch.float64)


def mrr_at_k(gains: Tensor, k: int) -> Tensor:
    r"""Reciprocal rank of the first relevant item within the top k (0 if none), ``(B,)`` float64.

    Example:
        >>> mrr_at_k(torch.tensor([[0.0, 0.0, 1.0]]), k=3)
        tensor([0.3333], dtype=torch.float64)
    """
    _check(gains, None, k)
    hits = _hits(gains, k)
    if hits.shape[1] == 0:
        return hits.new_zeros(hits.shape[0])
    ranks = torch.arange(1, hits.shape[1] + 1, dtype=torch.float64, device=gains.device)
    return (hits / ranks).amax(dim=-1).where(hits.any(-1), hits.new_zeros(()))


def ndcg_at_k(gains: Tensor, relevant: Tensor, k: int) -> Tensor:
    r"""nDCG@k with linear gains, :math:`\sum_{r \le k} g_r / \log_2(r + 1)` over the ideal DCG.

    Example:
        >>> ndcg_at_k(torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0]]), k=2).round(decimals=4)
        tensor([0.6309], dtype=torch.float64)
    """
    _check(gains, relevant, k)

    def dcg(g: Tensor) -> Tensor:
        g = g[:, :k].to(torch.float64).clamp_min(0.0)
        disc = torch.log2(torch.arange(2, g.shape[1] + 2, dtype=torch.float64, device=g.device))
        return (g / disc).sum(-1)

    ideal = dcg(relevant.sort(dim=-1, descending=True).values)
    return torch.where(ideal > 0, dcg(gains) / ideal.clamp_min(1e-300), ideal.new_zeros(()))
