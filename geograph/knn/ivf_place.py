r"""Rows placed in the cells of an IVF self-join, and scanned against the cells they meet: the local scans of updates.

An IVF build (:func:`~geograph.knn.ivf_join.ivf_self_topk`) meets a row with the rows of the
cells its own cell is joined with (cell ``a`` meets ``b`` when ``b`` is among ``a``'s
``nprobe`` nearest centroids or ``a`` among ``b``'s) and of its own ``nprobe`` nearest
centroids. :class:`IVFCells` keeps the cells of such a build (centroids, every row's cell,
``nprobe``) so that an update can do the same for the rows it changes: a new passage is put
in its nearest cell (:func:`place_rows`) and scored against the rows of the cells it meets
(:func:`cell_blocks`), each block serving both directions (the new row's list and the old
rows' lists); a row that must be listed again is scanned the same way (:func:`cell_scan`).
An update then costs the rows it changes times the rows of about ``nprobe`` cells, not the
whole corpus.

:func:`make_cells` trains the cells as the build does (faiss's spherical k-means on the same
uniform sample with the same seed, :func:`~geograph.knn.faiss_ivf.train_centroids`), so a
graph's cells are the join's own where faiss's k-means is deterministic, which it is on one
machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from geograph.knn.allpairs import DEFAULT_BLOCK, merge_topk, sort_topk, tiled_topk
from geograph.knn.faiss_ivf import train_centroids
from geograph.knn.policy import Transform, check_ivf, default_join_nlist, default_join_nprobe
from geograph.ops.similarity import block_product

__all__ = ["IVFCells", "make_cells", "place_rows", "cell_blocks", "cell_scan"]


@dataclass
class IVFCells:
    """The cells of an IVF self-join, kept for updates.

    Attributes:
        centroids: ``(nlist, D)`` unit centroids.
        assign: ``(N,)`` long, every row's cell.
        nprobe: the cells each cell is joined with (its own included).
    """

    centroids: Tensor
    assign: Tensor
    nprobe: int
    _met: Tensor | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def nlist(self) -> int:
        return int(self.centroids.shape[0])

    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        """Apply a module's ``_apply`` function (``.to()``, ``.cuda()``) to the centroids and cells."""
        self.centroids, self.assign = fn(self.centroids), fn(self.assign)
        self._met = None

    def keep(self, keep: Tensor) -> None:
        """Drop the rows where ``keep`` (``(N,)`` bool) is False (the rest renumbered in order)."""
        self.assign = self.assign[keep.to(self.assign.device)]

    def met(self) -> Tensor:
        """``(nlist, nlist)`` bool: cell ``a`` meets cell ``b`` in the join (symmetric, the diagonal set).
        Made once (the centroids and ``nprobe`` do not change with updates); do not write to it."""
        if self._met is not None and self._met.device == self.centroids.device:
            return self._met
        k = min(self.nprobe, self.nlist)
        near = tiled_topk(self.centroids, self.centroids, k)[1]
        met = torch.zeros(self.nlist, self.nlist, dtype=torch.bool, device=near.device)
        met.scatter_(1, near, True)
        met |= met.T.clone()
        met.fill_diagonal_(True)
        self._met = met
        return met


def make_cells(
    z: Tensor,
    *,
    nlist: int | None = None,
    nprobe: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    block: int = DEFAULT_BLOCK,
) -> IVFCells:
    """The cells of an IVF join of ``z`` with these options (defaults as the join's): centroids
    trained as :func:`~geograph.knn.ivf_join.ivf_self_topk` trains them, every row in its nearest.

    Example:
        >>> z = torch.nn.functional.normalize(torch.randn(200, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> cells = make_cells(z, nlist=4, nprobe=2)
        >>> cells.centroids.shape, cells.assign.shape, cells.nprobe
        (torch.Size([4, 8]), torch.Size([200]), 2)
    """
    n = z.shape[0]
    nlist = default_join_nlist(n) if nlist is None else nlist
    nprobe = default_join_nprobe(n, nlist) if nprobe is None else nprobe
    sample = check_ivf(n, nlist, nprobe, sample)
    centroids = train_centroids(z, nlist, sample=sample, seed=seed)
    return IVFCells(centroids, place_rows(centroids, z, block=block), int(nprobe))


def place_rows(centroids: Tensor, z: Tensor, *, block: int = DEFAULT_BLOCK) -> Tensor:
    """``(M,)`` the nearest centroid (by inner product) of each row of ``z``: the cell a row is put in."""
    return tiled_topk(z, centroids.to(z), 1, block=block)[1].squeeze(1).to(torch.long)


def _members(assign: Tensor, nlist: int) -> tuple[Tensor, list[int]]:
    order = torch.sort(assign, stable=True).indices
    counts = torch.bincount(assign, minlength=nlist)
    return order, torch.cat([counts.new_zeros(1), counts.cumsum(0)]).tolist()


