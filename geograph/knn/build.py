"""Every row's top-``k`` other rows, the candidate source of a corpus-wide build: the exact scan or the IVF join.

:meth:`geograph.CorpusGraph.from_knn` and :meth:`geograph.G3Graph.build` take their lists from
:func:`self_topk`; its ``index`` is resolved by
:func:`~geograph.knn.policy.resolve_index`.
"""

from __future__ import annotations

from torch import Tensor

from geograph.knn.allpairs import DEFAULT_BLOCK
from geograph.knn.exact import exact_self_topk
from geograph.knn.ivf_join import ivf_self_topk
from geograph.knn.policy import IVFOptions, SelfTopk, Transform, resolve_index

__all__ = ["self_topk"]


def self_topk(
    z: Tensor,
    k: int,
    *,
    index: str = "exact",
    ivf: IVFOptions | None = None,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
    progress: bool | str = False,
) -> SelfTopk:
    """Top-``k`` most similar other rows of every row of ``z``: exact by tiles, or by the IVF join.

    ``index`` is ``"exact"`` (:func:`~geograph.knn.exact.exact_self_topk`), ``"ivf"``
    (:func:`~geograph.knn.ivf_join.ivf_self_topk` with the options ``ivf``) or ``"auto"``
    (:func:`~geograph.knn.policy.resolve_index`). Pairs are ranked by
    ``transform(s) * target[j]`` (:func:`~geograph.knn.exact.rank_pairs`; default:
    the inner product).

    Args:
        z: ``(N, D)`` rows (unit for cosine).
        k: neighbours per row.
        index: ``"exact"``, ``"ivf"`` or ``"auto"``.
        ivf: the IVF join's options (used with ``index="ivf"``; default: every default).
        block: tile side.
        transform, target: how a pair is ranked.
        progress: progress bars (a string labels them).

    Returns:
        :class:`~geograph.knn.policy.SelfTopk`: ``(N, k)`` values and indices, best
        first, ties lowest index (``-inf`` / ``-1`` where a row has fewer than ``k``), the
        seconds of each stage and, for IVF, its report.

    Example:
        >>> import torch
        >>> out = self_topk(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]), 1)
        >>> out.indices.flatten().tolist(), list(out.seconds), out.ivf
        ([1, 0, 1], ['exact'], None)
    """
    index = resolve_index(index, z.shape[0], "self top-k")
    if index == "exact":
        return exact_self_topk(z, k, block=block, transform=transform, target=target, progress=progress)
    return ivf_self_topk(z, k, ivf, block=block, transform=transform, target=target, progress=progress)
