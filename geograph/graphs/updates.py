"""Adding and removing passages of a built :class:`~geograph.CorpusGraph` in place, equal to a rebuild.

A k-NN graph (:meth:`~geograph.CorpusGraph.from_knn`) keeps every row's directed top-``k``
lists (:class:`~geograph.knn.update.TopkLists`); an update changes only the lists it
must (:func:`~geograph.knn.update.lists_add`, :func:`~geograph.knn.update.lists_remove`)
and the union graph is spliced where those lists moved
(:func:`~geograph.knn.update.union_update`). Other graphs (groups, mentions, given edges)
lose a removed passage's edges, which is what their builders give on the remaining
passages; adding to them takes the new edges
(``groups``) or is refused. Passages are named by ids (``str`` or ``int``); a graph built
without ids names its passages ``0 .. V-1``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from geograph._checks import check_tensor
from geograph.artefacts.saved_graphs import saved_ids
from geograph.knn.allpairs import DEFAULT_BLOCK
from geograph.knn.build import self_topk
from geograph.knn.ivf_place import IVFCells, make_cells, place_rows
from geograph.knn.policy import AUTO_EXACT_MAX, DEFAULT_RECALL_TARGET, IVFOptions
from geograph.knn.update import (
    TopkLists,
    lists_add,
    lists_add_cells,
    lists_edges,
    lists_remove,
    topk_lists,
    union_update,
)
from geograph.ops.adjacency import clean_edge_index, csr_rowptr
from geograph.ops.similarity import normalize, unit_rows

if TYPE_CHECKING:
    from geograph.graphs.corpus_graph import CorpusGraph

__all__ = [
    "PassageIds",
    "UpdateReport",
    "KnnState",
    "add_passages",
    "remove_passages",
    "check_new_rows",
    "knn_unit",
    "kept_lists",
    "reorder",
]


#: a passage's id: a string or an integer
PassageId = str | int


class PassageIds:
    """The ids of a corpus's passages, in row order, and each id's row.

    Example:
        >>> ids = PassageIds(["a", "b"])
        >>> ids.check_new(["c"]), ids.rows(["b"]).tolist()
        (['c'], [1])
    """

    def __init__(self, ids: Iterable[PassageId]) -> None:
        self.ids: list[PassageId] = list(ids)
        self.row = {x: i for i, x in enumerate(self.ids)}
        if len(self.row) != len(self.ids):
            raise ValueError("ids must be unique")

    def __len__(self) -> int:
        return len(self.ids)

    def check_new(self, ids: Iterable[PassageId] | Tensor, count: int | None = None) -> list[PassageId]:
        """``ids`` as a list, or a one-line error for a bad or duplicate id, or a number of ids other
        than ``count`` (the embeddings' rows)."""
        if isinstance(ids, (str, bytes, int)):
            raise ValueError(f"ids must be a sequence of str or int ids, got {ids!r}")
        new = list(ids.tolist() if isinstance(ids, Tensor) else ids)
        for x in new:
            if isinstance(x, bool) or not isinstance(x, (str, int)):
                raise ValueError(f"ids must be str or int, got {x!r} of type {type(x).__name__}")
        seen: set[PassageId] = set()
        for x in new:
            if x in self.row:
                raise ValueError(f"ids: {x!r} is already in the corpus (remove it first to edit it)")
            if x in seen:
                raise ValueError(f"ids: {x!r} is given twice")
            seen.add(x)
        if count is not None and len(new) != count:
            raise ValueError(f"ids: {len(new)} ids for {count} embeddings rows")
        return new

    def rows(self, ids: Iterable[PassageId] | Tensor | str | int) -> Tensor:
        """The rows of ``ids`` (sorted, unique), or a one-line error naming an unknown id."""
        items = [ids] if isinstance(ids, (str, bytes, int)) else ids
        out = []
        for x in items.tolist() if isinstance(items, Tensor) else items:
            if x not in self.row:
                raise ValueError(f"ids: {x!r} is not in the corpus")
            out.append(self.row[x])
        return torch.tensor(sorted(set(out)), dtype=torch.long)

    def removal(self, ids: Iterable[PassageId] | str | int, keep_at_least: int = 1) -> tuple[Tensor, Tensor]:
        """The rows of ``ids`` and the ``keep`` mask of the other rows (CPU), or a one-line error
        naming an unknown id or a removal that leaves fewer than ``keep_at_least`` passages."""
        rows = self.rows(ids)
        n = len(self.ids)
        if n - rows.numel() < keep_at_least:
            if keep_at_least == 1:
                raise ValueError(f"ids: removing all {n} passages would leave an empty corpus")
            raise ValueError(f"ids: removing {rows.numel()} of {n} passages would leave fewer than {keep_at_least}")
        keep = torch.ones(n, dtype=torch.bool)
        keep[rows] = False
        return rows, keep

    def add(self, ids: list[PassageId]) -> None:
        for x in ids:
            self.row[x] = len(self.ids)
            self.ids.append(x)

    def keep(self, keep: Tensor) -> None:
        first = int(torch.argmin(keep.to(torch.uint8))) if keep.numel() else 0  # rows before it keep their number
        gone = [self.ids[int(i)] for i in (~keep).nonzero().squeeze(1).tolist()]
        self.ids = list(itertools.compress(self.ids, keep.tolist()))
        for x in gone:
            del self.row[x]
        self.row.update(zip(self.ids[first:], range(first, len(self.ids))))


@dataclass(frozen=True)
class UpdateReport:
    """What an update did.

    Attributes:
        added, removed: passages added and removed.
        num_nodes: passages after the update.
        rows_changed: existing rows whose neighbour list changed (new rows not counted).
        rows_rescanned: rows whose list was computed by a scan (new rows included): against every
            passage, or for an IVF-built graph against the rows of the cells they meet.
        seconds: wall time.
    """

    added: int
    removed: int
    num_nodes: int
    rows_changed: int
    rows_rescanned: int
    seconds: float


@dataclass
class KnnState:
    """A k-NN graph's directed lists (``width >= k``), ``k`` and whether the lists are exact.

    ``cells``: the cells of the IVF build the lists came from (:class:`~geograph.knn.ivf_place.IVFCells`);
    an update then scans only the cells the changed rows meet. ``None``: exact lists, scans
    against every row.

    ``union``: the graph's edges are the union graph of the lists' first ``k`` entries (so an
    update splices the rows it moves, :func:`~geograph.knn.update.union_update`, instead of
    making the whole graph again); False for lists made after the graph (a loaded graph)."""

    lists: TopkLists
    k: int
    exact: bool = True
    cells: IVFCells | None = None
    union: bool = False

    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        """Apply a module's ``_apply`` function (``.to()``, ``.cuda()``) to the lists (and cells)."""
        self.lists = mapped_lists(self.lists, fn)
        if self.cells is not None:
            self.cells.apply(fn)


def kept_lists(values: Tensor, indices: Tensor, k: int, *, exact: bool) -> TopkLists:
    """The directed lists of a build, ``k`` wide (padded when the corpus had fewer than ``k + 1`` passages).
    A short exact list holds every other passage; a short IVF list is what the join found."""
    ok = torch.isfinite(values)
    complete = ok.sum(1) < k if exact else torch.full_like(ok[:, 0], values.shape[0] - 1 < k)
    if values.shape[1] < k:
        pad = k - values.shape[1]
        values = torch.cat([values, values.new_full((values.shape[0], pad), float("-inf"))], 1)
        indices = torch.cat([indices, indices.new_full((indices.shape[0], pad), -1)], 1)
    return TopkLists(values, indices, complete)


def mapped_lists(lists: TopkLists, fn: Callable[[Tensor], Tensor]) -> TopkLists:
    """``lists`` with ``fn`` (a module's ``_apply`` function: ``.to()``, ``.cuda()``) applied to each tensor."""
    return TopkLists(fn(lists.values), fn(lists.indices), fn(lists.complete))


def knn_unit(embeddings: Tensor) -> Tensor:
    """The unit rows :meth:`~geograph.CorpusGraph.from_knn` ranks by (half floats on the CPU in float32)."""
    if embeddings.dtype in (torch.float16, torch.bfloat16) and embeddings.device.type == "cpu":
        return normalize(embeddings.float())
    return unit_rows(embeddings)


def check_new_rows(embeddings: Tensor, like: Tensor, name: str = "embeddings") -> None:
    """``embeddings`` must be ``(M >= 1, D)`` finite rows of ``like``'s dim, dtype and device."""
    check_tensor(embeddings, name, 2)
    if embeddings.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one passage, got shape {tuple(embeddings.shape)}")
    if embeddings.shape[1] != like.shape[1]:
        raise ValueError(f"{name} must have D={like.shape[1]} columns like the corpus, got {tuple(embeddings.shape)}")
    if embeddings.dtype != like.dtype:
        raise ValueError(f"{name} is {embeddings.dtype}, the corpus is {like.dtype}: convert it first")
    if embeddings.device != like.device:
        raise ValueError(f"{name} is on {embeddings.device}, the corpus is on {like.device}: move it first")


def passage_ids(owner: Any, n: int | None = None) -> PassageIds:
    """``owner``'s ids: given (``set_ids``), saved with it (a loaded graph), else ``0 .. n-1``
    (default ``owner.num_nodes``)."""
    if getattr(owner, "passage_ids", None) is None:
        owner.passage_ids = PassageIds(saved_ids(owner) or range(owner.num_nodes if n is None else n))
    known: PassageIds = owner.passage_ids
    return known


def knn_state(graph: CorpusGraph, block: int = DEFAULT_BLOCK) -> KnnState | None:
    """The graph's k-NN lists; made when a k-NN graph has none (e.g. loaded): by one exact scan, or
    above :data:`~geograph.knn.policy.AUTO_EXACT_MAX` passages by an IVF join (and its cells)."""
    state = getattr(graph, "knn_state", None)
    if state is not None and state.lists.values.device != graph.device:  # the graph was moved with .to()
        state.lists = state.lists.to(graph.device)
    if state is not None or not graph.name.startswith("knn"):
        return state
    k = int(graph.build_info.get("k", graph.name[3:] or 0))
    z = knn_unit(graph.embeddings)
    if z.shape[0] > AUTO_EXACT_MAX and k < z.shape[0] - 1:  # a large graph: its lists and cells from an IVF join
        lists = self_topk(z, k, index="ivf", ivf=IVFOptions(recall_target=DEFAULT_RECALL_TARGET), block=block)
        report = lists.ivf
        exact = report is None or report.exact
        cells = None if exact else make_cells(z, nprobe=None if report is None else report.nprobe, block=block)
        state = KnnState(kept_lists(lists.values, lists.indices, k, exact=exact), k, exact=exact, cells=cells)
    else:
        state = KnnState(topk_lists(z, k, block=block), k)
    graph.knn_state = state
    return state


def _set(graph: CorpusGraph, embeddings: Tensor, edge_index: Tensor, rowptr: Tensor | None = None) -> None:
    """Hold the updated embeddings and edges (``rowptr`` given: ``edge_index`` is clean already)."""
    if rowptr is None:
        edge_index = clean_edge_index(edge_index, embeddings.shape[0])
        rowptr = csr_rowptr(edge_index[0], embeddings.shape[0])
    graph.embeddings = embeddings
    graph.edge_index = edge_index
    graph.rowptr = rowptr
    graph.corpus_version += 1


def _knn_edges(graph: CorpusGraph, state: KnnState, old_k: Tensor, pos: Tensor) -> tuple[Tensor, Tensor | None]:
    """The edges of the updated lists: spliced into the graph's (:func:`~geograph.knn.update.union_update`)
    when they are the union graph of the lists, else made from the lists (``rowptr`` None)."""
    new_k = state.lists.indices[:, : state.k]
    if state.union:
        return union_update(graph.edge_index, graph.rowptr, old_k, new_k, pos)
    state.union = True  # from this update on, the graph's edges are the lists' union graph
    return lists_edges(state.lists, state.k), None


def add_passages(
    graph: CorpusGraph,
    embeddings: Tensor,
    ids: Sequence[PassageId],
    *,
    groups: Iterable[Sequence[PassageId]] | None = None,
    block: int = DEFAULT_BLOCK,
) -> UpdateReport:
    """:meth:`geograph.CorpusGraph.add`."""
    t0 = time.perf_counter()
    check_new_rows(embeddings, graph.embeddings)
    known = passage_ids(graph)
    new = known.check_new(ids, embeddings.shape[0])
    n, m = graph.num_nodes, len(new)
    state = knn_state(graph, block)
    emb = torch.cat([graph.embeddings, embeddings])
    changed = rescanned = 0
    if state is not None:
        if groups is not None:
            raise ValueError("groups: a k-NN graph takes its edges from the embeddings, not from groups")
        z = knn_unit(emb)
        old_k = state.lists.indices[:, : state.k]
        if state.cells is not None:  # an IVF build's lists: the new rows meet the cells they probe
            cells = state.cells
            cells.assign = torch.cat([cells.assign, place_rows(cells.centroids, z[n:], block=block)])
            change = lists_add_cells(z, state.lists, cells, block=block)
        else:
            change = lists_add(z, state.lists, block=block)
        state.lists = change.lists
        changed, rescanned = int(change.changed.numel()) - m, int(change.rescanned.numel())
        ei, ptr = _knn_edges(graph, state, old_k, torch.arange(n, device=emb.device))
    elif graph.name == "groups":
        known.add(new)
        try:
            ei = torch.cat([graph.edge_index, _clique_edges(groups, known, emb.device)], 1)
        except ValueError:
            known.keep(torch.arange(n + m) < n)
            raise
        _set(graph, emb, ei)
        return UpdateReport(m, 0, n + m, 0, 0, time.perf_counter() - t0)
    else:
        raise ValueError(
            f"add: a {graph.name!r} graph cannot be extended from embeddings alone; build it again "
            "(k-NN graphs and groups graphs take additions)"
        )
    known.add(new)
    _set(graph, emb, ei, ptr)
    return UpdateReport(m, 0, n + m, changed, rescanned, time.perf_counter() - t0)


def _clique_edges(groups: Iterable[Sequence[PassageId]] | None, known: PassageIds, device: torch.device) -> Tensor:
    if groups is None:
        raise ValueError("groups: a groups graph needs the groups of the new passages (lists of ids)")
    src, dst = [], []
    for group in groups:
        g = known.rows(group) if len(group) else torch.zeros(0, dtype=torch.long)
        a, b = torch.meshgrid(g, g, indexing="ij")
        src.append(a.reshape(-1))
        dst.append(b.reshape(-1))
    if not src:
        return torch.zeros(2, 0, dtype=torch.long, device=device)
    return torch.stack([torch.cat(src), torch.cat(dst)]).to(device)


def remove_passages(graph: CorpusGraph, ids: Iterable[PassageId], *, block: int = DEFAULT_BLOCK) -> UpdateReport:
    """:meth:`geograph.CorpusGraph.remove`."""
    t0 = time.perf_counter()
    known = passage_ids(graph)
    rows, keep = known.removal(ids)
    n = graph.num_nodes
    keep_d = keep.to(graph.device)
    emb = graph.embeddings[keep_d]
    state = knn_state(graph, block)
    changed = rescanned = 0
    ptr = None
    pos = torch.cumsum(keep_d.long(), 0) - 1  # each kept row's new id
    if state is not None:
        if state.cells is not None:
            state.cells.keep(keep_d)
        old_k = state.lists.indices[:, : state.k]
        change = lists_remove(knn_unit(emb), state.lists, keep_d, state.k, block=block, cells=state.cells)
        state.lists = change.lists
        changed, rescanned = int(change.changed.numel()), int(change.rescanned.numel())
        ei, ptr = _knn_edges(graph, state, old_k, pos.masked_fill(~keep_d, -1))
    else:  # every other builder's edges between kept passages do not depend on the removed ones
        src, dst = graph.edge_index
        ok = keep_d[src] & keep_d[dst]
        ei = torch.stack([pos[src[ok]], pos[dst[ok]]])
    known.keep(keep)
    _set(graph, emb, ei, ptr)
    return UpdateReport(0, int(rows.numel()), n - int(rows.numel()), changed, rescanned, time.perf_counter() - t0)


def reorder(graph: Any, order: Sequence[int] | Tensor) -> None:
    """Put a :class:`~geograph.CorpusGraph`'s or :class:`~geograph.G3Graph`'s passages in another order, in place.

    Row ``r`` of the result is row ``order[r]`` before; edges (and ``T``'s values and the G3 density)
    follow their passages, and each row's entries are sorted by column again. This is the graph a
    build on the reordered embeddings gives, except where a build breaks an exact tie of scores by
    the lower index (identical passages). The kept update lists are dropped (the next update makes
    them again with one scan); the corpus version does not move.

    Raises:
        ValueError: ``order`` is not a permutation of ``0 .. V-1``.
    """
    n = graph.num_nodes
    order = torch.as_tensor(order, dtype=torch.long).to(graph.device)
    if order.shape != (n,) or not torch.equal(order.sort().values, torch.arange(n, device=order.device)):
        raise ValueError(f"order must be a permutation of the {n} rows, got {tuple(order.shape)} entries")
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n, device=order.device)
    emb = graph.embeddings[order]
    if hasattr(graph, "edge_index"):  # a CorpusGraph: the union graph, relabelled
        ei = inv[graph.edge_index]
        clean = clean_edge_index(ei, n)
        graph.embeddings, graph.edge_index, graph.rowptr = emb, clean, csr_rowptr(clean[0], n)
        graph.knn_state = None
    else:  # a G3Graph: T's entries relabelled, sorted by (row, column)
        rows = inv[torch.repeat_interleave(torch.arange(n, device=order.device), graph.degree())]
        cols = inv[graph.col]
        perm = torch.argsort(rows * n + cols)
        graph.embeddings, graph.density = emb, graph.density[order]
        graph.col, graph.val = cols[perm], graph.val[perm]
        graph.crow = torch.cat([rows.new_zeros(1), torch.cumsum(torch.bincount(rows, minlength=n), 0)])
        graph.update_state = None
        graph._update_width()
    if getattr(graph, "passage_ids", None) is not None:
        graph.passage_ids = PassageIds([graph.passage_ids.ids[i] for i in order.tolist()])
