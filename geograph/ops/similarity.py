"""Batched cosine similarity."""

from __future__ import annotations

import torch
from torch import Tensor

from geograph._checks import check_finite_where, check_mask, check_tensor


def normalize(x: Tensor, dim: int = -1) -> Tensor:
    """Scale ``x`` to unit L2 norm along ``dim``; an all-zero vector stays zero.

    The norm is clamped from below by the dtype's ``tiny`` so that padding rows of zeros
    give zeros rather than NaN.
    """
    norm = x.norm(dim=dim, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    out: Tensor = x / norm
    return out


#: rows whose norms are all this close to 1 count as unit: :func:`unit_rows` uses them as they are
UNIT_TOL = 1e-6


def unit_rows(x: Tensor) -> Tensor:
    """``x`` itself when every row already has unit norm (within :data:`UNIT_TOL`), else
    :func:`normalize` ``(x)``: at corpus scale a normalised copy of unit rows is one more
    ``(N, D)`` matrix at the peak for nothing."""
    if x.numel() and bool(((x.norm(dim=-1) - 1).abs() <= UNIT_TOL).all()):
        return x
    return normalize(x)


#: a product with fewer rows on either side is padded with zero rows to this many: BLAS picks
#: another kernel for thin products, which rounds differently from that of a full tile (seen
#: with MKL below 12 rows)
MIN_PRODUCT_ROWS = 16


def block_product(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b.T`` with the bits of the same pairs in any other block of at least
    :data:`MIN_PRODUCT_ROWS` rows a side: thin operands are padded with zero rows (and the
    result cut back), so that a pair's inner product does not depend on the shape of the block
    it is computed in. (With MKL on CPU a pair's bits then depend neither on its place in the
    block nor on the side it is on; other BLAS may differ.)

    Example:
        >>> block_product(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.6, 0.8], [0.0, 1.0]]))
        tensor([[0.6000, 0.0000]])
    """
    ra, rb = a.shape[0], b.shape[0]
    if ra >= MIN_PRODUCT_ROWS and rb >= MIN_PRODUCT_ROWS:
        return a @ b.T
    if ra < MIN_PRODUCT_ROWS:
        a = torch.cat([a, a.new_zeros(MIN_PRODUCT_ROWS - ra, a.shape[1])])
    if rb < MIN_PRODUCT_ROWS:
        b = torch.cat([b, b.new_zeros(MIN_PRODUCT_ROWS - rb, b.shape[1])])
    return (a @ b.T)[:ra, :rb]


def cosine_similarity(
    x: Tensor,
    y: Tensor | None = None,
    mask: Tensor | None = None,
    y_mask: Tensor | None = None,
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
            raise ValueError(f"y must have shape (B={x.shape[0]}, M, D={x.shape[2]}), got {tuple(y.shape)}")
        y_mask = check_mask(y_mask, y.shape[:2], "y_mask")
        check_finite_where(y, y_mask, "y")
    xn = normalize(_zero_padding(x, mask))
    yn = xn if y is x else normalize(_zero_padding(y, y_mask))
    sim = torch.bmm(xn, yn.transpose(1, 2)).clamp_(-1.0, 1.0)
    return sim


def _zero_padding(x: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return x
    return torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))


def minmax_normalize(
    x: Tensor,
    mask: Tensor | None = None,
    *,
    dim: int = -1,
    lo: Tensor | None = None,
    hi: Tensor | None = None,
    clip: bool = False,
) -> Tensor:
    r"""Min-max scale ``x`` to ``[0, 1]``: ``(x - lo) / (hi - lo)``; 0 where ``hi == lo`` and at masked entries.

    ``lo`` and ``hi`` default to the min and max of the real (``mask``) entries along ``dim``;
    given, they are used as they are (e.g. bounds taken from a subset), and ``clip`` clamps
    the result to ``[0, 1]``. A constant vector normalises to 0. The one min-max of the
    package (ISO-RAG's fusion, G3RAG's density).

    Args:
        x: floating ``(..., N, ...)``.
        mask: bool like ``x``, True = real; ``None`` = all real.
        dim: the dimension the default bounds are taken over.
        lo, hi: bounds broadcastable to ``x``.
        clip: clamp the result to ``[0, 1]``.

    Example:
        >>> minmax_normalize(torch.tensor([[1.0, 3.0, 2.0, 9.0]]), torch.tensor([[True, True, True, False]]))
        tensor([[0.0000, 1.0000, 0.5000, 0.0000]])
    """
    if lo is None or hi is None:
        big = torch.finfo(x.dtype).max
        lo = (x if mask is None else torch.where(mask, x, torch.full_like(x, big))).amin(dim, keepdim=True)
        hi = (x if mask is None else torch.where(mask, x, torch.full_like(x, -big))).amax(dim, keepdim=True)
    span = hi - lo
    out = (x - lo) / torch.where(span > 0, span, torch.ones_like(span))
    if clip:
        out = out.clamp(0.0, 1.0)
    return torch.where(span > 0 if mask is None else mask & (span > 0), out, torch.zeros_like(x))
