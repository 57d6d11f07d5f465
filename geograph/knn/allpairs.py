"""The one tiled all-pairs routine: row block x column block -> partial top-k and partial row sums, merged.

Every corpus-wide pair computation of geograph goes through :func:`tiled_pairs`: the exact k-NN
graph (:meth:`geograph.CorpusGraph.from_knn`), G3RAG's gain edges and density
(:func:`geograph.functional.gain_transition`, :func:`geograph.functional.gain_density`), exact
dense retrieval (:class:`geograph.DenseRetriever`) and the cell blocks of the IVF join
(:func:`geograph.knn.ivf_join.ivf_self_topk`). Memory is ``O(block^2 + B k)`` whatever the
number of keys; device and dtype follow the inputs (CPU or CUDA).

Ties: equal scores keep the lowest key index (:func:`merge_topk`), the rule of every geograph
ranking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, cast

import torch
from torch import Tensor

from geograph import _checks
from geograph._checks import check_positive_int
from geograph.knn.select import compiled, new_lists, offer_rows
from geograph.ops.similarity import block_product
from geograph.outputs import topk_by_key, topk_stable

__all__ = [
    "tiled_pairs",
    "tiled_topk",
    "merge_topk",
    "sort_topk",
    "sort_topk_",
    "DEFAULT_BLOCK",
    "tile_executor",
    "map_tiles",
    "current_executor",
    "TileExecutor",
]

#: rows and columns of one tile unless told (4096 x 4096 similarities: 64 MB in float32)
DEFAULT_BLOCK = 4096


def merge_topk(values: Tensor, ids: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest ``values`` of each row with their ``ids``; at a tie on the cut the lowest ids stay.

    The kept entries come back in no particular order (:func:`sort_topk` orders them once at
    the end). Rows whose cut value occurs more than once are settled by
    :func:`~geograph.outputs.topk_by_key` (two sorts); the others by one ``topk``.

    Args:
        values: ``(R, C)`` scores (``-inf`` = no candidate).
        ids: ``(R, C)`` long key ids of the entries (unique per row).
        k: ``0 <= k <= C``.

    Returns:
        ``(values, ids)``, both ``(R, k)``.

    Example:
        >>> v, i = merge_topk(torch.tensor([[0.5, 0.9, 0.5]]), torch.tensor([[7, 1, 3]]), 2)
        >>> sort_topk(v, i)
        (tensor([[0.9000, 0.5000]]), tensor([[1, 3]]))
    """
    if k >= values.shape[-1]:
        return values, ids
    if k == 0:
        return values[..., :0], ids[..., :0]
    # the (k+1)-th value equals the k-th exactly when an entry outside the top k ties the cut
    top_v, pos = values.topk(k + 1, dim=-1)
    tied = (top_v[..., k] == top_v[..., k - 1]) & torch.isfinite(top_v[..., k])
    top_v, pos = top_v[..., :k], pos[..., :k]
    out_i = ids.gather(-1, pos)
    if bool(tied.any()):  # rare: equal similarities at the cut
        rows = tied.nonzero().squeeze(1)
        v2, p2 = topk_by_key(values[rows], ids[rows], k)
        top_v = top_v.index_copy(0, rows, v2)
        out_i = out_i.index_copy(0, rows, ids[rows].gather(-1, p2))
    return top_v, out_i


