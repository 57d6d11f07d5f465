"""G3RAG's geometric-gain graph, built in row blocks: density and the sparse transition matrix."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack, cast

import torch
from torch import Tensor

from geograph._checks import check_finite_float, check_positive_int, check_tensor
from geograph.knn.allpairs import DEFAULT_BLOCK, map_tiles, merge_topk, progress_bar, sort_topk, tiled_pairs
from geograph.ops.adjacency import csr_rowptr
from geograph.ops.similarity import block_product, minmax_normalize, unit_rows

__all__ = [
    "gain_density",
    "gain_density_info",
    "gain_transition",
    "gain_transition_edges",
    "gain_edges",
    "gain_bound",
    "check_band",
    "csr",
    "DensityInfo",
    "GainEdges",
    "GainTransition",
    "GainOptions",
    "candidate_cap",
    "gain_rank",
]


def csr(crow: Tensor, col: Tensor, val: Tensor, n: int) -> Tensor:
    """A square sparse CSR tensor from valid parts (built here, so invariant checks are skipped;
    torch's note that CSR support is in beta is silenced: we use only the stable products)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, val, (n, n), check_invariants=False)


def _unit(embeddings: Tensor) -> Tensor:
    """Unit rows, validated; float16 / bfloat16 are upcast to float32 (their sums of N products
    would round away the density and the weights). Rows already of unit norm (e.g. the output
    of an earlier call) are used as they are (:func:`~geograph.ops.similarity.unit_rows`)."""
    check_tensor(embeddings, "embeddings", 2)
    if embeddings.shape[0] < 2:
        raise ValueError(f"embeddings must hold at least 2 passages, got shape {tuple(embeddings.shape)}")
    if embeddings.dtype in (torch.float16, torch.bfloat16):
        embeddings = embeddings.float()
    if bool((embeddings.norm(dim=1) == 0).any()):
        raise ValueError("embeddings holds an all-zero vector: its cosine similarity is undefined")
    return unit_rows(embeddings)


#: above this many passages ``max_degree=None`` warns: the band keeps over half of all N^2 pairs
FULL_T_WARN_NODES = 10_000


#: elements of one ``block x N`` similarity block when ``block`` is not given (64 Mi: 256 MB float32)
BLOCK_ELEMENTS = 1 << 26


def _block_rows(block: int | None, n: int) -> int:
    if block is None:
        return max(1, min(n, BLOCK_ELEMENTS // n))
    return check_positive_int(block, "block")


def _block(block: int | None) -> int:
    return DEFAULT_BLOCK if block is None else check_positive_int(block, "block")


def check_band(band: tuple[float, float] | None) -> tuple[float, float] | None:
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


#: the density's terms ``max(0, S_jk)`` (of float32 embeddings) are rounded to multiples of this
#: (``2^-24``, float32's spacing at 1) and summed in float64, where such sums are exact (below ``2^29`` passages): every
#: order of summation gives the same bits, so an update that adds and subtracts the sums of the
#: changed blocks ends on the sums of a fresh build (:mod:`geograph.graphs.g3_updates`)
DENSITY_UNIT = 2.0**-24


def density_terms(a: Tensor, b: Tensor) -> Tensor:
    """The density's terms ``max(0, <a_r, b_c>)`` of every pair ``(r, c)`` in units of
    :data:`DENSITY_UNIT` (integer-valued, in ``a``'s dtype; sum them in float64): the same
    bits for a pair whatever block or side it is computed in
    (:func:`~geograph.ops.similarity.block_product`). float64 terms are not rounded (their
    sums keep float64's precision and are exact only up to its rounding).

    Example:
        >>> density_terms(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.6, 0.8], [-1.0, 0.0]])) * DENSITY_UNIT
        tensor([[0.6000, 0.0000]])
    """
    t = block_product(a, b).mul_(1.0 / DENSITY_UNIT)
    return (t if t.dtype == torch.float64 else t.round_()).clamp_min_(0.0)


def _density_rows(shared: dict[str, Any], r0: int) -> Tensor:
    """The float64 sums (in units) of the density's terms of query rows ``r0 : r0 + block``
    against every key, the excluded pair left out (a tile of :func:`density_sums`)."""
    query, keys, block, own = shared["query"], shared["keys"], shared["block"], shared["own"]
    q = query[r0 : r0 + block]
    sums = torch.zeros(q.shape[0], dtype=torch.float64, device=q.device)
    mine = None if own is None else own[r0 : r0 + block].unsqueeze(1)
    for c0 in range(0, keys.shape[0], block):
        t = density_terms(q, keys[c0 : c0 + block])
        if mine is not None:
            hit = mine == torch.arange(c0, c0 + t.shape[1], device=q.device)
            t = t.masked_fill_(hit, 0.0)
        sums += t.sum(1, dtype=torch.float64)
    return sums


def density_sums(
    query: Tensor,
    keys: Tensor,
    *,
    block: int = DEFAULT_BLOCK,
    exclude: bool | Tensor = False,
    progress: bool | str = False,
) -> Tensor:
    """``sum_k max(0, <q_b, x_k>)`` of every query row, float64, each term on the grid of
    :data:`DENSITY_UNIT` (:func:`density_terms`), so the sums are exact and do not depend on the
    tiles (memory ``O(block^2)``; the tiles run on the executor of an enclosing
    :func:`~geograph.knn.allpairs.tile_executor`). ``exclude``: ``True`` when query row ``b`` is
    key ``b``, or the key id of each query row, whose pair is left out.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
        >>> density_sums(x, x, exclude=True)
        tensor([0.6000, 0.8000, 1.4000], dtype=torch.float64)
    """
    own = None
    if exclude is True:
        own = torch.arange(query.shape[0], device=query.device)
    elif isinstance(exclude, Tensor):
        own = exclude.to(device=query.device, dtype=torch.long)
    block = check_positive_int(block, "block")
    shared = dict(query=query, keys=keys, block=block, own=own)
    out = torch.empty(query.shape[0], dtype=torch.float64, device=query.device)
    bar = progress_bar(progress, query.shape[0], "density")
    for r0, sums in map_tiles(_density_rows, shared, range(0, query.shape[0], block)):
        out[r0 : r0 + sums.shape[0]] = sums
        if bar is not None:
            bar.update(sums.shape[0])
    if bar is not None:
        bar.close()
    return out.mul_(DENSITY_UNIT)


def _raw_density_exact(z: Tensor, block: int, rows: Tensor | None = None, progress: bool | str = False) -> Tensor:
    """``sum_{k != j} max(0, S_jk)`` for every row (or ``rows``), float64 and exact on the density's
    grid (:func:`density_sums`)."""
    q = z if rows is None else z[rows]
    return density_sums(q, z, block=block, exclude=True if rows is None else rows, progress=progress)


class _DensityStats(TypedDict):
    """The fields of :class:`DensityInfo` but the density."""

    sample: int
    mean_stderr: float
    max_stderr: float
    exact_rows: int


@dataclass(frozen=True)
class DensityInfo:
    """The density ``rho`` of :func:`gain_density_info` and how it was computed.

    Attributes:
        density: ``(N,)`` the normalised density (:func:`gain_density`'s result).
        sample: columns sampled (0 = exact).
        mean_stderr, max_stderr: the mean and largest standard error of the sampled ``rho``
            before normalisation (0 when exact).
        exact_rows: the rows computed exactly because they could set the minimum or the maximum.
    """

    density: Tensor
    sample: int
    mean_stderr: float
    max_stderr: float
    exact_rows: int

    def as_dict(self) -> dict[str, float | int]:
        """Every field but the density: ``{"sample", "mean_stderr", "max_stderr", "exact_rows"}``."""
        return {
            "sample": self.sample,
            "mean_stderr": self.mean_stderr,
            "max_stderr": self.max_stderr,
            "exact_rows": self.exact_rows,
        }


def gain_density(
    embeddings: Tensor,
    *,
    block: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    progress: bool | str = False,
) -> Tensor:
    r"""G3RAG's similarity density of every passage, min-max normalised.

    .. math:: \rho_j = \frac{1}{N} \sum_{k \ne j} \max(0, S_{jk}), \qquad
              \hat\rho = \frac{\rho - \min \rho}{\max \rho - \min \rho}

    with ``S`` the cosine similarity (diagonal 0). Embeddings are L2-normalised here (so any
    scale is accepted). Exact by default, by tiles (:func:`density_sums`; memory ``O(block^2)``,
    time ``O(N^2 D)``): each term is rounded to a multiple of :data:`DENSITY_UNIT` (``2^-24``) and
    the sums are taken in float64, where they are exact, so that an update of the corpus, which
    adds and subtracts the sums of the changed pairs, ends on the same bits as a fresh build.

    ``sample=s`` estimates it in ``O(N s D)``: with :math:`\max(0, x) = x + \max(0, -x)`,
    :math:`\sum_{k \ne j} S_{jk} = z_j \cdot \sum_k z_k - 1` is exact from the corpus sum and only
    the negative part :math:`\sum_k \max(0, -S_{jk})` is estimated from ``s`` uniform columns
    (without replacement; it is small on real embeddings, whose cosines are mostly positive).
    The extremes that set the normalisation are not left to sampling noise: every row whose
    estimate is within 4 standard errors of the smallest (largest) possible minimum (maximum)
    is recomputed exactly (at most 4,096 a side, the most extreme first), and the minimum and
    maximum are taken over exact values.

    Args:
        embeddings: ``(N, D)`` passage embeddings, no all-zero row.
        block: tile side (default: :data:`~geograph.knn.allpairs.DEFAULT_BLOCK`).
        sample: columns sampled for the negative part; ``None`` = exact.
        seed: the column sample's seed.
        progress: a progress bar over the tiles.

    Returns:
        ``(N,)`` in ``[0, 1]``, in the embeddings' dtype (float16 / bfloat16 are computed in
        float32); :func:`gain_density_info` also says how it was computed.

    References:
        G3RAG: Beyond Similarity through Zero-Token Geometric Graphs for Multi-Hop RAG (no arXiv
        id or venue known to us).

    Example:
        >>> gain_density(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]))
        tensor([0.2500, 1.0000, 0.0000])
    """
    return gain_density_info(embeddings, block=block, sample=sample, seed=seed, progress=progress).density


def gain_density_info(
    embeddings: Tensor,
    *,
    block: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    progress: bool | str = False,
) -> DensityInfo:
    """:func:`gain_density` (same arguments) with how it was computed: the sample, the standard
    errors of the estimate and the rows computed exactly.

    Example:
        >>> info = gain_density_info(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]))
        >>> info.density, info.as_dict()
        (tensor([0.2500, 1.0000, 0.0000]), {'sample': 0, 'mean_stderr': 0.0, 'max_stderr': 0.0, 'exact_rows': 3})
    """
    z = _unit(embeddings)
    block = _block(block)
    n = z.shape[0]
    if sample is None or sample >= n:
        raw = _raw_density_exact(z, block, progress=progress)
        stats: _DensityStats = dict(sample=0, mean_stderr=0.0, max_stderr=0.0, exact_rows=n)
        rho = minmax_normalize(raw, lo=raw.min(), hi=raw.max(), clip=True)
    else:
        sample = check_positive_int(sample, "sample")
        if sample < 2:
            raise ValueError(f"sample must be at least 2 columns to estimate an error, got {sample}")
        # sum_{k != j} S_jk = z_j . sum_k z_k - |z_j|^2, in float64 by row blocks (no float64 copy of z)
        total = torch.zeros(z.shape[1], dtype=torch.float64, device=z.device)
        for r0 in range(0, n, block):
            total += z[r0 : r0 + block].double().sum(0)
        signed = torch.empty(n, dtype=torch.float64, device=z.device)
        for r0 in range(0, n, block):
            zb = z[r0 : r0 + block].double()
            signed[r0 : r0 + block] = zb @ total - (zb * zb).sum(1)
        g = torch.Generator().manual_seed(seed)
        cols = torch.randperm(n, generator=g)[:sample].to(z.device)
        zc = z[cols]
        neg = torch.empty(n, dtype=torch.float64, device=z.device)
        sq = torch.empty_like(neg)
        bar = progress_bar(progress, n, "density", "sampled")
        for r0 in range(0, n, block):
            t = (z[r0 : r0 + block] @ zc.T).neg_().clamp_min_(0).double()
            neg[r0 : r0 + block] = t.sum(1)
            sq[r0 : r0 + block] = (t * t).sum(1)
            if bar is not None:
                bar.update(t.shape[0])
        if bar is not None:
            bar.close()
        mean = neg / sample
        var = (sq / sample - mean * mean).clamp_min(0) * sample / (sample - 1)
        se = n * torch.sqrt(var / sample * (1.0 - sample / n))
        raw = signed + n * mean
        exact_rows = []
        for side in (1.0, -1.0):  # the minimum, then the maximum (as the minimum of -raw)
            r, e = side * raw, se
            bound = (r + 4 * e).min()
            cand = torch.nonzero(r - 4 * e <= bound).squeeze(1)
            if cand.numel() > 4096:
                cand = cand[torch.topk(-(r[cand] - 4 * e[cand]), 4096).indices]
            exact_rows.append(cand)
        rows = torch.unique(torch.cat(exact_rows))
        raw = raw.clone()
        raw[rows] = _raw_density_exact(z, block, rows).double()
        stats = dict(
            sample=sample,
            mean_stderr=float(se.mean()) / n,
            max_stderr=float(se.max()) / n,
            exact_rows=int(rows.numel()),
        )
        rho = minmax_normalize(raw, lo=raw[rows].min(), hi=raw[rows].max(), clip=True)
    return DensityInfo(rho.to(embeddings.dtype), **stats)


def gain_bound(x: Tensor, band: tuple[float, float] | None) -> Tensor:
    r"""The largest weight a pair of cosine at most ``x`` can have: :math:`\max f` over ``[lo, min(x, hi)]``.

    ``f(x) = x sqrt(1 - x^2)`` increases up to ``1/sqrt(2)`` and the penalty is at most 1, so
    the bound is ``f(min(x, hi, 1/sqrt(2)))``, or 0 when ``min(x, hi)`` is below the band (or
    not positive). ``band=None`` is the open interval ``(0, 1)``.

    Example:
        >>> gain_bound(torch.tensor([0.05, 0.5, 0.9]), (0.1, 0.7))
        tensor([0.0000, 0.4330, 0.4999])
    """
    lo, hi = (0.0, 1.0) if band is None else band
    top = torch.clamp(x, max=hi)
    u = torch.clamp(top, max=1.0 / math.sqrt(2.0))
    f = u * torch.sqrt((1 - u * u).clamp_min(0))
    return torch.where((top >= lo) & (top > 0), f, torch.zeros_like(f))


def candidate_cap(band: tuple[float, float] | None) -> Callable[[Tensor], Tensor] | None:
    """The ranking of G3's cosine candidate lists: the cosine itself up to the band's ceiling ``hi``
    (pairs above it weigh 0 and are never ranked); ``None`` for ``band=None``."""
    if band is None:
        return None
    hi = band[1]
    return lambda s: s.masked_fill(s > hi, float("-inf"))


def gain_rank(band: tuple[float, float] | None) -> Callable[[Tensor], Tensor]:
    """The ranking of G3's weight candidate lists: ``f(x) = x sqrt(1 - x^2)`` inside the band, 0
    outside (times the target's penalty, applied by the caller)."""
    return lambda s: _weights(s, 1.0, band)  # in place: callers pass a fresh block of products


def _weights(s: Tensor, penalty_cols: Tensor | float, band: tuple[float, float] | None) -> Tensor:
    """``x sqrt(1 - x^2) e^{-beta rho_j}`` inside the band, 0 elsewhere (in place on ``s``)."""
    ok = (s > 0) & (s < 1) if band is None else (s >= band[0]) & (s <= band[1])
    w = s.masked_fill_(~ok, 0.0)
    root = (w * w).neg_().add_(1.0).clamp_min_(0.0).sqrt_()
    w.mul_(root)
    if not (isinstance(penalty_cols, float) and penalty_cols == 1.0):
        w.mul_(penalty_cols)
    return w.clamp_min_(0.0)


@dataclass(frozen=True)
class GainEdges:
    """The kept edges of G3RAG's ``W`` before row normalisation, with how they were proven.

    Attributes:
        crow: ``(N + 1,)`` CSR row pointers: row ``u``'s edges are ``crow[u]:crow[u + 1]``.
        cols, vals: ``(E,)`` edges (``vals > 0``) in CSR order: by row, then column.
        certified: ``(N,)`` bool, the row was proven exact from its candidate list (all True
            for the exact build).
        redone: ``(N,)`` bool, the row was recomputed against every passage.
    """

    crow: Tensor
    cols: Tensor
    vals: Tensor
    certified: Tensor
    redone: Tensor

    @property
    def rows(self) -> Tensor:
        """``(E,)`` the source row of every edge (made on demand: E longs)."""
        counts = self.crow[1:] - self.crow[:-1]
        return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)


def gain_edges(
    z: Tensor,
    penalty: Tensor,
    *,
    band: tuple[float, float] | None,
    max_degree: int,
    candidates: tuple[Tensor, Tensor] | None = None,
    ranking: str = "cosine",
    block: int | None = None,
    redo: bool = True,
    consume: bool = False,
    progress: bool | str = False,
) -> GainEdges:
    r"""Each row's ``max_degree`` largest weights :math:`W_{ij} = f(S_{ij}) p_j`, exactly or from candidates.

    Without ``candidates``: the tiled routine ranks the weights of every pair (exact). With
    ``candidates = (x, ids)``, each row's top-``K'`` cosine list ``(N, K')`` best first
    (``-1`` = empty slot): the weights are computed on the list only and the row is
    **certified** when no pair outside it can enter: every outside pair has cosine at most
    ``x_K'`` (the list's last) and so weight at most :func:`gain_bound` ``(x_K')``; the row is
    exact when that bound is 0, or when the row kept ``max_degree`` edges and the bound is
    below its smallest kept weight. (With exact lists that is a proof; with ANN lists a proof
    up to the index's misses.) Rows not certified are recomputed exactly when ``redo``.

    ``ranking="weight"``: the lists hold each row's top-``K'`` **weights** (``W_ij``, ranked by
    the weight itself, :func:`gain_rank` times the penalty) instead of cosines; a row is then
    certified when its ``K'``-th weight is 0 or below its kept ``max_degree``-th weight: exact
    for exact lists, exact up to the index's misses for IVF lists (which the bench measures).

    Args:
        z: ``(N, D)`` unit rows.
        penalty: ``(N,)`` ``e^{-beta rho}`` of every passage.
        band: the cosine band, or ``None`` (``0 < x < 1``).
        max_degree: edges kept per row.
        candidates: ``(values, indices)`` top-``K'`` cosine lists, or ``None``.
        ranking: what the lists rank, ``"cosine"`` or ``"weight"``.
        block: tile side.
        redo: recompute uncertified rows exactly.
        consume: the candidate lists are used up (both tensors are left empty): when they are
            contiguous the edges are made and compacted inside their storage, and ``cols`` /
            ``vals`` come back as views of it (``N K'`` entries; :func:`gain_transition` copies
            them compactly, releasing each list as it goes). At 1M x 160 lists no ``(E,)``
            array is made next to the lists' 1.9 GB.
        progress: progress bars.

    Returns:
        :class:`GainEdges`. Ties at a row's cut keep the lower column index.
    """
    n = z.shape[0]
    block = _block(block)

    def score(s: Tensor, cols: Tensor) -> Tensor:
        return _weights(s, penalty[cols], band)

    def exact(rows: Tensor | None) -> tuple[Tensor, Tensor]:
        q = z if rows is None else z[rows]
        val, col, _ = tiled_pairs(
            q,
            z,
            min(max_degree, n - 1),
            block=block,
            exclude=True if rows is None else rows,
            score=score,
            progress=progress and (f"{progress} exact" if isinstance(progress, str) else True),
        )
        return val, col

    if candidates is None:
        kv, ki = exact(None)
        ones = torch.ones(n, dtype=torch.bool, device=z.device)
        return _csr_edges(kv, ki, certified=ones, redone=~ones)
    if ranking not in ("cosine", "weight"):
        raise ValueError(f"ranking must be 'cosine' or 'weight', got {ranking!r}")
    x, ids = candidates
    kc = ids.shape[1]
    if kc < min(max_degree, n - 1):
        raise ValueError(f"candidates hold K'={kc} per row, fewer than max_degree={max_degree}")
    k = min(max_degree, kc)
    if consume:  # each chunk reads its rows' lists before it writes its edges over their first k slots
        kv, ki = x[:, :k], ids[:, :k]
    else:
        kv, ki = x.new_empty((n, k)), ids.new_empty((n, k))
    certified = torch.empty(n, dtype=torch.bool, device=z.device)
    for r0 in range(0, n, EDGE_ROWS):  # row chunks: the temporaries stay O(EDGE_ROWS x K')
        xc, ic = x[r0 : r0 + EDGE_ROWS], ids[r0 : r0 + EDGE_ROWS]
        valid = (ic >= 0) & torch.isfinite(xc)
        if ranking == "cosine":
            w = _weights(xc.clone(), penalty[ic.clamp_min(0)], band).masked_fill_(~valid, 0.0)
        else:
            w = xc.masked_fill(~valid, 0.0).clamp_min_(0.0)
        cv, ci = sort_topk(*merge_topk(w, torch.where(valid, ic, torch.full_like(ic, n)), k))
        if ranking == "cosine":
            bound = gain_bound(xc[:, -1], band)
        else:
            bound = w[:, -1]  # lists are best first; a row that is not full is not certified
        full = valid.all(1)
        if kc >= n - 1:  # every other passage is a candidate
            ok = full
        else:
            enough = (cv[:, -1] > 0) if k == max_degree else torch.zeros_like(full)
            ok = full & ((bound == 0) | (enough & (bound < cv[:, -1])))
        kv[r0 : r0 + EDGE_ROWS], ki[r0 : r0 + EDGE_ROWS], certified[r0 : r0 + EDGE_ROWS] = cv, ci, ok
    redone = ~certified if redo else torch.zeros_like(certified)
    todo = redone.nonzero().squeeze(1)
    if todo.numel():
        kv[todo], ki[todo] = exact(todo)
    # consumed row-major lists: the edges are compacted into the front of their own storage
    flat = (x.view(-1), ids.view(-1)) if consume and x.is_contiguous() and ids.is_contiguous() else None
    edges = _csr_edges(kv, ki, certified=certified, redone=redone, out=flat)
    if consume:
        del kv, ki, flat
        # set_() without a source empties the storage; torch's stubs lack that overload
        x.set_()  # type: ignore[call-overload]
        ids.set_()  # type: ignore[call-overload]
    return edges


#: rows of candidate lists turned into edges at a time (bounds the temporaries of :func:`gain_edges`)
EDGE_ROWS = 1 << 14


def _csr_edges(
    kv: Tensor, ki: Tensor, *, certified: Tensor, redone: Tensor, out: tuple[Tensor, Tensor] | None = None
) -> GainEdges:
    """The positive entries of per-row lists ``(N, k)`` as edges in CSR order (row, then column).

    Sorts ``kv`` / ``ki`` in place (by row chunks: no second copy of the lists at the peak); the
    row pointers come from the per-row counts (no ``(E,)`` row array).

    ``out``: flat ``(values, ids)`` views of the row-major ``(N, K')`` storage that ``kv`` / ``ki``
    are the first ``k`` columns of (``k <= K'``; consumed candidate lists). The edges are then
    written into the first ``E`` entries of that storage, chunk by chunk, and returned as views
    of it: no new ``(E,)`` arrays next to the lists. It is safe in place: the edges of rows
    ``< r1`` end at ``crow[r1] <= r1 k <= r1 K'``, where row ``r1``'s entries begin, and each
    chunk is read before its edges are written."""
    n = kv.shape[0]
    counts = torch.empty(n, dtype=torch.long, device=kv.device)
    e = 0
    for r0 in range(0, n, EDGE_ROWS):
        v, i = kv[r0 : r0 + EDGE_ROWS], ki[r0 : r0 + EDGE_ROWS]
        i, pos = i.masked_fill(~(v > 0), n).sort(dim=1)  # dropped entries sort last in their row
        v = v.gather(1, pos)
        keep = i < n
        counts[r0 : r0 + EDGE_ROWS] = keep.sum(1)
        if out is None:
            kv[r0 : r0 + EDGE_ROWS], ki[r0 : r0 + EDGE_ROWS] = v, i
        else:
            v, i = v[keep], i[keep]
            out[0][e : e + v.numel()], out[1][e : e + i.numel()] = v, i
            e += v.numel()
    crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    if out is not None:
        return GainEdges(crow, out[1][:e], out[0][:e], certified=certified, redone=redone)
    keep = ki < n
    return GainEdges(crow, ki[keep], kv[keep], certified=certified, redone=redone)


def _compact(t: Tensor) -> Tensor:
    """``t`` itself, or a copy when it is a view of a larger storage (e.g. consumed candidate lists)."""
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t


def gain_transition(embeddings: Tensor, **options: Unpack[GainOptions]) -> Tensor:
    r"""G3RAG's row-normalised transition matrix ``T`` as a sparse CSR ``(N, N)`` tensor.

    .. math:: W_{ij} = x \sqrt{1 - x^2}\, e^{-\beta \hat\rho_j} \quad (x = S_{ij} \in [lo, hi],
              i \ne j), \qquad T = \mathrm{diag}(W \mathbf{1})^{-1} W

    (:func:`gain_density` for ``rho``). ``band=None`` is the authors' code: no band, every
    pair with a positive weight, i.e. ``0 < x < 1`` (the formula is <= 0 elsewhere, which a
    transition matrix cannot hold). ``max_degree=k`` keeps each row's ``k`` largest weights
    before normalising (:func:`gain_edges`, by the tiled all-pairs routine: memory
    ``O(block^2 + N k)``), and a row with more than ``k`` band edges then differs from the full
    ``T`` (its weakest edges are dropped and the rest renormalised; at a tie on the cut the
    lower column index is kept). ``candidates`` (top-``K'`` cosine lists) make the
    ``max_degree`` build cost ``O(N K')`` plus the rows that its certificate cannot prove
    (see :func:`gain_edges`). A row with no edge stays all zero (a dangling passage).

    ``max_degree=None`` (the authors' full T) is built in row blocks of ``block`` passages
    against all columns (peak memory about three ``block x N`` blocks plus the kept edges) and
    warns above ``FULL_T_WARN_NODES`` (10,000) passages: real embeddings put over half of all
    pairs in the default band. float16 / bfloat16 embeddings are built in float32 and ``T``
    is returned in their dtype.

    Args:
        embeddings: ``(N, D)`` passage embeddings (normalised here).
        options: the keywords of :func:`gain_transition_edges` (``GainOptions``: ``band``,
            ``beta``, ``max_degree``, ``block``, ``density``, ``candidates``, ``ranking``,
            ``progress``, ``consume``), with its defaults.

    Returns:
        ``torch.sparse_csr_tensor`` ``(N, N)`` in the embeddings' dtype, rows sum to 1 or 0
        (long indices); :func:`gain_transition_edges` also returns the kept edges and their
        certificate.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> gain_transition(x, band=(0.1, 0.9), beta=0.0).to_dense()
        tensor([[0.0000, 1.0000, 0.0000],
                [0.5000, 0.0000, 0.5000],
                [0.0000, 1.0000, 0.0000]])
    """
    return gain_transition_edges(embeddings, **options).transition


class GainOptions(TypedDict, total=False):
    """The keywords of :func:`gain_transition_edges`, which :func:`gain_transition` passes on (their
    defaults are :func:`gain_transition_edges`')."""

    band: tuple[float, float] | None
    beta: float
    max_degree: int | None
    block: int | None
    density: Tensor | None
    candidates: tuple[Tensor, Tensor] | None
    ranking: str
    progress: bool | str
    consume: bool


@dataclass(frozen=True)
class GainTransition:
    """:func:`gain_transition_edges`: ``T`` and the edges it was made of.

    Attributes:
        transition: ``T``, sparse CSR ``(N, N)`` (:func:`gain_transition`'s result).
        edges: the kept edges of ``W`` before row normalisation with each row's certificate
            (:class:`GainEdges`), for a ``max_degree`` build (``max_degree < N``); ``None`` for
            the full ``T``.
    """

    transition: Tensor
    edges: GainEdges | None


def gain_transition_edges(
    embeddings: Tensor,
    *,
    band: tuple[float, float] | None = (0.1, 0.7),
    beta: float = 0.4,
    max_degree: int | None = None,
    block: int | None = None,
    density: Tensor | None = None,
    candidates: tuple[Tensor, Tensor] | None = None,
    ranking: str = "cosine",
    progress: bool | str = False,
    consume: bool = False,
) -> GainTransition:
    """:func:`gain_transition` with the kept edges and how each row was proven
    (:func:`gain_edges`: certified from its candidate list, or recomputed).

    Args:
        embeddings: ``(N, D)`` passage embeddings (normalised here).
        band: similarity interval ``(lo, hi)`` of the edges, or ``None``.
        beta: density penalty on the target.
        max_degree: strongest edges kept per row; ``None`` = all.
        block: tile side (``max_degree``), or rows per block (``None``: default ``2^26 // N``).
        density: precomputed :func:`gain_density` (saves one pass).
        candidates: ``(values, indices)`` top-``K'`` cosine (or weight) lists of every passage
            (needs ``max_degree <= K'``).
        ranking: what ``candidates`` rank: ``"cosine"`` or ``"weight"`` (:func:`gain_edges`).
        progress: progress bars.
        consume: ``candidates`` are used up (:func:`gain_edges`): left empty, their memory
            reused and released.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
        >>> out = gain_transition_edges(x, band=(0.1, 0.9), beta=0.0, max_degree=1)
        >>> out.transition.to_dense(), out.edges.certified
        (tensor([[0., 1., 0.],
                [0., 0., 1.],
                [0., 1., 0.]]), tensor([True, True, True]))
    """
    z = _unit(embeddings)
    band = check_band(band)
    beta = check_finite_float(beta, "beta")
    n = z.shape[0]
    if max_degree is not None:
        max_degree = check_positive_int(max_degree, "max_degree")
    elif candidates is not None:
        raise ValueError("candidates need max_degree: the full T (max_degree=None) uses every pair")
    elif n > FULL_T_WARN_NODES:
        warnings.warn(
            f"gain_transition with max_degree=None on {n} passages: T may hold O(N^2) edges "
            "(over half of all pairs on real embeddings); pass max_degree to bound it",
            stacklevel=2,
        )
    if candidates is not None:
        cv, ci = candidates
        if ci.ndim != 2 or ci.shape[0] != n or tuple(cv.shape) != tuple(ci.shape):
            raise ValueError(
                f"candidates must be two (N={n}, K') tensors (values, indices), got shapes "
                f"{tuple(cv.shape)} and {tuple(ci.shape)}"
            )
        if ci.shape[1] < min(cast(int, max_degree), n - 1):  # candidates come with max_degree (checked above)
            raise ValueError(
                f"candidates hold K'={ci.shape[1]} per row, fewer than max_degree={max_degree}: "
                "raise the candidates or lower max_degree"
            )
        candidates = (cv.to(z), ci.to(z.device))
    rho = gain_density(z, block=None if block is None else block) if density is None else density.to(z)
    if tuple(rho.shape) != (n,):
        raise ValueError(f"density must have shape ({n},), got {tuple(rho.shape)}")
    penalty = torch.exp(-beta * rho)
    proof = None
    edges: GainEdges | None
    if max_degree is not None and max_degree < n:
        edges = gain_edges(
            z,
            penalty,
            band=band,
            max_degree=max_degree,
            candidates=candidates,
            ranking=ranking,
            block=block,
            consume=consume,
            progress=progress,
        )
        crow, cols, vals, proof = edges.crow, edges.cols, edges.vals, (edges.certified, edges.redone)
        del edges, candidates
        # consumed lists: the edges are views of their storage (N K' entries); compact copies, each
        # view dropped as soon as it is copied (the values first: the smaller peak)
        vals = _compact(vals)
        cols = _compact(cols)
    else:
        rows, cols, vals = _full_rows(z, penalty, band, _block_rows(block, n))
        crow = csr_rowptr(rows, n)
        del rows
    # both sources give CSR order (by row, then column): no sort of the E edges
    t = csr(crow, cols, _row_normalised(crow, vals).to(embeddings.dtype), n)
    edges = None if proof is None else GainEdges(crow, cols, vals, certified=proof[0], redone=proof[1])
    return GainTransition(t, edges)


def _row_normalised(crow: Tensor, vals: Tensor) -> Tensor:
    """``vals`` (CSR order) divided by their row's sum, :data:`EDGE_ROWS` rows at a time (no
    ``(E,)`` row array). Each row is summed in edge order by ``index_add_``, as one call over all
    edges would: the same floats."""
    n = crow.numel() - 1
    out = torch.empty_like(vals)
    row_sum = torch.zeros(n, dtype=vals.dtype, device=vals.device)
    for r0 in range(0, n, EDGE_ROWS):
        r1 = min(n, r0 + EDGE_ROWS)
        e0, e1 = int(crow[r0]), int(crow[r1])
        rows = torch.repeat_interleave(torch.arange(r0, r1, device=crow.device), crow[r0 + 1 : r1 + 1] - crow[r0:r1])
        row_sum.index_add_(0, rows, vals[e0:e1])
        out[e0:e1] = vals[e0:e1] / row_sum[rows]
    return out


def _full_rows(
    z: Tensor, penalty: Tensor, band: tuple[float, float] | None, block: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Every positive weight (the authors' full ``W``), in row blocks against all columns."""
    n = z.shape[0]
    rows_out, cols_out, vals_out = [], [], []
    for start in range(0, n, block):
        s = z[start : start + block] @ z.T
        r = torch.arange(s.shape[0], device=z.device)
        s[r, r + start] = 0.0
        w = _weights(s, penalty, band)
        ok = w > 0
        idx = ok.nonzero()
        rows_out.append(idx[:, 0] + start)
        cols_out.append(idx[:, 1])
        vals_out.append(w[ok])
    return torch.cat(rows_out), torch.cat(cols_out), torch.cat(vals_out)
