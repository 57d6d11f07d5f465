r"""Approximate all-pairs top-k for corpora of millions: an IVF cell join, re-scored exactly.

The corpus is split into ``nlist`` cells by spherical k-means trained on a uniform sample
(faiss's ``Kmeans``); each cell is joined with the ``nprobe`` cells whose centroids are nearest
to its own, and the join is made symmetric (cell ``a`` meets cell ``b`` when either probes the
other, once), so every pair that is computed updates both passages' lists. A join of two cells
is one matrix product of uncompressed vectors: the scores are exact, only pairs between cells
that never meet are missed. One round of neighbours-of-neighbours (NN-descent's local join)
then proposes, for every passage, the neighbours of its neighbours, re-scored exactly, which
recovers most of those misses. This is the candidate source of ``index="ivf"`` in
:meth:`geograph.CorpusGraph.from_knn` and :meth:`geograph.G3Graph.build`; the exact source is
:func:`~geograph.functional.allpairs.tiled_pairs`.

Why not ``faiss.IndexIVFFlat.search`` for the self-join: it scans each query's lists one vector
at a time; grouping the queries of a cell turns the same work into matrix products (about
2-3x faster on two CPU cores, and the same code runs on CUDA). Queries that are not corpus
passages (:class:`geograph.DenseRetriever`) use faiss's index directly.

References:
    Johnson, Douze, Jegou, "Billion-scale similarity search with GPUs", IEEE Trans. Big Data
    2019 (arXiv:1702.08734): all-vs-all IVF search for k-NN graphs.
    Dong, Moses, Li, "Efficient k-nearest neighbor graph construction for generic similarity
    measures", WWW 2011 (NN-descent).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch
from torch import Tensor

from geograph._checks import check_positive_int
from geograph.functional.allpairs import (
    DEFAULT_BLOCK,
    current_executor,
    map_tiles,
    merge_topk,
    progress_bar,
    sort_topk_,
    tiled_pairs,
    tiled_topk,
)

__all__ = [
    "train_centroids",
    "ivf_self_topk",
    "refine_neighbours",
    "check_ivf",
    "MIN_POINTS_PER_CELL",
    "default_nlist",
    "default_join_nlist",
    "default_join_nprobe",
    "DEFAULT_POINTS_PER_CELL",
    "QUERY_POINTS_PER_CELL",
    "resolve_index",
    "self_topk",
    "build_ivf_index",
    "INDEXES",
    "AUTO_EXACT_MAX",
    "DEFAULT_RECALL_TARGET",
    "DEFAULT_RECALL_ROWS",
    "sample_recall",
    "exact_rows",
]

#: the candidate sources a corpus-wide build accepts
INDEXES = ("exact", "ivf", "auto")

#: the share of each row's exact top-``k`` an IVF build must find (estimated on sampled rows)
#: unless told otherwise (:func:`ivf_self_topk`'s ``recall_target``)
DEFAULT_RECALL_TARGET = 0.98

#: rows sampled to choose ``nprobe`` for a recall target, and as many others to measure the result
DEFAULT_RECALL_ROWS = 1000

#: ``index="auto"`` builds exactly up to this many passages and with the IVF join above
#: (measured by ``geograph bench scale``: below it the exact tiled scan is about as fast)
AUTO_EXACT_MAX = 50_000

log = logging.getLogger("geograph.ann")

#: training points needed per centroid (faiss warns below 39)
MIN_POINTS_PER_CELL = 39

#: training points per cell of the self-join unless ``sample`` is given; the k-means time is
#: ``O(sample x nlist x D)``, so this bounds it at ``O(nlist^2 D)``
DEFAULT_POINTS_PER_CELL = 64

#: training points per list of a query index (:class:`geograph.DenseRetriever`; faiss's own
#: cap): trained once, searched by every query, so the better quantizer pays
QUERY_POINTS_PER_CELL = 256


Transform = Callable[[Tensor], Tensor]


def _rank(s: Tensor, transform: Transform | None, target: Tensor | None, cols: Tensor) -> Tensor:
    """``transform(s) * target[cols]`` (each part optional); ``cols`` index the last dimension or match ``s``."""
    if transform is not None:
        s = transform(s)
    if target is not None:
        s = s * target[cols]
    return s


def resolve_index(index: str, n: int, what: str = "build") -> str:
    """``"exact"`` or ``"ivf"`` for ``index`` on ``n`` passages (``"auto"``: exact up to
    :data:`AUTO_EXACT_MAX`), logged."""
    if index not in INDEXES:
        raise ValueError(f"index must be one of {', '.join(map(repr, INDEXES))}, got {index!r}")
    if index == "auto":
        index = "exact" if n <= AUTO_EXACT_MAX else "ivf"
        log.info("%s: index='auto' chose %r for %d passages (exact up to %d)", what, index, n, AUTO_EXACT_MAX)
    return index


def self_topk(
    z: Tensor,
    k: int,
    *,
    index: str = "exact",
    nlist: int | None = None,
    nprobe: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
    progress: bool | str = False,
    timings: dict | None = None,
    recall_target: float | None = None,
    recall_rows: int = DEFAULT_RECALL_ROWS,
    report: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """Top-``k`` most similar other rows of every row of ``z``: exact by tiles, or by the IVF join.

    ``index`` is ``"exact"`` (:func:`~geograph.functional.allpairs.tiled_topk`), ``"ivf"``
    (:func:`ivf_self_topk`, with its ``recall_target``, ``recall_rows`` and ``report``) or
    ``"auto"`` (:func:`resolve_index`). Pairs are ranked by ``transform(s) * target[j]`` (see
    :func:`ivf_self_topk`; default: the inner product). Returns ``(values, indices)`` ``(N, k)``, best
    first, ties lowest index (``-inf`` / ``-1`` where a row has fewer than ``k``).
    """
    index = resolve_index(index, z.shape[0], "self top-k")
    if index == "exact":
        return _exact_self_topk(z, k, block, transform, target, progress, timings)
    return ivf_self_topk(
        z,
        k,
        nlist=nlist,
        nprobe=nprobe,
        sample=sample,
        seed=seed,
        block=block,
        transform=transform,
        target=target,
        progress=progress,
        timings=timings,
        recall_target=recall_target,
        recall_rows=recall_rows,
        report=report,
    )


def _score(transform: Transform | None, target: Tensor | None):
    return None if transform is None and target is None else (lambda s, cols: _rank(s, transform, target, cols))


def _exact_self_topk(
    z: Tensor,
    k: int,
    block: int,
    transform: Transform | None,
    target: Tensor | None,
    progress: bool | str,
    timings: dict | None,
) -> tuple[Tensor, Tensor]:
    clock = _Clock(timings)
    v, i, _ = tiled_pairs(z, z, k, block=block, exclude=True, score=_score(transform, target), progress=progress)
    clock("exact")
    return v, torch.where(torch.isfinite(v), i, torch.full_like(i, -1))


def default_nlist(n: int) -> int:
    """``nlist`` of a query index (:class:`geograph.DenseRetriever`) unless given: about
    ``4 sqrt(N)`` lists (a power of two), e.g. 4096 at 1M passages."""
    return _pow2(4.0 * math.sqrt(n))


def default_join_nlist(n: int) -> int:
    """``nlist`` of the self-join (:func:`ivf_self_topk`) unless given: about ``2 sqrt(N)`` cells
    (a power of two), e.g. 1024 at 200k and 2048 at 1M passages.

    Half the query index's: the join trains the quantizer on ``64 x nlist`` rows (time
    ``O(nlist^2 D)``) and joins cells of about ``N / nlist`` rows (time ``O(N^2 nprobe D / nlist)``);
    at 200k MiniLM-like vectors, 2048 cells spent 54 of 96 s training (``geograph bench scale``,
    ``docs/bench/scale.json``), and bigger cells probe a larger share of the corpus at the same
    ``nprobe`` (higher recall).
    """
    return _pow2(2.0 * math.sqrt(n))


#: cells each cell of the self-join meets at least (the default ``nprobe``)
DEFAULT_JOIN_NPROBE = 32
#: rows each row of the self-join meets at least by default (:func:`default_join_nprobe`)
MIN_JOIN_ROWS = 2560


def default_join_nprobe(n: int, nlist: int) -> int:
    """``nprobe`` of the self-join unless given: :data:`DEFAULT_JOIN_NPROBE` cells, or as many as
    hold :data:`MIN_JOIN_ROWS` rows where cells are small, at most ``nlist``.

    Why: a cell holds about ``N / nlist`` rows (``sqrt(N) / 2`` at the default ``nlist``), so 32
    cells are 15,600 rows at 1M passages but 1,300 on SciFact's 5,183, where G3's 128 kept
    edges a row are 2.5% of the corpus and reach far cells. Measured with MiniLM embeddings
    (``geograph bench scale``; SciFact test, 128 cells): at 32 cells k-NN edge recall 0.9973,
    G3 edge recall 0.977, same top-k as the exact graphs for 95.3% (ISO-RAG) / 94.3% (G3RAG)
    of the queries; at 64 cells (2,600 rows a row) 0.99984, 0.9976, 100% / 100%. From about
    80k passages on, the default is 32 (1M: 2,048 cells of ~490 rows).

    Example:
        >>> default_join_nprobe(1_000_000, 2048), default_join_nprobe(5183, 128), default_join_nprobe(1890, 64)
        (32, 64, 64)
    """
    return min(nlist, max(DEFAULT_JOIN_NPROBE, math.ceil(MIN_JOIN_ROWS * nlist / max(1, n))))


def _pow2(x: float) -> int:
    return max(1, 1 << int(round(math.log2(max(1.0, x)))))


def check_ivf(n: int, nlist: int, nprobe: int, sample: int | None, per_cell: int = DEFAULT_POINTS_PER_CELL) -> int:
    """Validate IVF options for ``n`` passages; returns the training sample size (default
    ``per_cell x nlist``, at most ``n``)."""
    nlist = check_positive_int(nlist, "nlist")
    nprobe = check_positive_int(nprobe, "nprobe")
    if nlist > n:
        raise ValueError(f"nlist={nlist} exceeds the number of passages ({n}): use at most {n} cells")
    if nprobe > nlist:
        raise ValueError(f"nprobe={nprobe} exceeds nlist={nlist}: a cell cannot probe more cells than exist")
    need = MIN_POINTS_PER_CELL * nlist
    if sample is None:
        sample = min(n, per_cell * nlist)
    sample = check_positive_int(sample, "sample")
    if sample > n:
        raise ValueError(f"sample={sample} exceeds the number of passages ({n})")
    if sample < need and sample < n:
        raise ValueError(
            f"sample={sample} is too small to train nlist={nlist} cells (need at least "
            f"{MIN_POINTS_PER_CELL} x nlist = {need}): lower nlist or raise sample"
        )
    return sample


def _faiss():
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("index='ivf' needs faiss: pip install 'geograph[faiss]' (faiss-cpu or faiss-gpu)") from exc
    return faiss


def _training_rows(n: int, nlist: int, sample: int | None, seed: int) -> Tensor:
    """The sorted rows an IVF quantizer is trained on: a uniform sample of ``sample`` (checked) of ``n``."""
    sample = check_ivf(n, nlist, 1, sample)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:sample].sort().values


def train_centroids(z: Tensor, nlist: int, *, sample: int | None = None, seed: int = 0, niter: int = 20) -> Tensor:
    """Spherical k-means centroids ``(nlist, D)`` of unit rows ``z``, trained on a uniform sample by faiss."""
    n, d = z.shape
    x = z[_training_rows(n, nlist, sample, seed).to(z.device)].detach().float().cpu().contiguous().numpy()
    faiss = _faiss()
    km = faiss.Kmeans(
        d,
        nlist,
        niter=niter,
        seed=seed,
        spherical=True,
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=max(256, -(-sample // nlist)),
    )
    km.train(x)
    return torch.from_numpy(km.centroids.copy()).to(device=z.device, dtype=z.dtype)


def build_ivf_index(embeddings: Tensor, nlist: int, *, sample: int | None = None, seed: int = 0):
    """A faiss ``IndexIVFFlat`` (inner product, uncompressed vectors) over the unit rows, its
    quantizer trained on a uniform ``sample``; on the GPU when the rows are on CUDA and faiss
    has GPU support (``faiss-gpu``), else on the CPU (logged)."""
    faiss = _faiss()
    n, d = embeddings.shape
    x = embeddings.detach().float().cpu().contiguous().numpy()
    pick = _training_rows(n, nlist, sample, seed).numpy()
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.train(x[pick])
    index.add(x)
    if embeddings.device.type == "cuda":
        if hasattr(faiss, "StandardGpuResources"):
            index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), embeddings.device.index or 0, index)
            log.info("IVF index on %s (faiss-gpu)", embeddings.device)
        else:
            log.info("IVF index on the CPU: this faiss has no GPU support (install faiss-gpu)")
    return index


def _cell_pairs(centroids: Tensor, nprobe: int) -> list[Tensor]:
    """For each cell ``a``, the cells ``b >= a`` that it meets (``b`` in ``a``'s probes or ``a`` in ``b``'s)."""
    nlist = centroids.shape[0]
    near = tiled_topk(centroids, centroids, nprobe)[1].cpu()  # includes the cell itself
    a = torch.arange(nlist).repeat_interleave(nprobe)
    b = near.reshape(-1)
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    key = torch.unique(torch.cat([lo * nlist + hi, torch.arange(nlist) * (nlist + 1)]))
    lo, hi = key // nlist, key % nlist
    ptr = torch.searchsorted(lo, torch.arange(nlist + 1))
    return [hi[ptr[c] : ptr[c + 1]] for c in range(nlist)]


def ivf_self_topk(
    z: Tensor,
    k: int,
    *,
    nlist: int | None = None,
    nprobe: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    refine: bool = True,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
    progress: bool | str = False,
    timings: dict | None = None,
    recall_target: float | None = None,
    recall_rows: int = DEFAULT_RECALL_ROWS,
    report: dict | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Approximate top-``k`` most similar other rows of ``z`` for every row (an IVF self-join).

    Scores are exact inner products of the rows (normalise ``z`` for cosine): only pairs whose
    cells never meet can be missed. Memory: the sorted copy of ``z``, ``O(N k)`` lists and one
    cell block (at most ``block^2`` scores).

    Args:
        z: ``(N, D)`` rows (unit for cosine), CPU or CUDA.
        k: neighbours per row, ``1 <= k < N``.
        nlist: cells (default :func:`default_join_nlist`); ``nlist <= N``.
        nprobe: cells each cell is joined with (its own included), ``<= nlist`` (default
            :func:`default_join_nprobe`, raised for ``recall_target``).
        sample: k-means training rows (default ``64 x nlist``, at most N; at least ``39 x nlist``).
        seed: the sample and the k-means seed.
        refine: one neighbours-of-neighbours round (:func:`refine_neighbours`).
        block: largest tile side.
        transform: an elementwise map of the inner products (symmetric in the pair; ``-inf``
            = never ranked), e.g. a ceiling or G3's ``f(x)`` in its band.
        target: ``(N,)`` positive factors of the pair's target: row ``i`` ranks ``j`` by
            ``transform(s_ij) * target[j]`` (G3's density penalty); each computed tile serves
            both directions, each with its own target.
        progress: progress bars with ETA over each stage (assign, join, probes, own probes, refine);
            a string labels them.
        timings: a dict that receives the seconds of each stage (``train``, ``assign``,
            ``join``, ``own_probes``, ``refine``; ``recall`` for the sampled exact rows).
        recall_target: with ``nprobe`` left to its default, the share of each row's exact
            top-``k`` the join must find. ``recall_rows`` sampled rows are ranked exactly
            against every row; the cells of their exact neighbours say, for any ``nprobe``,
            which of them the join would meet (its cell pairs and the row's own probes), so
            ``nprobe`` is the smallest power-of-two multiple of the default whose predicted
            recall reaches the target (the refining round only adds to it). Above
            ``nlist / 4`` cells (probed from both sides, a large share of all pairs) the rows
            are computed exactly instead: a simple bound, not a cost model. Either way ``recall_rows`` other sampled
            rows
            measure the recall of the result. Why: IVF's recall depends on the data, not only
            on its size (at 50k rows of MiniLM-like topics ``nprobe`` 32 finds 0.9999 of the
            top-10; on a Gaussian with the same covariance 0.88, and 0.99 needs 128 of 512
            cells), so settings fixed for one corpus fail on another. ``None``: ``nprobe`` as
            given or by default, nothing measured.
        recall_rows: rows sampled for the choice and as many for the measure (at most ``N``).
        report: a dict that receives what was chosen and measured: ``nprobe``,
            ``predicted_recall``, ``recall`` (measured), ``recall_rows``, ``exact``. After a
            fall-back to the exact scan ``exact`` is True, ``nprobe`` None and ``recall`` 1.0
            by construction (not measured).

    Returns:
        ``(values, indices)``, both ``(N, k)``, best first (ties: lowest index); a row with
        fewer than ``k`` candidates pads with ``-inf`` and index ``-1`` (rare: tiny cells only).

    Example:
        >>> z = torch.nn.functional.normalize(torch.randn(400, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> v, i = ivf_self_topk(z, 5, nlist=4, nprobe=4)  # every cell meets every cell: exact
        >>> bool((i == tiled_topk(z, z, 5, exclude_self=True)[1]).all())
        True
    """
    n = z.shape[0]
    k = check_positive_int(k, "k")
    if k >= n:
        raise ValueError(f"k={k} must be below the number of rows ({n})")
    if recall_target is not None and not 0.0 < float(recall_target) <= 1.0:
        raise ValueError(f"recall_target must be in (0, 1], got {recall_target}")
    recall_rows = check_positive_int(recall_rows, "recall_rows")
    nlist = default_join_nlist(n) if nlist is None else nlist
    chosen = nprobe is not None
    nprobe = default_join_nprobe(n, nlist) if nprobe is None else nprobe
    sample = check_ivf(n, nlist, nprobe, sample)
    clock = _Clock(timings)
    centroids = train_centroids(z, nlist, sample=sample, seed=seed)
    clock("train")
    assign = tiled_topk(z, centroids, 1, block=block, progress=progress and _stage(progress, "assign"))[1].squeeze(1)
    clock("assign")
    info: dict = {"nprobe": nprobe, "exact": False}
    if recall_target is not None:
        gen = torch.Generator().manual_seed(seed + 1)
        picks = torch.randperm(n, generator=gen)[: 2 * recall_rows]
        choose_rows, check_rows = picks[: len(picks) // 2].sort().values, picks[len(picks) // 2 :].sort().values
        if not chosen:
            choose_rows = choose_rows.to(z.device)
            ref = exact_rows(z, choose_rows, k, block, transform, target)
            nprobe, predicted = _choose_nprobe(z, choose_rows, ref, centroids, assign, nprobe, float(recall_target))
            info.update(nprobe=nprobe, predicted_recall=predicted)
        clock("recall")
        if nprobe is None:  # no nprobe up to max(default, nlist / 4) reaches the target
            log.info(
                "ivf join: recall %.3f needs more than nlist/4 = %d cells: exact tiled scan of %d rows",
                recall_target,
                nlist // 4,
                n,
            )
            del centroids, assign
            vals, out_i = _exact_self_topk(z, k, block, transform, target, progress, timings)
            clock.reset()  # the scan timed itself ("exact")
            info.update(exact=True, nprobe=None)
            _measure(z, vals, out_i, check_rows, k, block, transform, target, info, clock, recall_target, report)
            return vals, out_i
    order = torch.sort(assign, stable=True).indices
    counts = torch.bincount(assign, minlength=nlist)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).tolist()
    # the running lists in corpus order (row = passage id): the join works on sorted positions
    # and maps them through `order` when it merges, so no permuted copy of the lists is made
    best_v = z.new_full((n, k), float("-inf"))
    best_i = torch.full((n, k), -1, dtype=torch.long, device=z.device)  # corpus ids
    pairs = _cell_pairs(centroids, nprobe)
    clock("assign")
    bar = progress_bar(progress, n, "ivf join", "join")
    shared = dict(z=z, order=order, ptr=ptr, pairs=pairs, k=k, block=block, transform=transform, target=target)
    executor = current_executor()
    if executor is None:  # cell by cell, merged in place
        for a in range(nlist):
            _join_cell(shared, a, lambda rows, tv, ti: _merge_into(best_v, best_i, order[rows], tv, ti))
            if bar is not None:
                bar.update(ptr[a + 1] - ptr[a])
    else:  # groups of cells as independent tiles, each returning its merged lists
        groups = _cell_groups(ptr, pairs, 4 * getattr(executor, "parallelism", 2))
        for cells, (rows, tv, ti) in map_tiles(join_cells, shared, groups):
            _merge_into(best_v, best_i, order[rows], tv, ti)
            if bar is not None:
                bar.update(sum(ptr[a + 1] - ptr[a] for a in cells))
    if bar is not None:
        bar.close()
    clock("join")
    _own_probes(
        z, order, centroids, assign[order], pairs, ptr, nprobe, best_v, best_i, block, transform, target, progress
    )
    clock("own_probes")
    del shared
    # canonical lists (best first, ties lowest id, -1 where empty) whatever order the merges ran in
    vals, out_i = sort_topk_(best_v, best_i, empty=-1)
    if refine:
        vals, out_i = refine_neighbours(
            z,
            vals,
            out_i,
            block=block,
            transform=transform,
            target=target,
            inplace=True,
            progress=progress and _stage(progress, "refine"),
        )
        vals, out_i = sort_topk_(vals, out_i, empty=-1)  # the round's lists are unordered: canonical again
        clock("refine")
    log.info("ivf join: %d rows, nlist=%d, nprobe=%d, sample=%d, refine=%s", n, nlist, nprobe, sample, refine)
    if recall_target is not None:
        _measure(z, vals, out_i, check_rows, k, block, transform, target, info, clock, recall_target, report)
    elif report is not None:
        report.update(info)
    return vals, out_i