def sort_topk(values: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Order kept entries best first, equal values by lowest id (``-inf`` entries last)."""
    _, pos = topk_by_key(values, ids, values.shape[-1])
    return values.gather(-1, pos), ids.gather(-1, pos)


#: rows of ``(N, k)`` lists sorted at a time by :func:`sort_topk_`
SORT_ROWS = 1 << 16


def sort_topk_(values: Tensor, ids: Tensor, *, empty: int | None = None) -> tuple[Tensor, Tensor]:
    """:func:`sort_topk` of ``(N, k)`` lists in place, :data:`SORT_ROWS` rows at a time: the
    temporaries are those of one chunk, not three more ``(N, k)`` arrays (1M x 160 lists: 3.8 GB
    less at the peak). ``empty``: the id written where a value is not finite.

    Example:
        >>> v, i = torch.tensor([[0.1, 0.9, float("-inf")]]), torch.tensor([[4, 2, 7]])
        >>> sort_topk_(v, i, empty=-1)
        (tensor([[0.9000, 0.1000,   -inf]]), tensor([[ 2,  4, -1]]))
    """
    for r0 in range(0, values.shape[0], SORT_ROWS):
        v, i = sort_topk(values[r0 : r0 + SORT_ROWS], ids[r0 : r0 + SORT_ROWS])
        if empty is not None:
            i.masked_fill_(~torch.isfinite(v), empty)
        values[r0 : r0 + SORT_ROWS], ids[r0 : r0 + SORT_ROWS] = v, i
    return values, ids


class ProgressBar(Protocol):
    """What :func:`progress_bar` returns (a tqdm bar): advanced by ``update``, ended by ``close``."""

    def update(self, n: float = 1) -> bool | None: ...

    def close(self) -> None: ...


def progress_bar(progress: bool | str, total: int, label: str, stage: str | None = None) -> ProgressBar | None:
    """A tqdm bar with ETA over ``total`` rows when ``progress`` is truthy (a string names it,
    else ``label``; ``stage`` is appended), else ``None``."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    desc = progress if isinstance(progress, str) else label
    bar: ProgressBar = tqdm(total=total, desc=f"{desc}: {stage}" if stage else desc, unit="row", leave=False)
    return bar


#: ``executor(fn, shared, items)`` yields ``(item, fn(shared, item))`` for every item, in any order
TileExecutor = Callable[
    [Callable[[dict[str, Any], Any], Any], dict[str, Any], Sequence[Any]], Iterator[tuple[Any, Any]]
]

_EXECUTOR: ContextVar[TileExecutor | None] = ContextVar("geograph_tile_executor", default=None)


@contextmanager
def tile_executor(executor: TileExecutor | None) -> Iterator[None]:
    """Inside the block, the independent tiles of :func:`tiled_pairs` (its query-row tiles) and of
    the IVF join (:func:`~geograph.knn.ivf_join.ivf_self_topk`, its cells) are handed to
    ``executor`` instead of being run one after another (``None``: run here).

    The executor only decides where a tile runs: every tile is the same function on the same
    inputs, and the results are merged by the same code, so a build under an executor equals
    the build without one. :mod:`geograph.distributed` supplies Ray tasks. The setting is a
    :class:`contextvars.ContextVar`: it holds for the ``with`` block in this thread only.
    """
    token = _EXECUTOR.set(executor)
    try:
        yield
    finally:
        _EXECUTOR.reset(token)


def current_executor() -> TileExecutor | None:
    """The executor of the enclosing :func:`tile_executor` block (``None`` outside one or while tracing)."""
    return None if _checks.tracing() else _EXECUTOR.get()


def map_tiles(
    fn: Callable[[dict[str, Any], Any], Any], shared: dict[str, Any], items: Sequence[Any]
) -> Iterator[tuple[Any, Any]]:
    """``(item, fn(shared, item))`` for every item: one after another here, or by the executor of an
    enclosing :func:`tile_executor` block (in any order). ``fn`` is a module-level function and
    ``shared`` holds what every tile reads (tensors, options), so an executor can ship both once.
    A single item, or a call while tracing, always runs here."""
    executor = None if len(items) < 2 else current_executor()
    if executor is None:
        for item in items:
            yield item, fn(shared, item)
    else:
        yield from executor(fn, shared, items)


Score = Callable[[Tensor, Tensor], Tensor]
RowTerm = Callable[[Tensor], Tensor]


def tiled_pairs(
    query: Tensor,
    keys: Tensor,
    k: int = 0,
    *,
    block: int = DEFAULT_BLOCK,
    exclude: bool | Tensor | None = None,
    score: Score | None = None,
    row_sum: RowTerm | None = None,
    progress: bool | str = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    r"""All pairs of ``query`` rows and ``keys`` rows by tiles: a running top-``k`` and row sums.

    .. math:: s_{bu} = \langle q_b, x_u \rangle, \qquad
              \mathrm{top}_k\{\mathrm{score}(s_{bu}, u) : u\}, \qquad \sum_u \mathrm{term}(s_{bu})

    Query rows are taken ``block`` at a time and key rows ``block`` at a time; each tile's
    top-``k`` is merged into the running one (:func:`merge_topk`) and its row sums added, so
    memory is ``O(block^2 + B k)``. Normalise both sides first for cosine. An excluded pair
    (a passage with itself) never enters the top-``k`` and adds nothing to the sums.

    Args:
        query: ``(B, D)``.
        keys: ``(V, D)`` in ``query``'s dtype and device.
        k: entries kept per row, ``0 <= k <= V`` (minus one with ``exclude``); 0 = sums only.
        block: rows and columns of a tile.
        exclude: ``True``: query row ``b`` is key ``b`` (``query`` is ``keys``); a ``(B,)``
            long tensor: query row ``b`` is key ``exclude[b]``; ``None``/``False``: no pair excluded.
        score: ``score(s, cols)`` maps a tile of inner products ``(R, C)`` and its key ids
            ``(C,)`` to the values ranked by the top-``k`` (default: ``s`` itself).
        row_sum: ``term(s)`` summed over every key of a row (e.g. ``lambda s: s.clamp_min(0)``).
        progress: a tqdm progress bar (with ETA) over the query tiles; a string is its label.

    Returns:
        ``(values (B, k), indices (B, k), sums (B,) or None)``, best first (ties: lowest key
        index first).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
        >>> v, i, s = tiled_pairs(x, x, 1, block=2, exclude=True, row_sum=lambda s: s.clamp_min(0))
        >>> i.T, s
        (tensor([[2, 2, 1]]), tensor([0.6000, 0.8000, 1.4000]))
    """
    check_positive_int(block, "block")
    n_q, v = query.shape[0], keys.shape[0]
    if exclude is True:
        if n_q != v:
            raise ValueError(f"exclude=True needs query to be keys, got {n_q} query rows and {v} keys")
        self_ids: Tensor | None = torch.arange(n_q, device=query.device)
    elif exclude is None or exclude is False:
        self_ids = None
    else:
        self_ids = exclude.to(device=query.device, dtype=torch.long)
        if tuple(self_ids.shape) != (n_q,):
            raise ValueError(
                f"exclude must be a bool or hold one key id per query row ({n_q},), got shape {tuple(self_ids.shape)}"
            )
    limit = v - (self_ids is not None)
    if not 0 <= k <= max(limit, 0):
        raise ValueError(
            f"k must be in [0, {max(limit, 0)}] "
            f"({v} keys{' minus the excluded one' if self_ids is not None else ''}), got {k}"
        )
    out_v = query.new_empty(n_q, k)
    out_i = torch.empty(n_q, k, dtype=torch.long, device=query.device)
    sums = query.new_zeros(n_q) if row_sum is not None else None
    bar = progress_bar(progress, n_q, "all pairs")
    # one query tile (retrieval) or a traced call: stable top-k, no data-dependent branch (no host
    # read); a build over many query tiles: merge_topk (one host read a tile, about 3x faster)
    traced = _checks.tracing() or n_q <= block
    shared = dict(
        query=query, keys=keys, k=k, block=block, self_ids=self_ids, score=score, row_sum=row_sum, traced=traced
    )

    def put(r0: int, tile: tuple[Tensor, Tensor, Tensor | None]) -> None:
        best_v, best_i, tile_sums = tile
        rows = best_v.shape[0]
        if k:
            out_v[r0 : r0 + rows], out_i[r0 : r0 + rows] = best_v, best_i
        if sums is not None:
            sums[r0 : r0 + rows] = cast(Tensor, tile_sums)  # a tile has row sums when the call asked for them
        if bar is not None:
            bar.update(rows)

    if traced:  # (no executor and no generator inside a traced graph)
        for r0 in range(0, n_q, block):
            put(r0, pairs_rows(shared, r0))
    else:
        for r0, tile in map_tiles(pairs_rows, shared, range(0, n_q, block)):
            put(r0, tile)
    if bar is not None:
        bar.close()
    return out_v, out_i, sums


def pairs_rows(shared: dict[str, Any], r0: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """One query-row tile of :func:`tiled_pairs`: rows ``r0 : r0 + block`` against every key tile.

    ``shared`` holds :func:`tiled_pairs`' inputs (``query``, ``keys``, ``k``, ``block``,
    ``self_ids``, ``score``, ``row_sum``, ``traced``). Returns the tile's ``(values, ids)``
    ``(R, k)`` best first and its row sums ``(R,)`` (or ``None``).
    """
    query, keys, k, block = shared["query"], shared["keys"], shared["k"], shared["block"]
    self_ids, score, row_sum, traced = shared["self_ids"], shared["score"], shared["row_sum"], shared["traced"]
    v = keys.shape[0]
    q = query[r0 : r0 + block]
    best_v = q.new_empty(q.shape[0], 0)
    best_i = torch.empty(q.shape[0], 0, dtype=torch.long, device=q.device)
    sums = q.new_zeros(q.shape[0]) if row_sum is not None else None
    own = None if self_ids is None else self_ids[r0 : r0 + block].unsqueeze(1)
    # a build over many query tiles on CPU: each tile offered to the rows' heaps by the compiled
    # kernel (:mod:`geograph.knn.select`); the kept set is the same, ordered once at the end
    heaps = bool(k) and not traced and compiled(q)
    if heaps:
        best_v, best_i = new_lists(q.shape[0], k, q)
        local = torch.arange(q.shape[0])
        excl = None if own is None else own.squeeze(1)
    for c0 in range(0, v, block):
        # a build's thin last tile is padded to a full tile's bits (updates compute the same pairs
        # in other blocks); a traced / one-tile call (retrieval) is the plain product
        s = q @ keys[c0 : c0 + block].T if traced else block_product(q, keys[c0 : c0 + block])
        cols = torch.arange(c0, c0 + s.shape[1], device=q.device)
        hit = None if own is None or (heaps and sums is None) else own == cols
        if sums is not None:
            term = row_sum(s)
            if hit is not None:
                term = term.masked_fill(hit, 0.0)
            sums += term.sum(1)
        if k == 0:
            continue
        ranked = s if score is None else score(s, cols)
        if heaps:
            offer_rows(best_v, best_i, local, ranked, cols, exclude=excl)
            continue
        if hit is not None:
            ranked = ranked.masked_fill(hit, float("-inf"))
        if traced:  # positions ascend with key ids, so the stable top-k keeps the tie rule
            tv, tp = topk_stable(ranked, min(k, ranked.shape[1]))
            best_v, pos = topk_stable(torch.cat([best_v, tv], 1), min(k, best_v.shape[1] + tv.shape[1]))
            best_i = torch.cat([best_i, tp + c0], 1).gather(1, pos)
            continue
        tv, ti = merge_topk(ranked, cols.expand(ranked.shape[0], -1), min(k, ranked.shape[1]))
        best_v, best_i = merge_topk(torch.cat([best_v, tv], 1), torch.cat([best_i, ti], 1), k)
    if k and not traced:
        best_v, best_i = sort_topk(best_v, best_i)
    return best_v, best_i, sums


def tiled_topk(
    query: Tensor,
    keys: Tensor,
    k: int,
    *,
    block: int = DEFAULT_BLOCK,
    exclude_self: bool = False,
    progress: bool | str = False,
) -> tuple[Tensor, Tensor]:
    r"""Exact top-``k`` of the inner products ``query @ keys.T`` by tiles (:func:`tiled_pairs`).

    Args:
        query: ``(B, D)``.
        keys: ``(V, D)`` in ``query``'s dtype and device.
        k: ``1 <= k <= V`` (``V - 1`` with ``exclude_self``).
        block: rows and columns per tile.
        exclude_self: query row ``i`` is key ``i`` (``query`` is ``keys``): never return it.
        progress: a progress bar over the query tiles.

    Returns:
        ``(values, indices)``, both ``(B, k)``, best first; ties: lowest key index first.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
        >>> tiled_topk(x, x, 1, block=2, exclude_self=True)[1]
        tensor([[2],
                [2],
                [1]])
    """
    v, i, _ = tiled_pairs(query, keys, k, block=block, exclude=exclude_self, progress=progress)
    return v, i
