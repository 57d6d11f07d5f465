"""One round of NN-descent's local join: each row's list meets its neighbours' neighbours, re-scored exactly.

The IVF join (:func:`~geograph.knn.ivf_join.ivf_self_topk`) misses the pairs whose cells
never meet; the neighbours of a row's neighbours hold most of them, so one round recovers most
of the misses at ``O(N width^2 D)``.

References:
    Dong, Moses, Li, "Efficient k-nearest neighbor graph construction for generic similarity
    measures", WWW 2011 (NN-descent).
"""

from __future__ import annotations

import torch
from torch import Tensor

from geograph.knn.allpairs import DEFAULT_BLOCK, merge_topk, progress_bar
from geograph.knn.exact import rank_pairs
from geograph.knn.policy import Transform

__all__ = ["refine_neighbours"]


def refine_neighbours(
    z: Tensor,
    values: Tensor,
    indices: Tensor,
    *,
    width: int = 8,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
    inplace: bool = False,
    progress: bool | str = False,
) -> tuple[Tensor, Tensor]:
    """One NN-descent round: each row's list meets its best ``width`` neighbours' best ``width`` neighbours,
    re-scored exactly.

    Args:
        z: ``(N, D)`` rows.
        values, indices: ``(N, k)`` current lists (``-1`` = empty slot), best first.
        width: neighbours expanded per row (at most ``k``).
        block: bounds the gathered candidate vectors of one step (``block^2`` numbers).
        transform, target: how a pair is ranked (:func:`~geograph.knn.exact.rank_pairs`).
        inplace: write into ``values`` / ``indices`` (same result; saves one copy of the lists).
        progress: a progress bar over the rows.

    Returns:
        the improved ``(values, indices)``, unordered within a row
        (:func:`~geograph.knn.allpairs.sort_topk` orders them).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]])
        >>> i = torch.tensor([[1, -1], [2, -1], [3, -1], [2, -1]])  # row 0 lacks 2, its neighbour's neighbour
        >>> v = torch.where(i >= 0, (z.unsqueeze(1) * z[i.clamp_min(0)]).sum(-1), torch.tensor(float("-inf")))
        >>> refine_neighbours(z, v, i, width=1)[1][0].sort().values
        tensor([1, 2])
    """
    n, k = indices.shape
    w = min(width, k)
    if inplace:  # the proposals read every row's original head: keep it before rows are rewritten
        head, out_v, out_i = indices[:, :w].clone(), values, indices
    else:
        head, out_v, out_i = indices[:, :w], values.clone(), indices.clone()
    step = max(1, (block * block) // (w * w * z.shape[1]))
    bar = progress_bar(progress, n, "refine")
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        if bar is not None:
            bar.update(r1 - r0)
        h = head[r0:r1]
        cand = head[h.clamp_min(0)].reshape(r1 - r0, w * w)
        cand = cand.masked_fill((h < 0).repeat_interleave(w, 1), -1)
        rows = torch.arange(r0, r1, device=z.device).unsqueeze(1)
        cand = cand.masked_fill(cand == rows, -1)
        sc = torch.einsum("rd,rcd->rc", z[r0:r1], z[cand.clamp_min(0)])
        sc = rank_pairs(sc, transform, target, cand.clamp_min(0)).masked_fill(cand < 0, float("-inf"))
        # one entry per id: the list's own entries first (stable sort by id), later copies dropped
        ids = torch.cat([out_i[r0:r1], cand], 1)
        vv = torch.cat([out_v[r0:r1], sc], 1)
        srt, pos = ids.sort(dim=1, stable=True)
        dup = torch.zeros_like(srt, dtype=torch.bool)
        dup[:, 1:] = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
        vv = vv.gather(1, pos).masked_fill(dup, float("-inf"))
        srt = srt.masked_fill(dup, -1)
        out_v[r0:r1], out_i[r0:r1] = merge_topk(vv, srt, k)
    if bar is not None:
        bar.close()
    return out_v, out_i