def exact_rows(
    z: Tensor,
    rows: Tensor,
    k: int,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
) -> Tensor:
    """Exact top-``k`` ids of ``rows`` against every other row of ``z``, ranked as :func:`self_topk`
    ranks them (``-1`` where a pair is never ranked): the reference :func:`sample_recall` compares with."""
    v, i, _ = tiled_pairs(z[rows], z, k, block=block, exclude=rows, score=_score(transform, target))
    return torch.where(torch.isfinite(v), i, torch.full_like(i, -1))


def sample_recall(indices: Tensor, rows: Tensor, exact: Tensor) -> float:
    """Share of the exact lists ``exact`` ``(R, k)`` of ``rows`` (``-1`` = none) found in ``indices[rows]``.

    Example:
        >>> sample_recall(torch.tensor([[1, 2], [0, 2], [0, 1]]), torch.tensor([0, 2]), torch.tensor([[2, 1], [1, -1]]))
        1.0
    """
    got = indices[rows]
    found = (exact.unsqueeze(2) == got.unsqueeze(1)).any(2) & (exact >= 0)
    return float(found.sum()) / max(1, int((exact >= 0).sum()))


def _ranks(sim: Tensor) -> Tensor:
    """Per row, the rank of each column by descending ``sim`` (ties: lowest column first)."""
    order = torch.sort(sim, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(sim.shape[1], device=sim.device).expand_as(order).contiguous())
    return ranks


