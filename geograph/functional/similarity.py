"""Batched cosine similarity."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from geograph._checks import check_finite_where, check_mask, check_tensor
from geograph.outputs import topk_stable


def normalize(x: Tensor, dim: int = -1) -> Tensor:
    """Scale ``x`` to unit L2 norm along ``dim``; an all-zero vector stays zero.

    The norm is clamped from below by the dtype's ``tiny`` so that padding rows of zeros
    give zeros rather than NaN.
    """
    norm = x.norm(dim=dim, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    return x / norm


def cosine_similarity(
    x: Tensor,
    y: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    y_mask: Optional[Tensor] = None,
) -> Tensor:
    r"""Pairwise cosine similarity of two batches of vectors.

    .. math:: S_{bij} = \frac{\langle x_{bi}, y_{bj} \rangle}{\lVert x_{bi} \rVert \, \lVert y_{bj} \rVert}

    Args:
        x: vectors ``(B, N, D)``.
        y: vectors ``(B, M, D)``; ``None`` means ``y = x`` (and ``y_mask = mask``).
        mask: ``(B, N)`` bool, True = real row of ``x``; ``None`` = all real.
        y_mask: ``(B, M)`` bool for ``y``; ``None`` = all real (or ``mask`` when ``y`` is None).

    Returns:
        ``(B, N, M)`` similarities in ``[-1, 1]``; exactly 0 wherever a row or a column is
        padding, and 0 for a zero vector.

    Raises:
        ValueError: on wrong ranks, mismatched ``B`` or ``D``, a mask of the wrong shape, or
            NaN/inf at an unmasked position.

    Example:
        >>> x = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
        >>> cosine_similarity(x).round(decimals=4)
        tensor([[[1.0000, 0.7071],
                 [0.7071, 1.0000]]])
    """
    check_tensor(x, "x", 3, finite=False)
    mask = check_mask(mask, x.shape[:2], "mask")
    check_finite_where(x, mask, "x")
    if y is None:
        y, y_mask = x, mask
    else:
        check_tensor(y, "y", 3, finite=False)
        if y.shape[0] != x.shape[0] or y.shape[2] != x.shape[2]:
            raise ValueError(
                f"y must have shape (B={x.shape[0]}, M, D={x.shape[2]}), got {tuple(y.shape)}"
            )
        y_mask = check_mask(y_mask, y.shape[:2], "y_mask")
        check_finite_where(y, y_mask, "y")
    xn = normalize(_zero_padding(x, mask))
    yn = xn if y is x else normalize(_zero_padding(y, y_mask))
    sim = torch.bmm(xn, yn.transpose(1, 2)).clamp_(-1.0, 1.0)
    return sim


def _zero_padding(x: Tensor, mask: Optional[Tensor]) -> Tensor:
    if mask is None:
        return x
    return torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))


def chunked_topk(query: Tensor, keys: Tensor, k: int, *, chunk_size: int = 65536,
                 exclude_self: bool = False) -> tuple[Tensor, Tensor]:
    r"""Exact top-``k`` of the inner products ``query @ keys.T``, scanned in chunks.

    .. math:: \mathrm{top}_k\{\langle q_b, x_u \rangle : u\}

    Query rows and key rows are both taken ``chunk_size`` at a time; each key chunk's top-k is
    merged into a running top-k, so memory is ``O(chunk_size * (chunk_size + k))`` whatever
    the number of keys. Ties: lowest key index first, across chunks too
    (:func:`~geograph.outputs.topk_stable`). Normalise both sides first for cosine.

    Args:
        query: ``(B, D)``.
        keys: ``(V, D)`` in ``query``'s dtype and device.
        k: ``1 <= k <= V`` (``V - 1`` with ``exclude_self``).
        chunk_size: rows per matrix product.
        exclude_self: query row ``i`` is key ``i`` (``query`` is ``keys``): never return it.

    Returns:
        ``(values, indices)``, both ``(B, k)``, best first.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
        >>> chunked_topk(x, x, 1, chunk_size=2, exclude_self=True)[1]
        tensor([[2],
                [2],
                [1]])
    """
    v = keys.shape[0]
    out_s, out_i = [], []
    for r0 in range(0, max(query.shape[0], 1), chunk_size):  # B = 0: one empty chunk
        q = query[r0 : r0 + chunk_size]
        best_s = q.new_empty(q.shape[0], 0)
        best_i = torch.empty(q.shape[0], 0, dtype=torch.long, device=q.device)
        for start in range(0, v, chunk_size):
            s = q @ keys[start : start + chunk_size].T
            if exclude_self:
                rows = torch.arange(r0, r0 + q.shape[0], device=q.device).unsqueeze(1)
                cols = torch.arange(start, start + s.shape[1], device=q.device)
                s = s.masked_fill(rows == cols, float("-inf"))
            top_s, top_i = topk_stable(s, min(k, s.shape[1]))
            # earlier chunks first: among equal scores a lower position is a lower key index
            cand_s = torch.cat([best_s, top_s], dim=1)
            cand_i = torch.cat([best_i, top_i + start], dim=1)
            best_s, pos = topk_stable(cand_s, min(k, cand_s.shape[1]))
            best_i = cand_i.gather(1, pos)
        out_s.append(best_s)
        out_i.append(best_i)
    if len(out_s) == 1:
        return out_s[0], out_i[0]
    return torch.cat(out_s), torch.cat(out_i)
