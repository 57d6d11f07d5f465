"""Result containers shared by the rerankers and retrievers."""

from __future__ import annotations

from dataclasses import dataclass

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
    geodesic: Tensor | None = None
    query_edge_length: Tensor | None = None
    query_edge_curvature: Tensor | None = None


@dataclass(frozen=True)
class RetrievalOutput:
    """Top-k passages per query from a corpus.

    Attributes:
        indices: ``(B, k)`` long corpus indices, best first.
        scores: ``(B, k)`` the retriever's scores for them.
    """

    indices: Tensor
    scores: Tensor


@dataclass(frozen=True)
class LocalSubgraph:
    """ISO-RAG's padded query-local subgraphs of one batch
    (:func:`~geograph.functional.iso_local_subgraph`, :meth:`geograph.ISORetriever.local`).

    Attributes:
        nodes: ``(B, n)`` long corpus ids, by dense score; ``-1`` at padding.
        mask: ``(B, n)`` bool, True = real node.
        dense: ``(B, n)`` cosine to the query (``-inf`` at padding).
        adj: ``(B, n, n)`` bool kept edges among the nodes.
        personalization: ``(B, n)`` ``softmax(tau * s)`` over the seeds, 0 elsewhere.
    """

    nodes: Tensor
    mask: Tensor
    dense: Tensor
    adj: Tensor
    personalization: Tensor


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


def topk_stable(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries along the last dimension; equal scores: lowest index first.

    The tie rule of every geograph ranking (``numpy.argsort(-x, kind="stable")[:k]``), which
    :func:`torch.topk` does not promise. One ``topk``, then the entries equal to the ``k``-th
    value are re-chosen as the lowest-index ones (a second ``topk``, of minus the position over
    the tied entries) and the ``k`` winners are ordered by (value, index): about three passes
    over the scores, no full sort, no host synchronisation. ``-inf`` entries are ordinary
    values (they tie with each other). No NaN (callers validate).

    Args:
        scores: ``(..., N)`` floating.
        k: ``0 <= k <= N``.

    Returns:
        ``(values, indices)``, both ``(..., k)``, by descending value, ties by ascending index.

    Example:
        >>> topk_stable(torch.tensor([[0.5, 0.9, 0.5, 0.9, 0.1]]), 3)
        (tensor([[0.9000, 0.9000, 0.5000]]), tensor([[1, 3, 0]]))
    """
    if k == 0:
        return scores[..., :0], torch.zeros(scores.shape[:-1] + (0,), dtype=torch.long, device=scores.device)
    vals, idx = scores.topk(k, dim=-1)  # sorted: the entries above the k-th value come first
    thr = vals[..., -1:]
    above = (vals > thr).sum(-1, keepdim=True)
    n = scores.shape[-1]
    # the k lowest positions holding the k-th value: a topk of -position over the tied entries
    # (positions are exact in float32 below 2^24)
    key_dtype = torch.float32 if n <= 1 << 24 else torch.float64
    neg_pos = torch.arange(0, -n, -1, dtype=key_dtype, device=scores.device)
    first_tied = torch.where(scores == thr, neg_pos, float("-inf")).topk(k, dim=-1).values.neg().long()
    slot = torch.arange(k, device=scores.device)
    chosen = torch.where(slot < above, idx, first_tied.gather(-1, (slot - above).clamp_min(0)))
    chosen = torch.sort(chosen, dim=-1).values  # by index, then stably by value
    vals = scores.gather(-1, chosen)
    order = torch.sort(vals, dim=-1, descending=True, stable=True).indices
    return vals.gather(-1, order), chosen.gather(-1, order)


def topk_by_key(scores: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Positions of the ``k`` largest ``scores`` along the last dimension, ties by lowest ``ids``.

    For rankings whose positions are not corpus ids (a local subgraph, a candidate list):
    the same tie rule as :func:`topk_stable`, on the ids. Two stable sorts of the last
    dimension (meant for short lists).

    Returns:
        ``(values, positions)``, both ``(..., k)``.

    Example:
        >>> topk_by_key(torch.tensor([[0.5, 0.9, 0.9]]), torch.tensor([[7, 9, 4]]), 2)
        (tensor([[0.9000, 0.9000]]), tensor([[2, 1]]))
    """
    by_id = torch.sort(ids, dim=-1, stable=True).indices
    order = torch.sort(scores.gather(-1, by_id), dim=-1, descending=True, stable=True).indices[..., :k]
    pos = by_id.gather(-1, order)
    return scores.gather(-1, pos), pos


def true_first(mask: Tensor, size: int) -> Tensor:
    """Positions ``(..., size)`` along the last dimension: the True entries of ``mask`` first,
    then the False ones, each in index order (a stable sort of ``~mask``; compacts a bool
    selection to the front without a data-dependent shape).

    Example:
        >>> true_first(torch.tensor([[False, True, False, True]]), 3)
        tensor([[1, 3, 0]])
    """
    return torch.sort((~mask).to(torch.int8), dim=-1, stable=True).indices[..., :size]