def _choose_nprobe(
    z: Tensor, rows: Tensor, exact: Tensor, centroids: Tensor, assign: Tensor, start: int, target: float
) -> tuple[int | None, float]:
    """The smallest ``start x 2^j`` cells (at most ``max(start, nlist // 4)``) whose join would meet
    at least ``target`` of the sampled rows' exact neighbours; ``None`` if none would.

    A row in cell ``a`` meets a neighbour in cell ``c`` when ``c`` is among ``a``'s ``nprobe``
    nearest cells or ``a`` among ``c``'s (:func:`_cell_pairs`), or ``c`` among the row's own
    ``nprobe`` nearest centroids (:func:`_own_probes`): the smallest of those three ranks is the
    least ``nprobe`` that finds it. Returns ``(nprobe, predicted recall at it)``.
    """
    nlist = centroids.shape[0]
    cell_rank = _ranks(centroids @ centroids.T)
    own_rank = _ranks(z[rows] @ centroids.T)
    ok = exact >= 0
    a = assign[rows].unsqueeze(1).expand_as(exact)
    c = assign[exact.clamp_min(0)]
    need = torch.minimum(torch.minimum(cell_rank[a, c], cell_rank[c, a]), own_rank.gather(1, c))
    need = need.masked_fill(a == c, 0)[ok]
    total = max(1, need.numel())
    p, limit, predicted = start, max(start, nlist // 4), 1.0
    while p <= limit:
        predicted = float((need < p).sum()) / total
        if predicted >= target:
            return min(p, nlist), predicted
        p *= 2
    return None, predicted


def _measure(
    z: Tensor,
    vals: Tensor,
    out_i: Tensor,
    rows: Tensor,
    k: int,
    block: int,
    transform: Transform | None,
    target: Tensor | None,
    info: dict,
    clock: _Clock,
    recall_target: float,
    report: dict | None,
) -> None:
    """The recall of the built lists on ``rows`` (not those that chose ``nprobe``), logged and reported."""
    rows = rows.to(z.device)
    recall = 1.0 if info["exact"] else sample_recall(out_i, rows, exact_rows(z, rows, k, block, transform, target))
    clock("recall")
    info.update(recall=recall, recall_rows=len(rows), recall_target=recall_target)
    if recall < recall_target:
        log.warning(
            "ivf join: measured recall %.4f on %d sampled rows is below recall_target %.3f (nprobe=%s)",
            recall,
            len(rows),
            recall_target,
            info["nprobe"],
        )
    else:
        log.info("ivf join: recall %.4f on %d sampled rows (nprobe=%s)", recall, len(rows), info["nprobe"])
    if report is not None:
        report.update(info)


def _join_cell(shared: dict, a: int, sink: Callable[[object, Tensor, Tensor], None]) -> None:
    """Cell ``a`` joined with every cell it meets: the candidates of its rows, and of the met cells'
    rows against its rows (each pair once), passed to ``sink(rows, values, ids)`` (sorted positions)."""
    z, order, ptr, pairs, k = shared["z"], shared["order"], shared["ptr"], shared["pairs"], shared["k"]
    block, transform, target = shared["block"], shared["transform"], shared["target"]
    a0, a1 = ptr[a], ptr[a + 1]
    if a1 == a0:
        return
    cols = torch.cat([torch.arange(ptr[c], ptr[c + 1], device=z.device) for c in pairs[a].tolist()])
    col_ids = order[cols]
    kc = z[col_ids]  # the met cells' rows, gathered (no sorted copy of z is kept)
    za = z[order[a0:a1]]
    step = max(1, (block * block) // max(1, cols.numel()))
    for r0 in range(a0, a1, step):
        r1 = min(a1, r0 + step)
        s = za[r0 - a0 : r1 - a0] @ kc.T
        if transform is not None:
            s = transform(s)
        rows = torch.arange(r0, r1, device=z.device)
        s.masked_fill_(rows.unsqueeze(1) == cols, float("-inf"))
        # these rows of cell a against every cell a meets
        fwd = s if target is None else s * target[col_ids]
        tv, ti = merge_topk(fwd, col_ids.expand(s.shape[0], -1), min(k, s.shape[1]))
        sink(slice(r0, r1), tv, ti)
        # the other side: each row of a met cell b > a against these rows of a (each pair once)
        other = cols >= a1
        if bool(other.any()):
            st = s.T[other]
            if target is not None:
                st = st * target[order[rows]]
            tv, ti = merge_topk(st, order[rows].expand(st.shape[0], -1), min(k, st.shape[1]))
            sink(cols[other], tv, ti)


def join_cells(shared: dict, cells: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """A group of cells of the IVF join as one independent tile (:func:`~geograph.functional.allpairs.map_tiles`):
    returns the sorted positions it touched and their merged lists ``(rows, values (R, k), ids (R, k))``.
    Memory: one ``(N, k)`` list buffer for the group."""
    z, k = shared["z"], shared["k"]
    best_v = z.new_full((z.shape[0], k), float("-inf"))
    best_i = torch.full((z.shape[0], k), -1, dtype=torch.long, device=z.device)
    touched = torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)

    def sink(rows, tv: Tensor, ti: Tensor) -> None:
        _merge_into(best_v, best_i, rows, tv, ti)
        touched[rows] = True

    for a in cells:
        _join_cell(shared, a, sink)
    rows = touched.nonzero().squeeze(1)
    return rows, best_v[rows], best_i[rows]


def _cell_groups(ptr: list[int], pairs: list[Tensor], groups: int) -> list[list[int]]:
    """Consecutive cells cut into about ``groups`` groups of equal join work (rows x met rows)."""
    size = torch.tensor(ptr[1:]) - torch.tensor(ptr[:-1])
    work = torch.stack([size[a] * size[p].sum() for a, p in enumerate(pairs)]).double().cumsum(0)
    cut = torch.searchsorted(work, torch.linspace(0, float(work[-1]), groups + 1)[1:-1].double()).tolist()
    bounds = sorted(set([0] + [c + 1 for c in cut] + [len(pairs)]))
    return [list(range(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def _merge_into(best_v: Tensor, best_i: Tensor, rows, values: Tensor, ids: Tensor) -> None:
    """Merge candidates ``(R, c)`` into the running lists of ``rows`` (a slice or unique row ids), in place."""
    best_v[rows], best_i[rows] = merge_topk(
        torch.cat([best_v[rows], values], 1), torch.cat([best_i[rows], ids], 1), best_v.shape[1]
    )


class _Clock:
    """Seconds since the last call, recorded under a stage name (no-op without a dict)."""

    def __init__(self, out: dict | None) -> None:
        self.out, self.time = out, time.perf_counter
        self.last = self.time()

    def reset(self) -> None:
        """Start the next stage now (the time since the last call was recorded elsewhere)."""
        self.last = self.time()

    def __call__(self, stage: str) -> None:
        if self.out is not None:
            now = self.time()
            self.out[stage] = self.out.get(stage, 0.0) + now - self.last
            self.last = now


def _own_probes(
    z: Tensor,
    order: Tensor,
    centroids: Tensor,
    cell: Tensor,
    pairs: list[Tensor],
    ptr: list[int],
    nprobe: int,
    best_v: Tensor,
    best_i: Tensor,
    block: int,
    transform: Transform | None,
    target: Tensor | None,
    progress: bool | str = False,
) -> None:
    """Each row also meets the cells of its own ``nprobe`` nearest centroids that its cell did not meet
    (a row near a cell border): the per-query probing of an IVF index, on the few rows that need it.
    Rows are sorted positions; ``best_v`` / ``best_i`` are in corpus order (row ``order[r]``)."""
    nlist = centroids.shape[0]
    met = torch.zeros(nlist, nlist, dtype=torch.bool, device=z.device)
    for a, bs in enumerate(pairs):
        met[a, bs.to(z.device)] = True
    met |= met.T.clone()
    probes = tiled_topk(z, centroids, nprobe, block=block, progress=progress and _stage(progress, "probes"))[1][order]
    need = ~met[cell.unsqueeze(1), probes]
    rows, slot = need.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return
    cells = probes[rows, slot]
    by_cell = torch.sort(cells, stable=True)
    rows, cells = rows[by_cell.indices], by_cell.values
    bounds = torch.searchsorted(cells, torch.arange(nlist + 1, device=cells.device)).tolist()
    k = best_v.shape[1]
    bar = progress_bar(progress, rows.numel(), "ivf join", "own probes")
    for c in range(nlist):
        if bar is not None:
            bar.update(bounds[c + 1] - bounds[c])
        if bounds[c + 1] == bounds[c] or ptr[c + 1] == ptr[c]:
            continue
        r = rows[bounds[c] : bounds[c + 1]]
        members = torch.arange(ptr[c], ptr[c + 1], device=z.device)
        ids = order[members]
        zc = z[ids]
        step = max(1, (block * block) // members.numel())
        for r0 in range(0, r.numel(), step):
            rr = r[r0 : r0 + step]
            s = _rank(z[order[rr]] @ zc.T, transform, target, ids)
            tv, ti = merge_topk(s, ids.expand(s.shape[0], -1), min(k, s.shape[1]))
            _merge_into(best_v, best_i, order[rr], tv, ti)
    if bar is not None:
        bar.close()


def _stage(progress: bool | str, stage: str) -> str:
    """The label of one stage's bar: ``"<progress>: <stage>"``."""
    return f"{progress if isinstance(progress, str) else 'ivf join'}: {stage}"


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
        transform, target: how a pair is ranked (:func:`ivf_self_topk`).
        inplace: write into ``values`` / ``indices`` (same result; saves one copy of the lists).
        progress: a progress bar over the rows.

    Returns:
        the improved ``(values, indices)``, unordered within a row
        (:func:`~geograph.functional.allpairs.sort_topk` orders them).
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
        sc = _rank(sc, transform, target, cand.clamp_min(0)).masked_fill(cand < 0, float("-inf"))
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
