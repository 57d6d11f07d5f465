"""Exact top-``k`` lists by the tiled all-pairs routine, ranked as every self-join ranks a pair.

A pair ``(i, j)`` of rows is ranked by ``transform(s_ij) * target[j]`` (:func:`rank_pairs`;
default: the inner product ``s_ij`` itself): G3's candidate lists rank by the weight ``f(x)``
in the band times the target's density penalty, the k-NN graph by the cosine. The exact scan of
every row (:func:`exact_self_topk`) is the ``index="exact"`` source of a corpus-wide build and
the IVF join's fall-back; the exact lists of some rows (:func:`exact_rows`) are the reference the
join's recall is predicted and measured against (:mod:`geograph.knn.ivf_recall`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from geograph.knn.allpairs import DEFAULT_BLOCK, sort_topk, tiled_pairs
from geograph.knn.policy import SelfTopk, StageClock, Transform
from geograph.knn.select import compiled, new_lists, offer_rows

__all__ = ["rank_pairs", "pair_score", "exact_self_topk", "exact_rows"]


def rank_pairs(s: Tensor, transform: Transform | None, target: Tensor | None, cols: Tensor) -> Tensor:
    """``transform(s) * target[cols]`` (each part optional); ``cols`` index the last dimension or match ``s``.

    Example:
        >>> rank_pairs(torch.tensor([[0.5, 0.2]]), None, torch.tensor([1.0, 2.0, 4.0]), torch.tensor([2, 0]))
        tensor([[2.0000, 0.2000]])
    """
    if transform is not None:
        s = transform(s)
    if target is not None:
        s = s * target[cols]
    return s


def pair_score(transform: Transform | None, target: Tensor | None) -> Callable[[Tensor, Tensor], Tensor] | None:
    """:func:`rank_pairs` as the ``score`` of :func:`~geograph.knn.allpairs.tiled_pairs`
    (``None``: the plain inner product)."""
    return None if transform is None and target is None else (lambda s, cols: rank_pairs(s, transform, target, cols))


def exact_self_topk(
    z: Tensor,
    k: int,
    *,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
    progress: bool | str = False,
) -> SelfTopk:
    """Top-``k`` other rows of every row of ``z`` by the exact tiled scan, ranked by :func:`rank_pairs`.

    Args:
        z: ``(N, D)`` rows.
        k: neighbours per row.
        block: tile side.
        transform, target: how a pair is ranked (:func:`rank_pairs`).
        progress: a progress bar over the tiles (a string names it).

    Returns:
        :class:`~geograph.knn.policy.SelfTopk` with ``(N, k)`` lists best first, ties
        lowest index (``-inf`` / ``-1`` where a row has fewer than ``k`` ranked pairs),
        ``seconds={"exact": ...}`` and no IVF report.

    Example:
        >>> exact_self_topk(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]), 1).indices
        tensor([[1],
                [0],
                [1]])
    """
    clock = StageClock()
    v, i, _ = tiled_pairs(z, z, k, block=block, exclude=True, score=pair_score(transform, target), progress=progress)
    clock("exact")
    return SelfTopk(v, torch.where(torch.isfinite(v), i, torch.full_like(i, -1)), clock.seconds)


def exact_rows(
    z: Tensor,
    rows: Tensor,
    k: int,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
) -> Tensor:
    """Exact top-``k`` ids of ``rows`` against every other row of ``z``, ranked as
    :func:`exact_self_topk` ranks them (``-1`` where a pair is never ranked): the reference
    :func:`~geograph.knn.ivf_recall.sample_recall` compares with.

    Example:
        >>> exact_rows(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]), torch.tensor([2]), 2)
        tensor([[1, 0]])
    """
    q = z[rows]
    if compiled(q):  # the compiled running lists, whatever the number of query tiles
        v, i = _rows_by_heaps(q, z, rows, k, block, transform, target)
    else:
        v, i, _ = tiled_pairs(q, z, k, block=block, exclude=rows, score=pair_score(transform, target))
    return torch.where(torch.isfinite(v), i, torch.full_like(i, -1))


def _rows_by_heaps(
    q: Tensor, z: Tensor, rows: Tensor, k: int, block: int, transform: Transform | None, target: Tensor | None
) -> tuple[Tensor, Tensor]:
    """:func:`~geograph.knn.allpairs.tiled_pairs`' top-``k`` of ``q`` (rows ``rows`` of ``z``, each
    excluded from its own list) with every tile offered to the compiled lists
    (:func:`~geograph.knn.select.offer_rows`), also when ``q`` is one query tile (where
    ``tiled_pairs`` takes the stable top-``k`` of each tile, a few passes over it): the same tiles,
    the same ranking (``transform`` then the ``target`` factor, rounded as :func:`rank_pairs`
    rounds it) and the same tie rule, so the same lists, best first."""
    if not 0 <= k <= z.shape[0] - 1:
        raise ValueError(f"k must be in [0, {z.shape[0] - 1}] ({z.shape[0]} keys minus the excluded one), got {k}")
    best_v, best_i = new_lists(q.shape[0], k, q)
    local = torch.arange(q.shape[0])
    for r0 in range(0, q.shape[0], block):
        qr = q[r0 : r0 + block]
        for c0 in range(0, z.shape[0], block):
            s = qr @ z[c0 : c0 + block].T
            if transform is not None:
                s = transform(s)
            cols = torch.arange(c0, c0 + s.shape[1])
            scale = None if target is None else target[c0 : c0 + s.shape[1]]
            offer_rows(best_v, best_i, local[r0 : r0 + block], s, cols, exclude=rows[r0 : r0 + block], scale=scale)
    return sort_topk(best_v, best_i)
