r"""Approximate all-pairs top-k for corpora of millions: an IVF cell join, re-scored exactly.

The corpus is split into ``nlist`` cells by spherical k-means trained on a uniform sample
(faiss's ``Kmeans``, :func:`~geograph.knn.faiss_ivf.train_centroids`); each cell is joined
with the ``nprobe`` cells whose centroids are nearest to its own, and the join is made symmetric
(cell ``a`` meets cell ``b`` when either probes the other, once), so every pair that is computed
updates both passages' lists. A join of two cells is one matrix product of uncompressed
vectors: the scores are exact, only pairs between cells that never meet are missed. One round of
neighbours-of-neighbours (:func:`~geograph.knn.nn_descent.refine_neighbours`) then
recovers most of those misses. This is the candidate source of ``index="ivf"`` in
:meth:`geograph.CorpusGraph.from_knn` and :meth:`geograph.G3Graph.build`
(:func:`~geograph.knn.build.self_topk`); the exact source is
:func:`~geograph.knn.exact.exact_self_topk`.

Why not ``faiss.IndexIVFFlat.search`` for the self-join: it scans each query's lists one vector
at a time; grouping the queries of a cell turns the same work into matrix products (about
2-3x faster on two CPU cores, and the same code runs on CUDA). Queries that are not corpus
passages (:class:`geograph.DenseRetriever`) use faiss's index directly
(:func:`~geograph.knn.faiss_ivf.build_ivf_index`).

References:
    Johnson, Douze, Jegou, "Billion-scale similarity search with GPUs", IEEE Trans. Big Data
    2019 (arXiv:1702.08734): all-vs-all IVF search for k-NN graphs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from geograph._checks import check_positive_int
from geograph.knn.allpairs import (
    DEFAULT_BLOCK,
    current_executor,
    map_tiles,
    progress_bar,
    sort_topk_,
    tiled_topk,
)
from geograph.knn.exact import exact_rows, exact_self_topk
from geograph.knn.faiss_ivf import train_centroids
from geograph.knn.ivf_recall import choose_nprobe, measure_recall
from geograph.knn.nn_descent import refine_neighbours
from geograph.knn.policy import (
    KEPT_PROBES,
    LADDER_LOWEST,
    RECALL_MARGIN_SE,
    IVFOptions,
    IVFReport,
    SelfTopk,
    StageClock,
    Transform,
    check_ivf,
    default_join_nlist,
    default_join_nprobe,
    log,
)
from geograph.knn.select import TileOffers, new_lists, offer_lists, offer_rows

__all__ = ["ivf_self_topk", "join_cells"]


def ivf_self_topk(
    z: Tensor,
    k: int,
    options: IVFOptions | None = None,
    *,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
    progress: bool | str = False,
) -> SelfTopk:
    r"""Approximate top-``k`` most similar other rows of ``z`` for every row (an IVF self-join).

    Scores are exact inner products of the rows (normalise ``z`` for cosine): only pairs whose
    cells never meet can be missed. Memory: the sorted copy of ``z``, ``O(N k)`` lists and one
    cell block (at most ``block^2`` scores).

    With ``options.recall_target`` and ``nprobe`` left to its default, ``recall_rows`` sampled
    rows are ranked exactly against every row; the cells of their exact neighbours say, for any
    ``nprobe``, which of them the join would meet (its cell pairs and the row's own probes), so
    ``nprobe`` is the least count of cells (from :data:`~geograph.knn.policy.LADDER_LOWEST` up)
    whose predicted recall clears the target by :data:`~geograph.knn.policy.RECALL_MARGIN_SE`
    standard errors (:func:`~geograph.knn.ivf_recall.choose_nprobe`), and the refining round is
    skipped (``refine=None``): the join is exact on the pairs it scores, so the prediction is its
    recall, and a 0.98 target delivers about 0.98, not the 0.9999 that a fixed ``nprobe`` and a
    refining round would pay for. Above ``nlist / 4`` cells (probed from both sides, a large share of all
    pairs) the rows are computed exactly instead: a simple bound, not a cost model. Either way
    ``recall_rows`` other sampled rows measure the recall of the result. Why: IVF's recall
    depends on the data, not only on its size (at 50k rows of MiniLM-like topics ``nprobe`` 32
    finds 0.9999 of the top-10; on a Gaussian with the same covariance 0.88, and 0.99 needs 128
    of 512 cells), so settings fixed for one corpus fail on another.

    Args:
        z: ``(N, D)`` rows (unit for cosine), CPU or CUDA.
        k: neighbours per row, ``1 <= k < N``.
        options: the join's settings (:class:`~geograph.knn.policy.IVFOptions`;
            default: every default, no recall target).
        block: largest tile side.
        transform: an elementwise map of the inner products (symmetric in the pair; ``-inf``
            = never ranked), e.g. a ceiling or G3's ``f(x)`` in its band.
        target: ``(N,)`` positive factors of the pair's target: row ``i`` ranks ``j`` by
            ``transform(s_ij) * target[j]`` (G3's density penalty); each computed tile serves
            both directions, each with its own target.
        progress: progress bars with ETA over each stage (assign, join, probes, own probes, refine);
            a string labels them.

    Returns:
        :class:`~geograph.knn.policy.SelfTopk`: ``values``, ``indices`` ``(N, k)``,
        best first (ties: lowest index; a row with fewer than ``k`` candidates pads with
        ``-inf`` and index ``-1``, rare: tiny cells only), the seconds of each stage
        (``train``, ``assign``, ``join``, ``own_probes``, ``merge``, ``refine``; ``recall`` for the sampled
        exact rows; ``exact`` after a fall-back), the join's ``cells`` (centroids and every row's
        cell, for updates; ``None`` after a fall-back) and the
        :class:`~geograph.knn.policy.IVFReport` (after a fall-back to the exact scan
        ``exact`` is True, ``nprobe`` None and ``recall`` 1.0 by construction, not measured).

    Example:
        >>> z = torch.nn.functional.normalize(torch.randn(400, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> out = ivf_self_topk(z, 5, IVFOptions(nlist=4, nprobe=4))  # every cell meets every cell: exact
        >>> bool((out.indices == tiled_topk(z, z, 5, exclude_self=True)[1]).all()), out.ivf.as_dict()
        (True, {'nprobe': 4, 'exact': False})
    """
    opts = IVFOptions() if options is None else options
    n = z.shape[0]
    k = check_positive_int(k, "k")
    if k >= n:
        raise ValueError(f"k={k} must be below the number of rows ({n})")
    recall_target = opts.recall_target
    if recall_target is not None and not 0.0 < float(recall_target) <= 1.0:
        raise ValueError(f"recall_target must be in (0, 1], got {recall_target}")
    recall_rows = check_positive_int(opts.recall_rows, "recall_rows")
    nlist = default_join_nlist(n) if opts.nlist is None else opts.nlist
    nprobe = default_join_nprobe(n, nlist) if opts.nprobe is None else opts.nprobe
    sample = check_ivf(n, nlist, nprobe, opts.sample)
    seed = opts.seed
    clock = StageClock()
    centroids = train_centroids(z, nlist, sample=sample, seed=seed)
    clock("train")
    # each row's nearest centroids: the first is its cell, the first nprobe its own probes (kept
    # when few, so the own-probes stage does not score every row against every centroid again)
    keep = min(nlist, KEPT_PROBES if opts.nprobe is None else nprobe)
    keep = keep if 1 <= keep <= KEPT_PROBES else 1
    ranked = tiled_topk(z, centroids, keep, block=block, progress=progress and _stage(progress, "assign"))[1]
    assign = ranked[:, 0].contiguous()
    near: Tensor | None = ranked.to(torch.int32) if keep > 1 else None
    del ranked
    clock("assign")
    predicted = None
    check_ref: Tensor | None = None  # the exact lists of the rows that measure the recall

    flops: dict[str, float] = {}

    def measured(
        values: Tensor,
        indices: Tensor,
        probes: int | None,
        goal: float,
        *,
        exact: bool,
        cells: tuple[Tensor, Tensor] | None = None,
    ) -> SelfTopk:
        # the lists with the report of a recall target: their recall measured on other sampled rows
        report = measure_recall(
            z,
            indices,
            check_rows,
            k,
            nprobe=probes,
            exact=exact,
            predicted=predicted,
            recall_target=goal,
            block=block,
            transform=transform,
            target=target,
            reference=check_ref,
        )
        clock("recall")
        return SelfTopk(values, indices, clock.seconds, report, flops, cells)

    if recall_target is not None:
        gen = torch.Generator().manual_seed(seed + 1)
        picks = torch.randperm(n, generator=gen)[: 2 * recall_rows]
        choose_rows, check_rows = picks[: len(picks) // 2].sort().values, picks[len(picks) // 2 :].sort().values
        probe: int | None = nprobe
        if opts.nprobe is None:
            # the exact lists of both samples in one pass over the rows (the check's kept for later)
            choose_rows = choose_rows.to(z.device)
            both = exact_rows(z, torch.cat([choose_rows, check_rows.to(z.device)]), k, block, transform, target)
            ref, check_ref = both[: len(choose_rows)], both[len(choose_rows) :]
            probe, predicted = choose_nprobe(
                z,
                choose_rows,
                ref,
                centroids,
                assign,
                nprobe,
                float(recall_target),
                lowest=LADDER_LOWEST,
                margin=RECALL_MARGIN_SE,
            )
        clock("recall")
        if probe is None:  # no nprobe up to max(default, nlist / 4) reaches the target
            log.info(
                "ivf join: recall %.3f needs more than nlist/4 = %d cells: exact tiled scan of %d rows",
                recall_target,
                nlist // 4,
                n,
            )
            del centroids, assign, near
            scan = exact_self_topk(z, k, block=block, transform=transform, target=target, progress=progress)
            clock.seconds["exact"] = clock.seconds.get("exact", 0.0) + scan.seconds["exact"]
            clock.reset()  # the scan timed itself ("exact")
            return measured(scan.values, scan.indices, None, recall_target, exact=True)
        nprobe = probe
    # the refining round only where it pays: not after the join alone is predicted to reach the target
    refine = (predicted is None) if opts.refine is None else opts.refine
    order = torch.sort(assign, stable=True).indices
    counts = torch.bincount(assign, minlength=nlist)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).tolist()
    # the running lists in corpus order (row = passage id): the join works on sorted positions
    # and maps them through `order` when it merges, so no permuted copy of the lists is made
    best_v, best_i = new_lists(n, k, z)  # the running lists (sorted or heaps on CPU: :mod:`geograph.knn.select`)
    pairs = _cell_pairs(centroids, nprobe)
    clock("assign")
    bar = progress_bar(progress, n, "ivf join", "join")
    # the rows in cell order: a cell's rows, and the met cells' rows, are slices of it (copied
    # contiguously, not gathered row by row)
    zs = z.index_select(0, order)
    shared = dict(zs=zs, order=order, ptr=ptr, pairs=pairs, k=k, block=block, transform=transform, target=target)
    executor = current_executor()
    if executor is None:  # cell by cell, into the lists in place
        work = _Workspace(zs)
        with TileOffers(best_v, best_i) as offers:
            for a in range(nlist):
                _join_cell(shared, a, offers, work=work)
                if bar is not None:
                    bar.update(ptr[a + 1] - ptr[a])
    else:  # groups of cells as independent tiles, each returning its own lists
        groups = _cell_groups(ptr, pairs, 4 * getattr(executor, "parallelism", 2))
        for cells, (rows, tv, ti) in map_tiles(join_cells, shared, groups):
            offer_lists(best_v, best_i, rows, tv, ti)
            if bar is not None:
                bar.update(sum(ptr[a + 1] - ptr[a] for a in cells))
    if bar is not None:
        bar.close()
    clock("join")
    d = z.shape[1]
    size = torch.tensor(ptr[1:]) - torch.tensor(ptr[:-1])
    flops = {"join": 2.0 * d * float(sum(int(size[a]) * int(size[b].sum()) for a, b in enumerate(pairs)))}
    own = None if near is None or nprobe > near.shape[1] else near[order, :nprobe].long()
    del near
    flops["own_probes"] = (
        2.0
        * d
        * _own_probes(
            zs,
            order,
            centroids,
            assign[order],
            pairs,
            ptr,
            nprobe,
            best_v,
            best_i,
            block,
            transform,
            target,
            progress,
            probes=own,
        )
    )
    clock("own_probes")
    del shared, zs
    # canonical lists (best first, ties lowest id, -1 where empty) whatever order the merges ran in
    vals, out_i = sort_topk_(best_v, best_i, empty=-1)
    clock("merge")
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
    kept = (centroids, assign)  # handed back for a graph's updates (not trained again)
    if recall_target is not None:
        return measured(vals, out_i, nprobe, recall_target, exact=False, cells=kept)
    return SelfTopk(vals, out_i, clock.seconds, IVFReport(nprobe=nprobe, exact=False), flops, kept)


def _stage(progress: bool | str, stage: str) -> str:
    """The label of one stage's bar: ``"<progress>: <stage>"``."""
    return f"{progress if isinstance(progress, str) else 'ivf join'}: {stage}"


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


class _Workspace:
    """Buffers one cell after another reuses (a tile's scores): allocating them afresh for every
    cell costs page faults of the same order as writing into them. One per thread
    of work (never shared by two running cells)."""

    def __init__(self, like: Tensor) -> None:
        self.like = like
        self.scores = like.new_empty(0)

    def take(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """A contiguous tensor of ``shape`` on the buffer ``name`` (grown when too small)."""
        size = 1
        for n in shape:
            size *= n
        buf: Tensor = getattr(self, name)
        if buf.numel() < size:
            buf = self.like.new_empty(max(size, int(1.25 * buf.numel())))
            setattr(self, name, buf)
        return buf[:size].view(shape)


def _join_cell(
    shared: dict[str, Any],
    a: int,
    offers: TileOffers,
    touched: Tensor | None = None,
    work: _Workspace | None = None,
) -> None:
    """Cell ``a`` joined with every cell it meets, offered to the running lists of ``offers`` (rows
    are corpus ids): its rows' candidates, and the met cells' rows' candidates among its rows (each
    pair once: only cells ``b > a`` get the other side). ``touched`` marks the lists it offered to;
    ``work``: buffers reused from the cell before (none: fresh ones)."""
    zs, order, ptr, pairs = shared["zs"], shared["order"], shared["ptr"], shared["pairs"]
    block, transform, target = shared["block"], shared["transform"], shared["target"]
    a0, a1 = ptr[a], ptr[a + 1]
    if a1 == a0:
        return
    work = _Workspace(zs) if work is None else work
    met = pairs[a].tolist()  # ascending, ``a`` first: the own cell's columns, then the cells b > a
    bounds = [(ptr[c], ptr[c + 1]) for c in met]
    col_ids = torch.cat([order[lo:hi] for lo, hi in bounds])
    width = col_ids.numel()
    za = zs[a0:a1]
    col_scale = None if target is None else target[col_ids]
    step = max(1, (block * block) // max(1, width))
    for r0 in range(a0, a1, step):
        r1 = min(a1, r0 + step)
        # one product per met cell, each into its columns of the tile: no copy of the met rows
        s = work.take("scores", (r1 - r0, width))
        off = 0
        for lo, hi in bounds:
            torch.mm(za[r0 - a0 : r1 - a0], zs[lo:hi].T, out=s[:, off : off + hi - lo])
            off += hi - lo
        if transform is not None:
            s = transform(s)
        ids = order[r0:r1]
        offers.tile(
            s,
            ids,
            col_ids,
            a1 - a0,
            exclude_self=True,
            row_scale=None if target is None else target[ids],
            col_scale=col_scale,
        )
    if touched is not None:
        touched[order[a0:a1]] = True
        touched[col_ids[a1 - a0 :]] = True


def join_cells(shared: dict[str, Any], cells: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """A group of cells of the IVF join as one independent tile (:func:`~geograph.knn.allpairs.map_tiles`):
    returns the rows (corpus ids) it offered candidates to and their lists ``(rows, values (R, k),
    ids (R, k))``, unordered within a row. Memory: one ``(N, k)`` list buffer for the group."""
    zs, k = shared["zs"], shared["k"]
    best_v, best_i = new_lists(zs.shape[0], k, zs)
    touched = torch.zeros(zs.shape[0], dtype=torch.bool, device=zs.device)
    work = _Workspace(zs)
    with TileOffers(best_v, best_i) as offers:
        for a in cells:
            _join_cell(shared, a, offers, touched, work)
    rows = touched.nonzero().squeeze(1)
    return rows, best_v[rows], best_i[rows]


def _cell_groups(ptr: list[int], pairs: list[Tensor], groups: int) -> list[list[int]]:
    """Consecutive cells cut into about ``groups`` groups of equal join work (rows x met rows)."""
    size = torch.tensor(ptr[1:]) - torch.tensor(ptr[:-1])
    work = torch.stack([size[a] * size[p].sum() for a, p in enumerate(pairs)]).double().cumsum(0)
    cut = torch.searchsorted(work, torch.linspace(0, float(work[-1]), groups + 1)[1:-1].double()).tolist()
    bounds = sorted(set([0] + [c + 1 for c in cut] + [len(pairs)]))
    return [list(range(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def _own_probes(
    zs: Tensor,
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
    probes: Tensor | None = None,
) -> int:
    """Each row also meets the cells of its own ``nprobe`` nearest centroids that its cell did not meet
    (a row near a cell border): the per-query probing of an IVF index, on the few rows that need it.
    ``zs`` is ``z`` in cell order (row ``r`` is passage ``order[r]``); ``best_v`` / ``best_i`` are
    in corpus order; ``probes``: ``(N, nprobe)`` each row's nearest centroids in cell order, best
    first (ties: lowest id), when the assignment kept them (else computed here).
    Returns the pairs of rows it scored."""
    nlist = centroids.shape[0]
    met = torch.zeros(nlist, nlist, dtype=torch.bool, device=zs.device)
    for a, bs in enumerate(pairs):
        met[a, bs.to(zs.device)] = True
    met |= met.T.clone()
    if probes is None:
        probes = tiled_topk(zs, centroids, nprobe, block=block, progress=progress and _stage(progress, "probes"))[1]
    need = ~met[cell.unsqueeze(1), probes]
    rows, slot = need.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return 0
    cells = probes[rows, slot]
    by_cell = torch.sort(cells, stable=True)
    rows, cells = rows[by_cell.indices], by_cell.values
    bounds = torch.searchsorted(cells, torch.arange(nlist + 1, device=cells.device)).tolist()
    scored = 0
    bar = progress_bar(progress, rows.numel(), "ivf join", "own probes")
    for c in range(nlist):
        if bar is not None:
            bar.update(bounds[c + 1] - bounds[c])
        if bounds[c + 1] == bounds[c] or ptr[c + 1] == ptr[c]:
            continue
        r = rows[bounds[c] : bounds[c + 1]]
        ids = order[ptr[c] : ptr[c + 1]]
        zc = zs[ptr[c] : ptr[c + 1]]
        scored += r.numel() * ids.numel()
        step = max(1, (block * block) // ids.numel())
        scale = None if target is None else target[ids]
        for r0 in range(0, r.numel(), step):
            rr = r[r0 : r0 + step]
            s = zs.index_select(0, rr) @ zc.T
            if transform is not None:
                s = transform(s)
            offer_rows(best_v, best_i, order[rr], s, ids, scale=scale)
    if bar is not None:
        bar.close()
    return scored
