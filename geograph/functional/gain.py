"""G3RAG's geometric-gain graph, built in row blocks: density and the sparse transition matrix."""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from geograph._checks import check_finite_float, check_positive_int, check_tensor
from geograph.functional.graphs import csr_rowptr
from geograph.functional.similarity import normalize
from geograph.outputs import topk_stable

__all__ = ["gain_density", "gain_transition", "check_band", "csr"]


def csr(crow: Tensor, col: Tensor, val: Tensor, n: int) -> Tensor:
    """A square sparse CSR tensor from valid parts (built here, so invariant checks are skipped;
    torch's note that CSR support is in beta is silenced: we use only the stable products)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, val, (n, n), check_invariants=False)


def _unit(embeddings: Tensor) -> Tensor:
    """Unit rows, validated; float16 / bfloat16 are upcast to float32 (their sums of N products
    would round away the density and the weights)."""
    check_tensor(embeddings, "embeddings", 2)
    if embeddings.shape[0] < 2:
        raise ValueError(f"embeddings must hold at least 2 passages, got shape {tuple(embeddings.shape)}")
    if embeddings.dtype in (torch.float16, torch.bfloat16):
        embeddings = embeddings.float()
    if bool((embeddings.norm(dim=1) == 0).any()):
        raise ValueError("embeddings holds an all-zero vector: its cosine similarity is undefined")
    return normalize(embeddings)


#: above this many passages ``max_degree=None`` warns: the band keeps over half of all N^2 pairs
FULL_T_WARN_NODES = 10_000


#: elements of one ``block x N`` similarity block when ``block`` is not given (64 Mi: 256 MB float32)
BLOCK_ELEMENTS = 1 << 26


def _block_rows(block: Optional[int], n: int) -> int:
    if block is None:
        return max(1, min(n, BLOCK_ELEMENTS // n))
    return check_positive_int(block, "block")


def check_band(band: Optional[tuple[float, float]]) -> Optional[tuple[float, float]]:
    """``band`` as ``(lo, hi)`` floats with ``-1 <= lo < hi <= 1``, or ``None``."""
    if band is None:
        return None
    try:
        lo, hi = (float(x) for x in band)
    except (TypeError, ValueError):
        raise ValueError(f"band must be a pair (lo, hi) or None, got {band!r}") from None
    if not -1.0 <= lo < hi <= 1.0:
        raise ValueError(f"band must satisfy -1 <= lo < hi <= 1 (a non-empty similarity interval), got {band!r}")
    return lo, hi


def gain_density(embeddings: Tensor, *, block: Optional[int] = None) -> Tensor:
    r"""G3RAG's similarity density of every passage, min-max normalised.

    .. math:: \rho_j = \frac{1}{N} \sum_{k \ne j} \max(0, S_{jk}), \qquad
              \hat\rho = \frac{\rho - \min \rho}{\max \rho - \min \rho}

    with ``S`` the cosine similarity (diagonal 0). Embeddings are L2-normalised here (so any
    scale is accepted); computed in row blocks of ``block`` passages: memory
    ``O(block x N)`` (default: as many rows as fit 2^26 similarities, 256 MB in float32). If every ``rho`` is equal the result is all 0.

    Args:
        embeddings: ``(N, D)`` passage embeddings, no all-zero row.
        block: rows per matrix product (default: 2^26 // N).

    Returns:
        ``(N,)`` in ``[0, 1]``, in the embeddings' dtype (float16 / bfloat16 are computed in
        float32).

    References:
        G3RAG (../shared/papers/g3rag.txt).

    Example:
        >>> gain_density(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]))
        tensor([0.2500, 1.0000, 0.0000])
    """
    z = _unit(embeddings)
    block = _block_rows(block, z.shape[0])
    n = z.shape[0]
    parts = []
    for start in range(0, n, block):
        s = z[start : start + block] @ z.T
        rows = torch.arange(s.shape[0], device=z.device)
        s[rows, rows + start] = 0.0
        parts.append(s.clamp_min(0).sum(1) / n)
    rho = torch.cat(parts)
    lo, hi = rho.min(), rho.max()
    span = hi - lo
    out = torch.where(span > 0, (rho - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(rho))
    return out.to(embeddings.dtype)


def gain_transition(
    embeddings: Tensor,
    *,
    band: Optional[tuple[float, float]] = (0.1, 0.7),
    beta: float = 0.4,
    max_degree: Optional[int] = None,
    block: Optional[int] = None,
    density: Optional[Tensor] = None,
) -> Tensor:
    r"""G3RAG's row-normalised transition matrix ``T`` as a sparse CSR ``(N, N)`` tensor.

    .. math:: W_{ij} = x \sqrt{1 - x^2}\, e^{-\beta \hat\rho_j} \quad (x = S_{ij} \in [lo, hi],
              i \ne j), \qquad T = \mathrm{diag}(W \mathbf{1})^{-1} W

    (:func:`gain_density` for ``rho``). ``band=None`` is the authors' code: no band, every
    pair with a positive weight, i.e. ``0 < x < 1`` (the formula is <= 0 elsewhere, which a
    transition matrix cannot hold). ``max_degree=k`` keeps each row's ``k`` largest weights
    before normalising: memory ``O(N k)`` instead of the band's (up to ``O(N^2)``), and a row
    with more than ``k`` band edges then differs from the full ``T`` (its weakest edges are
    dropped and the rest renormalised; at a tie on the cut the lower column index is kept).
    A row with no edge stays all zero (a dangling passage). Built in row blocks of ``block`` passages:
    peak memory about three ``block x N`` blocks plus the kept edges. ``max_degree=None``
    warns above ``FULL_T_WARN_NODES`` (10,000) passages: real embeddings put over half of all
    pairs in the default band. float16 / bfloat16 embeddings are built in float32 and ``T``
    is returned in their dtype.

    Args:
        embeddings: ``(N, D)`` passage embeddings (normalised here).
        band: similarity interval ``(lo, hi)`` of the edges, or ``None``.
        beta: density penalty on the target.
        max_degree: strongest edges kept per row; ``None`` = all.
        block: rows per matrix product (default: 2^26 // N, about 256 MB a block in float32).
        density: precomputed :func:`gain_density` (saves one pass).

    Returns:
        ``torch.sparse_csr_tensor`` ``(N, N)`` in the embeddings' dtype, rows sum to 1 or 0
        (long indices).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> gain_transition(x, band=(0.1, 0.9), beta=0.0).to_dense()
        tensor([[0.0000, 1.0000, 0.0000],
                [0.5000, 0.0000, 0.5000],
                [0.0000, 1.0000, 0.0000]])
    """
    z = _unit(embeddings)
    band = check_band(band)
    block = _block_rows(block, z.shape[0])
    beta = check_finite_float(beta, "beta")
    n = z.shape[0]
    if max_degree is not None:
        max_degree = check_positive_int(max_degree, "max_degree")
    elif n > FULL_T_WARN_NODES:
        warnings.warn(f"gain_transition with max_degree=None on {n} passages: T may hold O(N^2) edges "
                      "(over half of all pairs on real embeddings); pass max_degree to bound it", stacklevel=2)
    rho = gain_density(z, block=block) if density is None else density.to(z)
    if tuple(rho.shape) != (n,):
        raise ValueError(f"density must have shape ({n},), got {tuple(rho.shape)}")
    penalty = torch.exp(-beta * rho)
    rows_out, cols_out, vals_out = [], [], []
    for start in range(0, n, block):
        s = z[start : start + block] @ z.T
        r = torch.arange(s.shape[0], device=z.device)
        s[r, r + start] = 0.0
        if band is None:
            ok = (s > 0) & (s < 1)
        else:
            ok = (s >= band[0]) & (s <= band[1])
        # in place, one block at a time: w = x sqrt(1 - x^2) e^{-beta rho_j} in the band, 0 elsewhere
        # (the diagonal is 0 already; negative x give w < 0 and are dropped with the zeros)
        w = s.masked_fill_(~ok, 0.0)
        root = w * w
        root.neg_().add_(1.0).clamp_min_(0.0).sqrt_()
        w.mul_(root).mul_(penalty)
        del root, ok
        if max_degree is not None and max_degree < n:
            val, col = topk_stable(w, max_degree)  # ties at the cut: the lower column index is kept
            keep = val > 0
            row = (r + start).unsqueeze(1).expand_as(col)
            rows_out.append(row[keep])
            cols_out.append(col[keep])
            vals_out.append(val[keep])
        else:
            ok = w > 0
            idx = ok.nonzero()
            rows_out.append(idx[:, 0] + start)
            cols_out.append(idx[:, 1])
            vals_out.append(w[ok])
    rows, cols, vals = torch.cat(rows_out), torch.cat(cols_out), torch.cat(vals_out)
    order = torch.argsort(rows * n + cols)  # CSR: by row, then column
    rows, cols, vals = rows[order], cols[order], vals[order]
    row_sum = torch.zeros(n, dtype=vals.dtype, device=vals.device).index_add_(0, rows, vals)
    vals = vals / row_sum[rows]
    return csr(csr_rowptr(rows, n), cols, vals.to(embeddings.dtype), n)