def cell_blocks(
    z: Tensor, rows: Tensor, cells: IVFCells, *, block: int = DEFAULT_BLOCK
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """The inner products of ``rows`` with the rows of every cell they meet, by groups of cells.

    Row ``r`` (in cell ``c``) meets the cells ``c`` is joined with and its own ``nprobe`` nearest
    centroids, as in the build. Cells are taken in order and grouped while the group's block
    wastes at most :data:`GROUP_SLACK` products a cell (a block of small products costs its
    fixed overhead, about as much): a group's block scores every pair of the rows that meet
    any of its cells and the rows of all of them, so a row may also be scored against a cell of
    the group it does not meet (more pairs of exact scores, never fewer). Yields ``(q, cols, s)``:
    the query rows (``(Q,)`` ids), the group's rows (``(C,)`` ids, ascending) and ``s = z[q] @ z[cols].T``
    (:func:`~geograph.ops.similarity.block_product`: a pair has the bits of a build's tile)
    (``(Q, C)``, at most about ``block^2`` entries: a cell met by many rows is split). A row
    meets each cell once; the cells of ``cells.assign`` must cover every row of ``z``.
    """
    if rows.numel() == 0:
        return
    nlist = cells.nlist
    met = cells.met()
    own = tiled_topk(z[rows], cells.centroids.to(z), min(cells.nprobe, nlist), block=block)[1]
    need = met[cells.assign[rows]]
    need.scatter_(1, own, True)
    order, ptr = _members(cells.assign, nlist)
    for group in _groups(need.cpu().numpy(), ptr, block):
        member = need[:, group].any(1)
        q = rows[member]
        cols = torch.cat([order[ptr[c] : ptr[c + 1]] for c in group]).sort().values
        zc = z[cols]
        step = max(1, (block * block) // cols.numel())
        for r0 in range(0, q.numel(), step):
            qq = q[r0 : r0 + step]
            yield qq, cols, block_product(z[qq], zc)  # a thin block has a tile's bits


#: products a cell may waste in a group of :func:`cell_blocks` (about what one block's fixed
#: overhead costs on CPU: a few small tensor operations against a product of this size)
GROUP_SLACK = 1 << 12


def _groups(need: np.ndarray, ptr: list[int], block: int) -> list[list[int]]:
    """Consecutive cells met by some row, grouped while the group's block (rows meeting any of
    its cells x their rows) exceeds the sum of its cells' own blocks by at most
    :data:`GROUP_SLACK` a cell and holds at most ``block^2`` products."""
    counts = need.sum(0)
    groups: list[list[int]] = []
    group: list[int] = []
    union = np.zeros(need.shape[0], dtype=bool)
    own = width = 0
    for c in range(need.shape[1]):
        size = ptr[c + 1] - ptr[c]
        if counts[c] == 0 or size == 0:
            continue
        joined = union | need[:, c]
        area = int(joined.sum()) * (width + size)
        if group and (area > own + int(counts[c]) * size + GROUP_SLACK * (len(group) + 1) or area > block * block):
            groups.append(group)
            group, joined, own, width = [], need[:, c].copy(), 0, 0
        group.append(c)
        union, own, width = joined, own + int(counts[c]) * size, width + size
    if group:
        groups.append(group)
    return groups


def cell_scan(
    z: Tensor,
    rows: Tensor,
    cells: IVFCells,
    width: int,
    *,
    score: Callable[[Tensor, Tensor], Tensor] | None = None,
    transform: Transform | None = None,
    block: int = DEFAULT_BLOCK,
) -> tuple[Tensor, Tensor]:
    """The top-``width`` other rows of each of ``rows`` among the rows of the cells it meets
    (:func:`cell_blocks`), ranked by ``score(s, cols)`` (or ``transform(s)``, or ``s``);
    ``(R, width)`` values and ids best first, ties lowest id, ``-inf`` / ``-1`` where fewer.

    Example:
        >>> z = torch.nn.functional.normalize(torch.randn(300, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> cells = make_cells(z, nlist=4, nprobe=4)  # every cell meets every cell: exact
        >>> v, i = cell_scan(z, torch.tensor([0, 5]), cells, 3)
        >>> bool((i == tiled_topk(z[[0, 5]], z, 4)[1][:, 1:]).all())
        True
    """
    r = rows.numel()
    best_v = z.new_full((r, width), float("-inf"))
    best_i = torch.full((r, width), -1, dtype=torch.long, device=z.device)
    slot = torch.full((z.shape[0],), -1, dtype=torch.long, device=z.device)
    slot[rows] = torch.arange(r, device=z.device)
    for q, cols, s in cell_blocks(z, rows, cells, block=block):
        s = score(s, cols) if score is not None else (transform(s) if transform is not None else s)
        s = s.masked_fill(q.unsqueeze(1) == cols, float("-inf"))
        at = slot[q]
        v = torch.cat([best_v[at], s], 1)
        i = torch.cat([best_i[at], cols.expand(q.numel(), -1)], 1)
        i = i.masked_fill(~torch.isfinite(v), z.shape[0])
        best_v[at], best_i[at] = merge_topk(v, i, width)
    v, i = sort_topk(best_v, best_i)
    return v, i.masked_fill(~torch.isfinite(v), -1)
