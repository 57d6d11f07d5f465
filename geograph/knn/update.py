"""Exact per-row top-``K`` lists kept up to date as rows are added and removed, without a full rescan.

Each row ``i`` holds :class:`TopkLists`: its ``depth`` best other rows, best first, ranked by
``transform(s_ij)`` (default: the inner product ``s_ij``; ties: lowest row index first, the
rule of :func:`~geograph.knn.allpairs.tiled_pairs`). The list is exact: it is the row's
true top-``depth`` over the current rows. A row is **complete** when its list holds every other
row of finite rank (fewer than ``K`` exist).

- :func:`lists_add` appends rows: the new rows' lists come from the tiled scan against every
  row; an old row's list changes only when a new row ranks strictly above its last entry (new
  rows have higher indices, so a tie stays with the old entry), which one batched
  ``(old x new)`` block per row tile decides. Merging keeps the list exact and lets it grow
  back to ``K``: every row of rank above the old last entry is known.
- :func:`lists_add_cells` does the same for lists of an IVF build (:mod:`geograph.knn.ivf_place`):
  the new rows meet the rows of the cells they meet (the build's probes), each block of scores
  serving the new rows' lists and the old rows' lists, so an addition costs ``M`` rows times
  about ``nprobe`` cells; the lists stay what the join would find, up to its misses.
- :func:`lists_remove` drops rows and renumbers the rest (order kept, so the tie rule is
  unchanged); a row that lost entries keeps an exact, shorter list, and only rows left with
  fewer than ``need`` entries (and not complete) are scanned again, restricted to those rows.

So after any sequence of updates each row's first ``need`` entries equal those of a scan of
the final rows (:func:`topk_lists`), up to float rounding of the inner products (a pair's
product may be computed in a block of another shape than the rebuild's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from geograph._checks import tracing
from geograph.knn.allpairs import DEFAULT_BLOCK, merge_topk, sort_topk, tiled_pairs
from geograph.knn.exact import pair_score
from geograph.knn.ivf_place import IVFCells, cell_blocks, cell_scan
from geograph.knn.policy import Transform
from geograph.knn.select import _kernel_threads_held

__all__ = [
    "TopkLists",
    "ListsChange",
    "topk_lists",
    "scan_rows",
    "lists_add",
    "lists_add_cells",
    "lists_remove",
    "lists_edges",
    "union_update",
]


@dataclass(frozen=True)
class TopkLists:
    """Every row's exact top-``depth`` other rows.

    Attributes:
        values: ``(N, K)`` ranks best first, ``-inf`` past a row's depth.
        indices: ``(N, K)`` long row ids, ``-1`` past a row's depth.
        complete: ``(N,)`` bool, the list holds every other row of finite rank.
    """

    values: Tensor
    indices: Tensor
    complete: Tensor

    @property
    def width(self) -> int:
        return int(self.values.shape[1])

    def to(self, device: str | torch.device) -> TopkLists:
        return TopkLists(self.values.to(device), self.indices.to(device), self.complete.to(device))

    def depth(self) -> Tensor:
        """``(N,)`` entries held by each row."""
        return torch.isfinite(self.values).sum(1)


@dataclass(frozen=True)
class ListsChange:
    """:func:`lists_add` / :func:`lists_remove`: the new lists and which old rows they touched.

    Attributes:
        lists: the lists over the new rows.
        changed: ``(C,)`` rows (new numbering) whose list changed, the rescanned ones included.
        rescanned: ``(R,)`` rows (new numbering) whose list was computed by a scan.
    """

    lists: TopkLists
    changed: Tensor
    rescanned: Tensor


def scan_rows(
    z: Tensor, rows: Tensor | None, width: int, *, transform: Transform | None = None, block: int = DEFAULT_BLOCK
) -> TopkLists:
    """The exact lists of ``rows`` (all rows for ``None``) against every other row of ``z``, ``width`` wide."""
    n = z.shape[0]
    q = z if rows is None else z[rows]
    k = min(width, n - 1)
    v, i, _ = tiled_pairs(
        q, z, k, block=block, exclude=True if rows is None else rows, score=pair_score(transform, None)
    )
    ok = torch.isfinite(v)
    i = torch.where(ok, i, torch.full_like(i, -1))
    complete = ok.sum(1) < width
    if k < width:
        v = torch.cat([v, v.new_full((v.shape[0], width - k), float("-inf"))], 1)
        i = torch.cat([i, i.new_full((i.shape[0], width - k), -1)], 1)
    return TopkLists(v, i, complete)


def topk_lists(z: Tensor, width: int, *, transform: Transform | None = None, block: int = DEFAULT_BLOCK) -> TopkLists:
    """Every row's exact top-``width`` other rows of ``z`` by the tiled scan (:func:`scan_rows`).

    Example:
        >>> out = topk_lists(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]), 1)
        >>> out.indices.flatten().tolist(), out.complete.tolist()
        ([1, 0, 1], [False, False, False])
    """
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    return scan_rows(z, None, width, transform=transform, block=block)


def lists_add(
    z: Tensor, lists: TopkLists, *, transform: Transform | None = None, block: int = DEFAULT_BLOCK
) -> ListsChange:
    """The lists of ``z`` (``(N + M, D)``: the ``N`` rows of ``lists`` then ``M`` new ones).

    New rows: :func:`scan_rows` against all ``N + M`` rows. Old rows: one ``(tile x M)`` block
    of ranks per tile of ``block`` old rows; a row merges the new rows ranked strictly above its
    last entry (every rank for a complete row) and keeps its top ``K``.

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
        >>> out = lists_add(z, topk_lists(z[:2], 1))
        >>> out.lists.indices.flatten().tolist(), out.changed.tolist()
        ([2, 2, 0], [0, 1, 2])
    """
    n, width = lists.values.shape[0], lists.width
    m = z.shape[0] - n
    new_ids = torch.arange(n, n + m, device=z.device)
    fresh = scan_rows(z, new_ids, width, transform=transform, block=block)
    values, indices, complete = lists.values.clone(), lists.indices.clone(), lists.complete.clone()
    depth = lists.depth()
    last = values.gather(1, (depth - 1).clamp_min(0).unsqueeze(1)).squeeze(1)
    threshold = torch.where(complete | (depth == 0), torch.full_like(last, float("-inf")), last)
    score = pair_score(transform, None)
    changed = []
    zn = z[n:]
    for r0 in range(0, n, block):
        s = z[r0 : min(r0 + block, n)] @ zn.T
        s = s if score is None else score(s, new_ids)
        hit = (s > threshold[r0 : r0 + block, None]) & torch.isfinite(s)
        rows = hit.any(1).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        s = s[rows].masked_fill(~hit[rows], float("-inf"))
        g = rows + r0
        cand_v = torch.cat([values[g], s], 1)
        cand_i = torch.cat([indices[g], new_ids.expand(len(rows), -1)], 1)
        count = torch.isfinite(cand_v).sum(1)
        v, i = sort_topk(*merge_topk(cand_v, cand_i.masked_fill(~torch.isfinite(cand_v), z.shape[0]), width))
        values[g], indices[g] = v, i.masked_fill(~torch.isfinite(v), -1)
        complete[g] = complete[g] & (count <= width)
        changed.append(g)
    out = TopkLists(
        torch.cat([values, fresh.values]), torch.cat([indices, fresh.indices]), torch.cat([complete, fresh.complete])
    )
    changed.append(new_ids)
    return ListsChange(out, torch.cat(changed), new_ids)


def lists_add_cells(
    z: Tensor,
    lists: TopkLists,
    cells: IVFCells,
    *,
    transform: Transform | None = None,
    block: int = DEFAULT_BLOCK,
) -> ListsChange:
    """:func:`lists_add` for the lists of an IVF build: ``z`` is ``(N + M, D)`` (the ``N`` rows
    of ``lists`` then ``M`` new ones) and ``cells.assign`` holds the cell of all ``N + M``
    (:func:`~geograph.knn.ivf_place.place_rows`).

    The new rows are scored against the rows of the cells they meet
    (:func:`~geograph.knn.ivf_place.cell_blocks`): each block gives the new rows' lists and,
    transposed, the old rows whose list a new row enters (ranked strictly above its last
    entry), as each block of the join serves both of its cells. Cost: ``M`` rows times the
    rows of about ``nprobe`` cells (``2 nprobe N / nlist``), not ``M N``.

    Example:
        >>> from geograph.knn.ivf_place import make_cells
        >>> z = torch.nn.functional.normalize(torch.randn(300, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> cells = make_cells(z, nlist=4, nprobe=4)  # every cell meets every cell: exact
        >>> out = lists_add_cells(z, topk_lists(z[:290], 5), cells)
        >>> torch.equal(out.lists.indices, topk_lists(z, 5).indices)
        True
    """
    n, width = lists.values.shape[0], lists.width
    m = z.shape[0] - n
    new_ids = torch.arange(n, n + m, device=z.device)
    score = pair_score(transform, None)
    # the lists after the update, the old rows copied once (the new rows' are written at the end)
    out_v = lists.values.new_empty((n + m, width))
    out_i = lists.indices.new_empty((n + m, width))
    out_c = lists.complete.new_empty(n + m)
    out_v[:n], out_i[:n], out_c[:n] = lists.values, lists.indices, lists.complete
    values, indices, complete = out_v[:n], out_i[:n], out_c[:n]
    depth = lists.depth()
    last = values.gather(1, (depth - 1).clamp_min(0).unsqueeze(1)).squeeze(1)
    threshold = torch.where(complete | (depth == 0), torch.full_like(last, float("-inf")), last)
    fresh_v = z.new_full((m, width), float("-inf"))
    fresh_i = torch.full((m, width), -1, dtype=torch.long, device=z.device)
    touched = torch.zeros(n, dtype=torch.bool, device=z.device)
    for q, cols, s in cell_blocks(z, new_ids, cells, block=block):
        s = s if score is None else score(s, cols)
        s = s.masked_fill(q.unsqueeze(1) == cols, float("-inf"))
        at = q - n
        v, i = torch.cat([fresh_v[at], s], 1), torch.cat([fresh_i[at], cols.expand(q.numel(), -1)], 1)
        fresh_v[at], fresh_i[at] = merge_topk(v, i.masked_fill(~torch.isfinite(v), z.shape[0]), width)
        old = cols < n
        if not bool(old.any()):
            continue
        st, g = s.T[old], cols[old]  # the old rows of this cell against these new rows
        hit = (st > threshold[g, None]) & torch.isfinite(st)
        rows = hit.any(1).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        g = g[rows]
        cand_v = torch.cat([values[g], st[rows].masked_fill(~hit[rows], float("-inf"))], 1)
        cand_i = torch.cat([indices[g], q.expand(len(rows), -1)], 1)
        count = torch.isfinite(cand_v).sum(1)
        v, i = sort_topk(*merge_topk(cand_v, cand_i.masked_fill(~torch.isfinite(cand_v), z.shape[0]), width))
        values[g], indices[g] = v, i.masked_fill(~torch.isfinite(v), -1)
        complete[g] = complete[g] & (count <= width)
        touched[g] = True
    fv, fi = sort_topk(fresh_v, fresh_i)
    fi = fi.masked_fill(~torch.isfinite(fv), -1)
    out_v[n:], out_i[n:], out_c[n:] = fv, fi, z.shape[0] - 1 < width
    out = TopkLists(out_v, out_i, out_c)
    return ListsChange(out, torch.cat([touched.nonzero().squeeze(1), new_ids]), new_ids)


def lists_remove(
    z: Tensor,
    lists: TopkLists,
    keep: Tensor,
    need: int,
    *,
    transform: Transform | None = None,
    block: int = DEFAULT_BLOCK,
    cells: IVFCells | None = None,
) -> ListsChange:
    """The lists of the kept rows ``z`` (``keep``: ``(N,)`` bool over the rows of ``lists``).

    Rows are renumbered in order. A kept row that lost entries keeps the rest (still its exact
    top); rows left with fewer than ``need`` entries (``need`` clamps to the other rows) and not
    complete are scanned again (:func:`scan_rows` on those rows only; with ``cells``, the cells
    of the kept rows, :func:`~geograph.knn.ivf_place.cell_scan` against the cells they meet).

    Example:
        >>> z = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.8, 0.6], [0.0, 1.0]])
        >>> keep = torch.tensor([True, False, True, True])
        >>> out = lists_remove(z[keep], topk_lists(z, 1), keep, 1)
        >>> out.lists.indices.flatten().tolist(), out.rescanned.tolist()
        ([1, 0, 1], [0])
    """
    n_new = z.shape[0]
    pos = torch.cumsum(keep.long(), 0) - 1
    values, indices, complete = lists.values[keep], lists.indices[keep], lists.complete[keep]
    valid = indices >= 0
    lost = valid & ~keep[indices.clamp_min(0)]
    affected = lost.any(1).nonzero().squeeze(1)
    indices = torch.where(valid & ~lost, pos[indices.clamp_min(0)], torch.full_like(indices, -1))
    values = values.masked_fill(indices < 0, float("-inf"))
    if affected.numel():
        v, i = sort_topk(values[affected], indices[affected].masked_fill(indices[affected] < 0, n_new))
        values[affected], indices[affected] = v, i.masked_fill(~torch.isfinite(v), -1)
    need = min(need, n_new - 1)
    depth = torch.isfinite(values).sum(1)
    redo = ((depth < need) & ~complete).nonzero().squeeze(1)
    if redo.numel() and cells is not None:
        v, i = cell_scan(z, redo, cells, lists.width, transform=transform, block=block)
        values[redo], indices[redo] = v, i
    elif redo.numel():
        fresh = scan_rows(z, redo, lists.width, transform=transform, block=block)
        values[redo], indices[redo], complete[redo] = fresh.values, fresh.indices, fresh.complete
    return ListsChange(TopkLists(values, indices, complete), affected, redo)


def lists_edges(lists: TopkLists, k: int) -> Tensor:
    """``(2, E)`` directed edges from each row to the first ``k`` entries of its list."""
    idx = lists.indices[:, :k]
    src = torch.arange(idx.shape[0], device=idx.device).unsqueeze(1).expand_as(idx)
    ok = idx >= 0
    return torch.stack([src[ok], idx[ok]])


def union_update(
    edge_index: Tensor,
    rowptr: Tensor,
    old_k: Tensor,
    new_k: Tensor,
    pos: Tensor,
) -> tuple[Tensor, Tensor]:
    """The union graph of the lists ``new_k`` from that of ``old_k``, touching only the rows a change can move.

    ``edge_index`` / ``rowptr``: the union graph of the first-``k`` lists ``old_k`` (``(N, k)``
    ids, ``-1`` past a row's end) as :func:`~geograph.ops.adjacency.clean_edge_index` makes it
    (both directions, sorted, no duplicates); ``new_k``: the lists after an update (``(N', k)``,
    new numbering); ``pos``: ``(N,)`` each old row's new id (``-1``: removed; kept rows in order,
    added rows after them). Returns the clean ``edge_index`` and row pointers of ``new_k``'s
    union graph, equal to ``clean_edge_index(lists_edges(...))`` of the new lists.

    A row's union neighbours change only where its own list changed (``C``), or where it entered
    or left the list of a changed or removed row: those rows (``A``) are made from their lists and
    the reverse entries (of changed rows from their new lists, of the others from the old union
    row); every other row keeps its old segment, renumbered. Cost ``O(E)`` copies and
    ``O(|A| (k + deg))`` for the rows made again, no sort of the whole graph.

    Example:
        >>> old = torch.tensor([[1], [0], [1]])
        >>> new = torch.tensor([[1], [0], [1], [2]])  # a row 3 added, listing row 2
        >>> ei = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
        >>> union_update(ei, torch.tensor([0, 1, 3, 4]), old, new, torch.arange(3))[0].tolist()
        [[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]
    """
    dev = new_k.device
    n_new = new_k.shape[0]
    kept = pos >= 0
    n_old = old_k.shape[0]
    grow = bool(kept.all())  # rows only added: old ids stay, no renumbering pass
    old_of = torch.full((n_new,), -1, dtype=torch.long, device=dev)  # each new row's old id (-1: added)
    if grow:
        old_of[:n_old] = torch.arange(n_old, device=dev)
        mapped = old_k
        changed = torch.ones(n_new, dtype=torch.bool, device=dev)
        changed[:n_old] = (old_k != new_k[:n_old]).any(1)
    else:
        old_of[pos[kept]] = kept.nonzero().squeeze(1)
        mapped = torch.where(old_k >= 0, pos[old_k.clamp_min(0)], torch.full_like(old_k, -1))
        had = old_of >= 0
        changed = ~had
        changed[had] = (mapped[old_of[had]] != new_k[had]).any(1)
    c_rows = changed.nonzero().squeeze(1)
    # A: the changed rows, the rows that entered or left their lists, the entries of removed rows
    touch = torch.zeros(n_new, dtype=torch.bool, device=dev)
    touch[c_rows] = True
    back = new_k[c_rows]
    was = mapped[old_of[c_rows].clamp_min(0)].masked_fill((old_of[c_rows] < 0).unsqueeze(1), -1)
    entered = (back >= 0) & ~(back.unsqueeze(2) == was.unsqueeze(1)).any(2)
    left = (was >= 0) & ~(was.unsqueeze(2) == back.unsqueeze(1)).any(2)
    touch[back[entered]] = True
    touch[was[left]] = True
    gone = mapped[~kept]
    touch[gone[gone >= 0]] = True
    a_rows = touch.nonzero().squeeze(1)
    # the new union rows of A: own lists, reverse entries of changed rows (where the entry is in
    # A: elsewhere it was there before), reverse entries of unchanged rows (in the old union row,
    # and still listing the row)
    fwd = new_k[a_rows]
    rev = (back >= 0) & touch[back.clamp_min(0)]
    src_parts = [a_rows.unsqueeze(1).expand_as(fwd)[fwd >= 0], back[rev]]
    dst_parts = [fwd[fwd >= 0], c_rows.unsqueeze(1).expand_as(back)[rev]]
    a_old = old_of[a_rows]
    has_old = a_old >= 0
    starts = rowptr[a_old[has_old]]
    lens = rowptr[a_old[has_old] + 1] - starts
    at = torch.repeat_interleave(a_rows[has_old], lens)
    j = pos[edge_index[1, _spans(starts, lens)]]
    ok = j >= 0
    at, j = at[ok], j[ok]
    ok = ~changed[j] & (new_k[j] == at.unsqueeze(1)).any(1)
    src_parts.append(at[ok])
    dst_parts.append(j[ok])
    s, d = torch.cat(src_parts), torch.cat(dst_parts)
    key = torch.unique(s * n_new + d)
    a_src, a_dst = key // n_new, key % n_new
    # splice: rows outside A keep their old segment (renumbered); rows of A take the new one. Each
    # slot of the result gathers from [old targets, renumbered ; A's targets]: no sort, no scatter
    e_old = edge_index.shape[1]
    a_count = torch.bincount(a_src, minlength=n_new)
    a_ptr = torch.cat([a_count.new_zeros(1), a_count.cumsum(0)])
    counts = torch.zeros(n_new, dtype=torch.long, device=dev)
    start = torch.zeros(n_new, dtype=torch.long, device=dev)
    if grow:
        counts[:n_old], start[:n_old] = rowptr[1:] - rowptr[:-1], rowptr[:-1]
    else:
        counts[had], start[had] = (rowptr[1:] - rowptr[:-1])[old_of[had]], rowptr[old_of[had]]
    counts = torch.where(touch, a_count, counts)
    start = torch.where(touch, e_old + a_ptr[:-1], start)
    new_ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    total = int(new_ptr[-1])
    if dev.type == "cpu" and not tracing():  # one pass writing each slot once (numba)
        return _splice(edge_index[1], None if grow else pos, a_dst, start, counts, new_ptr, total), new_ptr
    targets = edge_index[1] if grow else pos[edge_index[1]]
    dst = torch.cat([targets, a_dst])[_spans(start, counts, total)]
    src = torch.repeat_interleave(torch.arange(n_new, device=dev), counts, output_size=total)
    return torch.stack([src, dst]), new_ptr


def _splice(
    old_dst: Tensor, pos: Tensor | None, a_dst: Tensor, start: Tensor, counts: Tensor, ptr: Tensor, total: int
) -> Tensor:
    """The ``(2, total)`` edges of :func:`union_update` by the compiled kernel
    (:func:`~geograph.knn._splice.splice_kernel`), with torch's thread count."""
    from geograph.knn._splice import splice_kernel

    out = torch.empty((2, total), dtype=torch.long)
    ins = (old_dst, old_dst.new_empty(0) if pos is None else pos, a_dst, start, counts, ptr)
    with _kernel_threads_held():
        splice_kernel(*(a.contiguous().numpy() for a in ins), out[0].numpy(), out[1].numpy())
    return out


def _spans(starts: Tensor, lens: Tensor, total: int | None = None) -> Tensor:
    """The indices ``starts[r] .. starts[r] + lens[r] - 1`` of every span ``r``, concatenated
    (``total``: ``lens.sum()`` when known, saving a read of it)."""
    total = int(lens.sum()) if total is None else total
    ends = lens.cumsum(0)
    out = torch.repeat_interleave(starts - (ends - lens), lens, output_size=total)
    return out + torch.arange(total, device=lens.device)
