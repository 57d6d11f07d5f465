r"""Adding and removing passages of a :class:`~geograph.G3Graph` in place, recomputing only the rows a change can move.

G3's weights ``W_ij = f(S_ij) p_j`` (``f(x) = x sqrt(1 - x^2)`` in the band, ``p_j = e^{-beta rho_j}``)
depend on the density ``rho``, which every passage moves (its raw sums, and their min-max
normalisation), so every penalty changes with every update. The update keeps
(:class:`G3State`):

- the raw density sums ``sum_{k != j} max(0, S_jk)`` of every passage (float64). An exact
  build's terms lie on the grid of :data:`~geograph.geometry.gain.DENSITY_UNIT`, where float64
  sums are exact, so the update moves them to the fresh build's bits by the ``(new x all)`` /
  ``(kept x removed)`` blocks of the change; a build whose density was sampled (the IVF build) updates the signed part
  ``z_j . sum_k z_k`` exactly (``O(N D)``) and the negative part from a sample of the changed
  passages at the build's rate (the rows at the minimum and maximum were summed exactly by
  the build and move by these estimates, so that no column's penalty jumps). The sums are then
  min-max normalised again (``O(N)``);
- every row's top-``K'`` list **by weight** under the penalties it was made with (the values
  are ``f(S_ij)``, the indices the columns) and a bound ``cut_i``: every pair outside the list
  weighs at most ``cut_i`` (0: the list holds every positive weight of the row);
- for an IVF build, its cells (:class:`~geograph.knn.ivf_place.IVFCells`).

An update makes each row's new weights from its list (``O(K')``) and the new passages' columns
(the blocks above for an exact graph; the rows of the cells each new passage meets for an IVF
graph). A pair outside both weighed at most ``cut_i`` before; its new weight is its old one times
``p'_j / p_j``, at most ``R = max_j p'_j / p_j``: **one bound for all rows** (the change of every
penalty is the change of the normalisation, the same for every ``j``, and the changed passages'
own share of ``raw_j``, small for most ``j``). A row whose ``max_degree``-th new weight is above
``cut_i R`` (and above the best new column it did not keep) is **certified**. An IVF graph's row
that ``R`` does not prove is tried again with its own factor ``R_i <= R``: the largest ratio over
the rows of the cells it meets (its cell's, and its own ``nprobe`` nearest: the only columns its
list is drawn from, and made again from), as the changed passages move the density of their own
cells most. A certified row's row of ``T`` is the exact build's (for an IVF graph: the IVF
build's, up to the join's misses). A row it cannot prove is recomputed, against the rows of the
cells it meets (IVF: ``from_cells``) or against every passage (exact: ``redone``), and keeps a
fresh list. :class:`G3UpdateReport` counts them.

Costs: exact graph ``O(N M D + R N D + N K')``, IVF graph ``O(M C D + R C D + N (K' + D))`` for
``M`` changed passages, ``R`` recomputed rows and ``C`` rows in the cells a row meets (about
``2 nprobe N / nlist``). A graph without the state (loaded from disk, or reordered) makes it once:
an exact graph by two all-pairs passes (its lists, then its exact density sums), an IVF graph
from its build (kept) or, loaded, by one IVF join (the lists are not saved).
``max_degree=None`` (the full ``T``) is rebuilt from the kept density: every weight of it moves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from geograph.geometry.gain import (
    DENSITY_UNIT,
    _row_normalised,
    _unit,
    _weights,
    density_sums,
    density_terms,
    gain_rank,
    gain_transition_edges,
)
from geograph.graphs.updates import appended, check_new_rows, kept_rows, passage_ids
from geograph.knn.allpairs import DEFAULT_BLOCK, merge_topk, sort_topk, tiled_pairs, tiled_topk
from geograph.knn.build import self_topk
from geograph.knn.ivf_place import IVFCells, cell_blocks, cell_scan, make_cells, place_rows
from geograph.knn.policy import AUTO_EXACT_MAX, DEFAULT_RECALL_TARGET, IVFOptions
from geograph.knn.update import _spans
from geograph.ops.similarity import minmax_normalize

if TYPE_CHECKING:
    from geograph.graphs.g3_graph import G3Graph
    from geograph.graphs.updates import PassageId

__all__ = ["G3State", "G3UpdateReport", "g3_add", "g3_remove", "g3_state", "DEFAULT_UPDATE_CANDIDATES"]

#: weight candidates a row keeps for updates unless told (twice ``max_degree``, at least this)
DEFAULT_UPDATE_CANDIDATES = 256

#: relative slack of the certificate: a row is proven when its ``max_degree``-th weight exceeds the
#: bound by more than this (the weights of the list and of the bound are rounded apart)
CERTIFICATE_SLACK = 1e-5

#: changed passages sampled (at least) for the negative part of a sampled density's change
MIN_DENSITY_SAMPLE = 64

#: the sampled change of the old rows' density keeps its noise near this, relative to the corpus:
#: ``fraction / sqrt(sample)`` for a change of ``fraction`` of the corpus (the sample grows with the
#: square of the fraction; at the minimum sample a 0.1% change is at 1.6e-4, a 1% change samples
#: about 1,100 changed passages). The noise moves every row's penalty at random, and the bound
#: ``R`` (the largest ratio of all rows) with the largest of them: a 1% change at the rate of the
#: build (82 of 2,000 at 200k passages) made ``R`` 1.008 where the change itself moved it 1.002.
#: The sample stays at most :data:`DENSITY_SAMPLE` (a change of over 2.7% of the corpus)
DENSITY_NOISE = 3e-4

#: rows of ``z`` a block of :func:`_sampled_sum`'s negative part takes at a time
SAMPLE_ROWS = 1 << 13

#: columns a density is taken to be sampled with when the graph does not say (the IVF build's default)
DENSITY_SAMPLE = 8192


@dataclass
class G3State:
    """What a :class:`~geograph.G3Graph` keeps to be updated.

    Attributes:
        raw: ``(N,)`` float64 raw density sums (exact, or the sampled estimate of the build).
        fvals: ``(N, K')`` ``f(S_ij)`` of each row's list, best weight first (``0`` past its end);
            ``None`` for the full ``T``.
        ids: ``(N, K')`` long columns of the lists (``-1`` past a row's end).
        cut: ``(N,)`` float64: every pair outside row ``i``'s list weighs at most ``cut_i`` under
            ``penalty`` (0: the list holds every positive weight).
        penalty: ``(N,)`` the penalties ``e^{-beta rho}`` the lists were ranked by.
        cells: the cells of an IVF build (local updates), or ``None`` (exact: every passage).
        sample_rate: columns sampled per passage for the density (``None``: exact sums).
    """

    raw: Tensor
    fvals: Tensor | None
    ids: Tensor | None
    cut: Tensor | None
    penalty: Tensor
    cells: IVFCells | None = None
    sample_rate: float | None = None

    @property
    def width(self) -> int:
        return 0 if self.ids is None else int(self.ids.shape[1])

    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        """Apply a module's ``_apply`` function (``.to()``, ``.cuda()``) to the state's tensors."""
        self.raw = fn(self.raw)
        self.penalty = fn(self.penalty)
        if self.fvals is not None and self.ids is not None and self.cut is not None:
            self.fvals, self.ids, self.cut = fn(self.fvals), fn(self.ids), fn(self.cut)
        if self.cells is not None:
            self.cells.apply(fn)


@dataclass(frozen=True)
class G3UpdateReport:
    """What a G3 update did.

    Attributes:
        added, removed, num_nodes: passages added, removed, and after the update.
        certified: existing rows of ``T`` proven from their kept lists and the new columns
            (their weights recomputed from the list, ``O(K')`` a row).
        changed: certified rows whose edges (columns) changed.
        from_cells: rows recomputed against the rows of the cells they meet (IVF graphs).
        redone: rows recomputed against every passage (exact graphs).
        scanned: new rows, listed against the cells they meet (IVF) or every passage (exact).
        bound: the one factor ``R = max_j p'_j / p_j`` every outside weight was bounded by (an
            IVF graph's rows: by the largest over the cells they meet, at most this).
        seconds: wall time.
    """

    added: int
    removed: int
    num_nodes: int
    certified: int
    changed: int
    from_cells: int
    redone: int
    scanned: int
    bound: float
    seconds: float


def _penalty(raw: Tensor, beta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The density ``rho`` (in ``dtype``) of raw sums and its penalties ``e^{-beta rho}``, as the build makes them."""
    rho = minmax_normalize(raw, lo=raw.min(), hi=raw.max(), clip=True).to(dtype)
    return rho, torch.exp(-beta * rho)


def _width(graph: G3Graph, width: int | None) -> int:
    d = graph.max_degree or 0
    return max(2 * d, DEFAULT_UPDATE_CANDIDATES) if width is None else max(int(width), d)


def _padded(v: Tensor, i: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Lists of fewer than ``width`` columns padded with ``-inf`` / ``-1``."""
    if v.shape[1] >= width:
        return v, i
    pad = width - v.shape[1]
    return torch.cat([v, v.new_full((v.shape[0], pad), float("-inf"))], 1), torch.cat(
        [i, i.new_full((i.shape[0], pad), -1)], 1
    )


def _f_of(z: Tensor, rows: Tensor, ids: Tensor, band: tuple[float, float] | None, block: int) -> Tensor:
    """``f(S_ij)`` of the pairs ``(rows[r], ids[r, c])`` (0 where ``ids`` is ``-1``): one dot product a
    listed pair, by chunks of about ``block^2 / D`` pairs."""
    out = torch.zeros(ids.shape, dtype=z.dtype, device=z.device)
    r, c = (ids >= 0).nonzero(as_tuple=True)
    step = max(1, (block * block) // (4 * z.shape[1]))
    for p0 in range(0, r.numel(), step):
        rr, cc = r[p0 : p0 + step], c[p0 : p0 + step]
        s = (z[rows[rr]] * z[ids[rr, cc]]).sum(1)
        out[rr, cc] = _weights(s, 1.0, band)
    return out


def _lists_from(
    z: Tensor,
    rows: Tensor,
    w: Tensor,
    ids: Tensor,
    width: int,
    n_others: int,
    band: tuple[float, float] | None,
    block: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Lists made by a scan ranked by weight: ``(f, ids, cut)``; entries of weight 0 dropped; the cut
    is the last weight of a full scan (``width`` of ``n_others``), else 0."""
    full = torch.isfinite(w).sum(1) >= width
    cut = torch.where(full & (width < n_others), w[:, -1].clamp_min(0).double(), torch.zeros_like(w[:, -1]).double())
    ids = ids.masked_fill(~(w > 0), -1)
    return _f_of(z, rows, ids, band, block), ids, cut


def g3_state(graph: G3Graph, block: int = DEFAULT_BLOCK, width: int | None = None) -> G3State:
    """The graph's update state, made by two all-pairs passes when it has none (``width``: the
    list length, default ``max(2 max_degree, DEFAULT_UPDATE_CANDIDATES)``)."""
    state: G3State | None = getattr(graph, "update_state", None)
    if state is not None:
        if state.raw.device != graph.device:  # the graph was moved with .to()
            state.apply(lambda t: t.to(graph.device))
        return state
    z = _unit(graph.embeddings)
    n = z.shape[0]
    if graph.max_degree is not None and n > AUTO_EXACT_MAX:  # a large graph without its build's state
        state = _ivf_state_again(graph, z, _width(graph, width), block)
    elif graph.max_degree is None:
        raw = density_sums(z, z, block=block, exclude=True)
        state = G3State(raw, None, None, None, _penalty(raw, graph.beta, z.dtype)[1])
    else:
        k = _width(graph, width)
        rho = graph.density.to(z)
        penalty = torch.exp(-graph.beta * rho)
        band = graph.band
        v, i, _ = tiled_pairs(z, z, min(k, n - 1), block=block, exclude=True, score=_ranker(penalty, band))
        v, i = _padded(v, i, k)
        f, ids, cut = _lists_from(z, torch.arange(n, device=z.device), v, i, k, n - 1, band, block)
        # the raw sums by the build's own pass (exact on its grid), not the lists' tiles
        state = G3State(density_sums(z, z, block=block, exclude=True), f, ids, cut, penalty)
    graph.update_state = state
    return state


def _ivf_state_again(graph: G3Graph, z: Tensor, width: int, block: int) -> G3State:
    """The state of a large graph that has none (loaded): the weight lists of an IVF join under its
    density (the cost of the IVF build's join, not an all-pairs pass), its cells and a density
    taken as sampled at the IVF build's default rate."""
    penalty = torch.exp(-graph.beta * graph.density.to(z))
    lists = self_topk(
        z,
        width,
        index="ivf",
        ivf=IVFOptions(recall_target=DEFAULT_RECALL_TARGET),
        block=block,
        transform=gain_rank(graph.band),
        target=penalty,
    )
    report = lists.ivf
    if report is not None and report.exact:  # the join fell back to the exact scan: exact lists
        f, ids, cut = _lists_from(
            z,
            torch.arange(z.shape[0], device=z.device),
            lists.values,
            lists.indices,
            width,
            z.shape[0] - 1,
            graph.band,
            block,
        )
        raw = _raw_of(graph, z, block)
        return G3State(raw, f, ids, cut, penalty, sample_rate=min(1.0, DENSITY_SAMPLE / z.shape[0]))
    cells = make_cells(z, nprobe=None if report is None else report.nprobe, block=block)
    return ivf_state(graph, z, lists.values, lists.indices, cells, DENSITY_SAMPLE, block=block)


def _raw_of(graph: G3Graph, z: Tensor, block: int) -> Tensor:
    """The raw sums of a graph's density scaled back: its minimum and maximum rows summed exactly."""
    rho = graph.density.to(torch.float64)
    ends = torch.stack([rho.argmin(), rho.argmax()])
    sums = density_sums(z[ends], z, block=block, exclude=ends)
    lo, hi = float(sums[0]), float(sums[1])
    raw = lo + rho * (hi - lo)
    raw[ends] = sums
    return raw


def ivf_state(
    graph: G3Graph,
    z: Tensor,
    values: Tensor,
    indices: Tensor,
    cells: IVFCells | None,
    sample: int,
    block: int = DEFAULT_BLOCK,
) -> G3State:
    """The update state of an IVF build from what it computed: its weight lists ``(N, K')``
    (ranked by ``W_ij`` under the build's penalties), its cells (``None``: the join fell back to
    the exact scan, whose lists are exact) and its density (``sample`` columns, 0 = exact). The
    raw sums are the density scaled back: the rows at its minimum and maximum are summed exactly
    (``O(N D)``), which fixes the normalisation's two ends."""
    n = z.shape[0]
    raw = _raw_of(graph, z, block)
    k = values.shape[1]
    penalty = torch.exp(-graph.beta * graph.density.to(z))
    # f from the join's weights (w / p): an IVF graph's lists are approximate anyway, and a dot
    # product a listed pair would cost a pass over N K' gathered rows
    ok = torch.isfinite(values) & (values > 0) & (indices >= 0)
    ids = indices.masked_fill(~ok, -1)
    f = (values / penalty[ids.clamp_min(0)]).masked_fill_(~ok, 0.0)
    full = torch.isfinite(values).sum(1) >= k
    cut = torch.where(full, values[:, -1].clamp_min(0).double(), torch.zeros(n, dtype=torch.float64, device=z.device))
    return G3State(raw, f, ids, cut, penalty, cells=cells, sample_rate=None if sample == 0 else sample / n)


def _one_cell(z: Tensor) -> IVFCells:
    """Every row in one cell: :func:`~geograph.knn.ivf_place.cell_blocks` then scans every row."""
    return IVFCells(z[:1], torch.zeros(z.shape[0], dtype=torch.long, device=z.device), 1)


def _sampled_sum(z: Tensor, zc: Tensor, rate: float, seed: int, *, change: bool = False) -> Tensor:
    """``sum_c max(0, <z_j, zc_c>)`` of every row ``j`` of ``z``: the signed part
    ``z_j . sum_c zc_c`` exactly, the negative part from a uniform sample of the rows of ``zc``
    (at least :data:`MIN_DENSITY_SAMPLE`, ``rate`` of them, and for the ``change`` of an update's
    old rows enough to keep its noise near :data:`DENSITY_NOISE`, up to :data:`DENSITY_SAMPLE`),
    scaled up (float64)."""
    # by row chunks through one float64 buffer: no float64 copy of z or zc
    chunk = z.new_empty((min(max(z.shape[0], zc.shape[0]), 1 << 12), z.shape[1]), dtype=torch.float64)
    total = torch.zeros(z.shape[1], dtype=torch.float64, device=z.device)
    for r0 in range(0, zc.shape[0], chunk.shape[0]):
        part = chunk[: min(chunk.shape[0], zc.shape[0] - r0)]
        total += part.copy_(zc[r0 : r0 + part.shape[0]]).sum(0)
    signed = torch.empty(z.shape[0], dtype=torch.float64, device=z.device)
    for r0 in range(0, z.shape[0], chunk.shape[0]):
        part = chunk[: min(chunk.shape[0], z.shape[0] - r0)]
        torch.mv(part.copy_(z[r0 : r0 + part.shape[0]]), total, out=signed[r0 : r0 + part.shape[0]])
    m = zc.shape[0]
    s = max(MIN_DENSITY_SAMPLE, math.ceil(rate * m))
    if change:  # at most the build's default sample: a large change costs the build's density pass
        s = max(s, min(DENSITY_SAMPLE, math.ceil((m / (z.shape[0] * DENSITY_NOISE)) ** 2)))
    s = min(m, s)
    pick = torch.randperm(m, generator=torch.Generator().manual_seed(seed))[:s].to(z.device)
    zs = zc[pick]
    neg = torch.empty(z.shape[0], dtype=torch.float64, device=z.device)
    for r0 in range(0, z.shape[0], SAMPLE_ROWS):
        r1 = min(z.shape[0], r0 + SAMPLE_ROWS)
        neg[r0:r1] = (z[r0:r1] @ zs.T).neg_().clamp_min_(0).sum(1, dtype=torch.float64)
    return signed + neg * (m / s)


def _new_raw(z: Tensor, n: int, state: G3State, block: int) -> Tensor:
    """The raw sums of ``z`` (``N + M`` rows, the last ``M`` new) after an addition."""
    m = z.shape[0] - n
    new_ids = torch.arange(n, n + m, device=z.device)
    if state.sample_rate is None:  # exact: the (new x all) blocks, both directions, on the build's grid
        fresh = torch.zeros(m, dtype=torch.float64, device=z.device)
        delta = torch.zeros(n + m, dtype=torch.float64, device=z.device)
        for q0 in range(0, m, block):
            q = new_ids[q0 : q0 + block]
            for c0 in range(0, n + m, block):
                t = density_terms(z[q], z[c0 : c0 + block])
                t.masked_fill_(q.unsqueeze(1) == torch.arange(c0, c0 + t.shape[1], device=z.device), 0.0)
                fresh[q - n] += t.sum(1, dtype=torch.float64)
                delta[c0 : c0 + t.shape[1]] += t.sum(0, dtype=torch.float64)
        # integer sums below 2^53: exact, so the result is the fresh build's bits
        return torch.cat([state.raw + delta[:n].mul_(DENSITY_UNIT), fresh.mul_(DENSITY_UNIT)])
    rate = state.sample_rate
    old = state.raw + _sampled_sum(z[:n], z[n:], rate, seed=n, change=True)
    fresh = _sampled_sum(z[n:], z, rate, seed=n + m) - 1.0  # the passage itself: S_jj = 1
    return torch.cat([old, fresh])


@dataclass
class _Extras:
    """The new columns an addition offers the old rows, by row (CSR): ``ptr`` ``(N + 1,)``, the
    weights ``w``, columns ``ids`` and ``f`` of each row's entries, at most ``width`` a row (its best
    by weight, ties by lowest column), and ``bound`` ``(N,)``: every offered column not kept weighs
    at most it (0 where all were kept)."""

    ptr: Tensor
    w: Tensor
    ids: Tensor
    f: Tensor
    bound: Tensor

    def rows(self, sel: Tensor) -> _Extras:
        """The entries of the rows ``sel`` (``(R,)`` long), in that order."""
        counts = (self.ptr[1:] - self.ptr[:-1])[sel]
        idx = _spans(self.ptr[sel], counts)
        ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        return _Extras(ptr, self.w[idx], self.ids[idx], self.f[idx], self.bound[sel])

    def dense(self, width: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(w, ids, f)`` as ``(N, width)`` rows (``-inf`` / ``-1`` / 0 past a row's entries)."""
        n = self.ptr.numel() - 1
        counts = self.ptr[1:] - self.ptr[:-1]
        row = torch.repeat_interleave(torch.arange(n, device=self.ptr.device), counts)
        slot = torch.arange(row.numel(), device=row.device) - self.ptr[row]
        w = self.w.new_full((n, width), float("-inf"))
        ids = torch.full((n, width), -1, dtype=torch.long, device=row.device)
        f = self.w.new_zeros((n, width))
        w[row, slot], ids[row, slot], f[row, slot] = self.w, self.ids, self.f
        return w, ids, f


def _cell_bounds(ratio: Tensor, cells: IVFCells) -> tuple[Tensor, Tensor]:
    """``(top, near)``: the largest penalty ratio ``p'_j / p_j`` of each cell's old rows
    (``(nlist,)``, ``-inf`` where none), and of the cells each old row's cell meets (``(N,)``)."""
    assign = cells.assign[: ratio.numel()]
    top = torch.full((cells.nlist,), -math.inf, dtype=torch.float64, device=ratio.device)
    top.scatter_reduce_(0, assign, ratio, "amax")
    met = torch.where(cells.met(), top.unsqueeze(0), torch.full_like(top, -math.inf).unsqueeze(0)).amax(1)
    return top, met[assign]


def _compiled_rows(t: Tensor) -> bool:
    """Whether an update's per-row passes run in the compiled kernels (CPU, not tracing)."""
    from geograph.knn.select import compiled

    return compiled(t)


def _remade(
    graph: G3Graph,
    z: Tensor,
    embeddings: Tensor,
    state: G3State,
    raw: Tensor,
    src: Tensor,
    renum: Tensor | None,
    extras: _Extras | None,
    fresh: tuple[Tensor, Tensor, Tensor] | None,
    cells: IVFCells | None,
    block: int,
    t0: float,
    added: int,
    removed: int,
) -> G3UpdateReport:
    """Certify every old row from its kept list (row ``src[r]`` of the state's lists, columns
    renumbered by ``renum``, ``-1`` = removed; ``None``: unchanged) and the new columns ``extras``,
    recompute the rest, append the new rows' lists ``fresh`` and make ``T``."""
    assert state.fvals is not None and state.ids is not None and state.cut is not None
    n_all = z.shape[0]
    d = int(graph.max_degree or 0)
    width = state.width
    rho, penalty = _penalty(raw, graph.beta, z.dtype)
    n_old = src.numel()
    ratio = penalty[:n_old].double() / state.penalty[src].double()
    bound = float(ratio.max()) if ratio.numel() else 1.0
    limit = state.cut[src] * bound
    if extras is not None:
        limit = torch.maximum(limit, extras.bound)
    m_f = 0 if fresh is None else int(fresh[1].shape[0])
    new_f, new_i, new_cut, ok = _certified(state, src, renum, penalty, extras, limit, d, n_all, m_f)
    again = (~ok).nonzero().squeeze(1)
    if cells is not None and again.numel():
        # an IVF row's list is drawn from the cells it meets (its cell's and its own nearest):
        # the rows the one bound did not prove are tried again under their cells' largest ratio
        top, near = _cell_bounds(ratio, cells)
        own = tiled_topk(z[again], cells.centroids.to(z), min(cells.nprobe, cells.nlist), block=block)[1]
        limit = state.cut[src[again]] * torch.maximum(near[again], top[own].amax(1))
        sub = None if extras is None else extras.rows(again)
        if sub is not None:
            limit = torch.maximum(limit, sub.bound)
        redo = _certified(state, src[again], renum, penalty, sub, limit, d, n_all)
        new_f[again], new_i[again], new_cut[again], ok[again] = redo
    todo = (~ok).nonzero().squeeze(1)
    if todo.numel():
        score = _ranker(penalty, graph.band)
        if cells is not None:
            rv, ri = cell_scan(z, todo, cells, width, score=score, block=block)
        else:
            rv, ri, _ = tiled_pairs(z[todo], z, min(width, n_all - 1), block=block, exclude=todo, score=score)
            rv, ri = _padded(rv, ri, width)
        rf, ri, rc = _lists_from(z, todo, rv, ri, width, n_all - 1 if cells is None else n_all, graph.band, block)
        new_f[todo], new_i[todo], new_cut[todo] = rf, ri, rc
    if fresh is not None:  # into the rows left for them
        new_f[n_old:], new_i[n_old:], new_cut[n_old:] = fresh
    changed = _set_t(graph, embeddings, rho, new_f, new_i, penalty, d, src, renum)
    state.raw, state.fvals, state.ids, state.cut, state.penalty = raw, new_f, new_i, new_cut, penalty
    certified = int(ok.sum())
    return G3UpdateReport(
        added,
        removed,
        n_all,
        certified,
        int((changed & ok).sum()),
        int(todo.numel()) if cells is not None else 0,
        int(todo.numel()) if cells is None else 0,
        m_f,
        bound,
        time.perf_counter() - t0,
    )


def _certified(
    state: G3State,
    src: Tensor,
    renum: Tensor | None,
    penalty: Tensor,
    extras: _Extras | None,
    limit: Tensor,
    d: int,
    n_all: int,
    tail: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(f, ids, cut, ok)`` of the old rows ``src`` (the new lists, cuts and verdicts), with ``tail``
    more rows of lists and cuts left for the new rows: by
    :func:`~geograph.graphs._g3_kernels.certify_kernel` on the CPU (one pass a row), else by
    whole-array torch passes (the same results)."""
    assert state.fvals is not None and state.ids is not None
    width = state.width
    if not _compiled_rows(penalty):
        fvals, ids = state.fvals[src], state.ids[src]
        if renum is not None:
            alive = (ids >= 0) & (renum[ids.clamp_min(0)] >= 0)
            ids = torch.where(alive, renum[ids.clamp_min(0)], torch.full_like(ids, -1))
            fvals = fvals.masked_fill(~alive, 0.0)
        new_f, new_i, new_cut, ok = _certified_torch(fvals, ids, penalty, extras, limit, d, n_all, width)
        return (
            torch.cat([new_f, new_f.new_empty((tail, width))]),
            torch.cat([new_i, new_i.new_empty((tail, width))]),
            torch.cat([new_cut, new_cut.new_empty(tail)]),
            ok,
        )
    from geograph.graphs._g3_kernels import certify_kernel
    from geograph.knn.select import _kernel_threads_held

    n_old = src.numel()
    fvals = state.fvals.contiguous()
    new_f = fvals.new_empty((n_old + tail, width))
    new_i = torch.empty((n_old + tail, width), dtype=torch.long)
    new_cut = torch.empty(n_old + tail, dtype=torch.float64)
    ok = torch.empty(n_old, dtype=torch.bool)
    if extras is None:
        none = fvals.new_empty(0)
        extras = _Extras(torch.zeros(n_old + 1, dtype=torch.long), none, src.new_empty(0), none, limit)
    lim = (limit * (1 + CERTIFICATE_SLACK)).to(fvals.dtype)
    args = (
        fvals,
        state.ids.contiguous(),
        src.contiguous(),
        src.new_empty(0) if renum is None else renum.contiguous(),
        penalty.contiguous(),
        extras.ptr.contiguous(),
        extras.w.to(fvals.dtype).contiguous(),
        extras.ids.contiguous(),
        extras.f.to(fvals.dtype).contiguous(),
        lim.contiguous(),
        limit.contiguous(),
    )
    with _kernel_threads_held() as threads:
        certify_kernel(
            *(a.numpy() for a in args),
            min(d, n_all - 1),
            n_all,
            max(1, min(n_old, 4 * threads)),
            new_f[:n_old].numpy(),
            new_i[:n_old].numpy(),
            new_cut[:n_old].numpy(),
            ok.numpy(),
        )
    return new_f, new_i, new_cut, ok


def _certified_torch(
    fvals: Tensor, ids: Tensor, penalty: Tensor, extras: _Extras | None, limit: Tensor, d: int, n_all: int, width: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`_certified` by whole-array passes on the rows' lists ``(fvals, ids)``, renumbered."""
    w = (fvals * penalty[ids.clamp_min(0)]).masked_fill_(ids < 0, float("-inf"))
    cand_w, cand_i, cand_f = w, ids, fvals
    if extras is not None:
        ew, ei, ef = extras.dense(width)
        cand_w, cand_i, cand_f = torch.cat([w, ew], 1), torch.cat([ids, ei], 1), torch.cat([fvals, ef], 1)
    # each entry keyed by (column, slot): ties fall by column as in the build, and f follows its slot
    c = cand_w.shape[1]
    key = cand_i.masked_fill(~torch.isfinite(cand_w), n_all) * c + torch.arange(c, device=w.device)
    v, key = sort_topk(*merge_topk(cand_w, key, min(width + 1, c)))
    i, f_sel = key // c, cand_f.gather(1, key % c)
    proven = (v > (limit * (1 + CERTIFICATE_SLACK)).to(v.dtype).unsqueeze(1)) & (v > 0)
    count = proven[:, :width].sum(1)
    ok = (count >= min(d, n_all - 1)) | (limit == 0)
    nxt = v.gather(1, count.clamp_max(v.shape[1] - 1).unsqueeze(1)).squeeze(1).clamp_min(0).double()
    nxt = torch.where(count < v.shape[1], nxt, torch.zeros_like(nxt))
    new_cut = torch.maximum(limit, nxt)
    keep_slot = torch.arange(width, device=w.device).unsqueeze(0) < count.unsqueeze(1)
    new_i = i[:, :width].masked_fill(~keep_slot, -1)
    new_f = f_sel[:, :width].masked_fill(~keep_slot, 0.0)
    return new_f, new_i, new_cut, ok


def _ranker(penalty: Tensor, band: tuple[float, float] | None) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda s, cols: _weights(s, penalty[cols], band)


def _store_t(
    graph: G3Graph,
    embeddings: Tensor,
    rho: Tensor,
    crow: Tensor,
    col: Tensor,
    weights: Tensor,
    normalised: bool = False,
) -> None:
    """Give the graph its corpus, density and ``T`` (CSR; the weights normalised by row here unless
    they are already)."""
    graph.embeddings = embeddings
    graph.density = rho.to(embeddings.dtype)
    graph.crow, graph.col = crow, col
    graph.val = (weights if normalised else _row_normalised(crow, weights)).to(embeddings.dtype)
    graph._update_width()
    graph.corpus_version += 1


def _set_t(
    graph: G3Graph,
    embeddings: Tensor,
    rho: Tensor,
    fvals: Tensor,
    ids: Tensor,
    penalty: Tensor,
    d: int,
    src: Tensor,
    renum: Tensor | None,
) -> Tensor:
    """``T`` from the first ``d`` entries of every list (weights ``f p``, positive only), in CSR
    order; returns whether each old row's columns changed (row ``r`` had the edges of the old row
    ``src[r]``, their columns renumbered by ``renum``). On the CPU by the kernels of
    :mod:`~geograph.graphs._g3_kernels` (each row normalised in the order
    :func:`~geograph.geometry.gain._row_normalised` sums it), else by torch: the same ``T``."""
    n = ids.shape[0]
    k = min(d, ids.shape[1])
    if not _compiled_rows(penalty):
        old_t = _t_columns(graph, src, torch.arange(n, device=ids.device) if renum is None else renum, n, d)
        ki = ids[:, :k]
        kw = (fvals[:, :k] * penalty[ki.clamp_min(0)]).masked_fill_(ki < 0, 0.0)
        cols, pos = ki.masked_fill(~(kw > 0), n).sort(dim=1)
        kw = kw.gather(1, pos)
        keep = cols < n
        counts = keep.sum(1)
        crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        _store_t(graph, embeddings, rho, crow, cols[keep], kw[keep])
        return (cols[: src.numel()] != old_t).any(1)
    from geograph.graphs._g3_kernels import edge_counts_kernel, edges_kernel
    from geograph.knn.select import _kernel_threads_held

    f, i, p = fvals.contiguous().numpy(), ids.contiguous().numpy(), penalty.contiguous().numpy()
    counts = torch.empty(n, dtype=torch.long)
    changed = torch.empty(src.numel(), dtype=torch.bool)
    with _kernel_threads_held() as threads:
        edge_counts_kernel(f, i, p, k, counts.numpy())
        crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        total = int(crow[-1])
        col = torch.empty(total, dtype=torch.long)
        weights = fvals.new_empty(total)
        edges_kernel(
            f,
            i,
            p,
            k,
            crow.numpy(),
            col.numpy(),
            weights.numpy(),
            graph.crow.contiguous().numpy(),
            graph.col.contiguous().numpy(),
            src.contiguous().numpy(),
            (src.new_empty(0) if renum is None else renum).contiguous().numpy(),
            max(1, min(n, 4 * threads)),
            changed.numpy(),
        )
    _store_t(graph, embeddings, rho, crow, col, weights, normalised=True)
    return changed


def _t_columns(graph: G3Graph, rows: Tensor, new_col: Tensor, n: int, k: int) -> Tensor:
    """The columns of ``T``'s ``rows`` (``(R, k)``, renumbered by ``new_col``, ``-1`` = removed),
    ascending, ``n`` past a row's end: to tell which rows an update changed."""
    counts = graph.degree()
    r = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    out = torch.full((counts.numel(), max(1, k)), n, dtype=torch.long, device=counts.device)
    out[r, torch.arange(r.numel(), device=r.device) - graph.crow[r]] = new_col[graph.col]
    return out.masked_fill(out < 0, n)[rows].sort(dim=1).values


def _offered(
    z: Tensor,
    n: int,
    width: int,
    offers: list[tuple[Tensor, Tensor, Tensor]],
    band: tuple[float, float] | None,
    block: int,
) -> _Extras:
    """The new columns offered to the ``n`` old rows (``(row, weight, column)`` triples above each
    row's floor), at most ``width`` a row: its best by weight, ties by lowest column (as a running
    top-``width`` merge keeps them); ``f`` recomputed from the pair, as every kept list holds it."""
    dev = z.device
    if offers:
        g, w, q = (torch.cat(t) for t in zip(*offers))
    else:
        g, q, w = (torch.empty(0, dtype=torch.long, device=dev),) * 2 + (z.new_empty(0),)
    keep = w > 0
    g, w, q = g[keep], w[keep], q[keep]
    o = torch.sort(q, stable=True).indices  # by row, then weight (best first), then column
    o = o[torch.sort(w[o], descending=True, stable=True).indices]
    o = o[torch.sort(g[o], stable=True).indices]
    g, w, q = g[o], w[o], q[o]
    counts = torch.bincount(g, minlength=n)
    starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    rank = torch.arange(g.numel(), device=dev) - starts[g]
    # a row offered more than width columns keeps its best width; the rest weigh at most its last
    last = rank == width - 1
    bound = torch.zeros(n, dtype=torch.float64, device=dev)
    bound[g[last]] = w[last].double()
    kept = rank < width
    g, w, q = g[kept], w[kept], q[kept]
    counts = counts.clamp_max(width)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    f = _f_of(z, g, q.unsqueeze(1), band, block).squeeze(1) if g.numel() else w.new_empty(0)
    return _Extras(ptr, w, q, f, bound)


def g3_add(
    graph: G3Graph, embeddings: Tensor, ids: Sequence[PassageId], *, block: int = DEFAULT_BLOCK
) -> G3UpdateReport:
    """:meth:`geograph.G3Graph.add`."""
    t0 = time.perf_counter()
    check_new_rows(embeddings, graph.embeddings)
    known = passage_ids(graph)
    new = known.check_new(ids, embeddings.shape[0])
    state = g3_state(graph, block)
    n, m = graph.num_nodes, len(new)
    emb = appended(graph.embeddings, embeddings)
    z = _unit(emb)
    raw = _new_raw(z, n, state, block)
    if state.ids is None or state.fvals is None or state.cut is None:  # the full T: made again from the density
        _full(graph, emb, z, state, raw, block)
        known.add(new)
        return G3UpdateReport(m, 0, n + m, 0, 0, 0, n, m, 1.0, time.perf_counter() - t0)
    _, penalty = _penalty(raw, graph.beta, z.dtype)
    # an old row's new column can be proven only above cut_i R_i: lower ones are not kept
    ratio = penalty[:n].double() / state.penalty.double()
    near = float(ratio.max()) if state.cells is None else _cell_bounds(ratio, state.cells)[1]
    floor = (state.cut * near).to(z.dtype)
    cells = state.cells
    if cells is not None:
        cells.assign = torch.cat([cells.assign, place_rows(cells.centroids, z[n:], block=block)])
    width = state.width
    new_ids = torch.arange(n, n + m, device=z.device)
    # the new rows' lists and the new columns of the old rows, from the same blocks
    fw = z.new_full((m, width), float("-inf"))
    fi = torch.full((m, width), -1, dtype=torch.long, device=z.device)
    offers: list[tuple[Tensor, Tensor, Tensor]] = []
    for q, cols, s in cell_blocks(z, new_ids, cells if cells is not None else _one_cell(z), block=block):
        f = _weights(s, 1.0, graph.band).masked_fill_(q.unsqueeze(1) == cols, float("-inf"))
        w = f * penalty[cols]  # the new rows' side: the target is the column
        at = q - n
        v, i = torch.cat([fw[at], w], 1), torch.cat([fi[at], cols.expand(q.numel(), -1)], 1)
        fw[at], fi[at] = merge_topk(v, i.masked_fill(~torch.isfinite(v), n + m), width)
        old = cols < n
        if bool(old.any()):
            g = cols[old]
            wt = f.T[old] * penalty[q]  # the old rows' side: the target is the new row
            r, c = (wt > floor[g].unsqueeze(1)).nonzero(as_tuple=True)
            offers.append((g[r], wt[r, c], q[c]))
    extras = _offered(z, n, width, offers, graph.band, block)
    fv, fi2 = sort_topk(fw, fi)
    fresh = _lists_from(z, new_ids, fv, fi2.masked_fill(~torch.isfinite(fv), -1), width, n + m - 1, graph.band, block)
    report = _remade(
        graph, z, emb, state, raw, torch.arange(n, device=z.device), None, extras, fresh, cells, block, t0, m, 0
    )
    known.add(new)
    return report


def _full(graph: G3Graph, emb: Tensor, z: Tensor, state: G3State, raw: Tensor, block: int) -> None:
    rho, penalty = _penalty(raw, graph.beta, z.dtype)
    built = gain_transition_edges(z, band=graph.band, beta=graph.beta, max_degree=None, block=block, density=rho)
    t = built.transition
    graph.embeddings = emb
    graph.density = rho.to(emb.dtype)
    graph.crow, graph.col = t.crow_indices().clone(), t.col_indices().clone()
    graph.val = t.values().to(emb.dtype).clone()
    graph._update_width()
    graph.corpus_version += 1
    state.raw, state.penalty = raw, penalty


def g3_remove(graph: G3Graph, ids: Iterable[PassageId], *, block: int = DEFAULT_BLOCK) -> G3UpdateReport:
    """:meth:`geograph.G3Graph.remove`."""
    t0 = time.perf_counter()
    known = passage_ids(graph)
    rows, keep = known.removal(ids, keep_at_least=2)
    n = graph.num_nodes
    state = g3_state(graph, block)
    keep_d = keep.to(graph.device)
    rows_d = rows.to(graph.device)
    z_all = _unit(graph.embeddings)
    emb = kept_rows(graph.embeddings, keep_d)
    z = emb if z_all is graph.embeddings else z_all[keep_d]  # unit rows already: no second copy
    if state.sample_rate is None:
        gone = torch.zeros(z.shape[0], dtype=torch.float64, device=z.device)
        zr = z_all[rows_d]
        for r0 in range(0, z.shape[0], block):
            gone[r0 : r0 + block] = density_terms(z[r0 : r0 + block], zr).sum(1, dtype=torch.float64)
        raw = state.raw[keep_d] - gone.mul_(DENSITY_UNIT)  # exact on the build's grid
    else:
        gone = _sampled_sum(z, z_all[rows_d], state.sample_rate, n, change=True)
        raw = state.raw[keep_d] - gone
    m = int(rows.numel())
    if state.ids is None or state.fvals is None or state.cut is None:
        _full(graph, emb, z, state, raw, block)
        known.keep(keep)
        return G3UpdateReport(0, m, n - m, 0, 0, 0, n - m, 0, 1.0, time.perf_counter() - t0)
    if state.cells is not None:
        state.cells.keep(keep_d)
    renum = torch.where(keep_d, torch.cumsum(keep_d.long(), 0) - 1, -1)
    src = keep_d.nonzero().squeeze(1)
    report = _remade(graph, z, emb, state, raw, src, renum, None, None, state.cells, block, t0, 0, m)
    known.keep(keep)
    return report
