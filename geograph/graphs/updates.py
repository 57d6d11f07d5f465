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

import numpy as np
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
    "appended",
    "kept_rows",
    "knn_unit",
    "kept_lists",
    "reorder",
]


#: a passage's id: a string or an integer
PassageId = str | int


class PassageIds:
    """The ids of a corpus's passages, in row order, and each id's row.

    Each id has a serial number while it is in the corpus and the row of each serial is kept in an
    array, so that an update costs its own ids in Python and array operations for the rest: a
    removal renumbers the rows by one pass over the array instead of writing every later id's row
    into a dict. A corpus made without ids (``range(n)``) needs no dict at all until ids are added:
    id ``i < n`` is serial ``i``.

    Example:
        >>> ids = PassageIds(["a", "b"])
        >>> ids.check_new(["c"]), ids.rows(["b"]).tolist()
        (['c'], [1])
        >>> plain = PassageIds(range(5))
        >>> plain.keep(torch.tensor([True, False, True, True, True]))
        >>> plain.add([1]); plain.ids, plain.rows([4, 1]).tolist()
        ([0, 2, 3, 4, 1], [3, 4])
    """

    #: serials of removed ids past twice the live ones that make :meth:`keep` number the ids again
    RENUMBER_SLACK = 1024

    def __init__(self, ids: Iterable[PassageId]) -> None:
        self.ids: list[PassageId] = list(ids)
        self._number(plain=isinstance(ids, range) and ids.start == 0 and ids.step == 1)

    def _number(self, *, plain: bool) -> None:
        """Serials ``0 .. N-1`` in row order (``plain``: the ids are ``range(N)``, no dict)."""
        n = len(self.ids)
        #: ids 0 .. _plain - 1 (a corpus made as range(n)) are their own serials; the others are in _serial
        self._plain = n if plain else 0
        self._serial: dict[PassageId, int] = {} if plain else {x: i for i, x in enumerate(self.ids)}
        if len(self._serial) != n - self._plain:
            raise ValueError("ids must be unique")
        self._row_of = np.arange(n, dtype=np.int64)  # each serial's row, -1 once removed

    def __len__(self) -> int:
        return len(self.ids)

    def serial(self, x: Any) -> int | None:
        """``x``'s serial number, or ``None`` when it is not in the corpus."""
        if self._plain and isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
            i = int(x)  # a numpy integer too, as a dict lookup by equal hash would find it
            if 0 <= i < self._plain and self._row_of[i] >= 0:
                return i
        return self._serial.get(x)

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
            if self.serial(x) is not None:
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
        serials = []
        for x in items.tolist() if isinstance(items, Tensor) else items:
            s = self.serial(x)
            if s is None:
                raise ValueError(f"ids: {x!r} is not in the corpus")
            serials.append(s)
        return torch.from_numpy(np.unique(self._row_of[np.asarray(serials, dtype=np.int64)]))

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
        first, n = len(self._row_of), len(self.ids)
        self._serial.update(zip(ids, range(first, first + len(ids))))
        self._row_of = np.concatenate([self._row_of, np.arange(n, n + len(ids), dtype=np.int64)])
        self.ids.extend(ids)

    def keep(self, keep: Tensor) -> None:
        """Keep the rows where ``keep`` (``(N,)`` bool) is True, renumbered in order."""
        mask = keep.cpu().numpy().astype(bool, copy=False)
        for r in np.flatnonzero(~mask).tolist():
            self._serial.pop(self.ids[r], None)  # a plain id leaves by its row below
        self.ids = list(itertools.compress(self.ids, mask.tolist()))
        pos = np.cumsum(mask) - 1
        row = self._row_of
        live = row >= 0
        row[live] = np.where(mask[row[live]], pos[row[live]], -1)
        if row.size > 2 * len(self.ids) + self.RENUMBER_SLACK:  # mostly removed ids' serials: number again
            self._number(plain=False)


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


#: an append that cannot write into spare rows allocates this share of the rows again as spare
#: (1/8), so that a corpus growing by small additions copies its embeddings once per 1/8 of growth
SPARE_SHARE = 8


def appended(corpus: Tensor, rows: Tensor) -> Tensor:
    """``torch.cat([corpus, rows])``, written into spare rows where an earlier call left some past
    ``corpus`` in its buffer, so that an addition costs its own rows and not a copy of the corpus
    (and a fresh allocation of it, whose first writes fault every page in).

    The result is a view of the first rows of a larger buffer. A buffer records how many of its
    rows are in use (``_geograph_rows``); only a tensor ending there appends in place, so a view
    held from before an append, or the same rows held by two graphs, never sees its rows written:
    it gets a buffer of its own. Rows before ``corpus.shape[0]`` are never written.

    Example:
        >>> a = appended(torch.zeros(16, 2), torch.ones(1, 2))  # a new buffer, 2 rows spare
        >>> b = appended(a, torch.full((2, 2), 2.0))  # into a's spare rows: no copy of a
        >>> b.data_ptr() == a.data_ptr(), b[-3:, 0].tolist(), a.shape[0]
        (True, [1.0, 2.0, 2.0], 17)
        >>> appended(a, torch.ones(1, 2)).data_ptr() == a.data_ptr()  # a's next rows are b's now
        False
    """
    n, m = corpus.shape[0], rows.shape[0]
    buf = corpus._base
    if (
        buf is not None
        and getattr(buf, "_geograph_rows", None) == n
        and buf.data_ptr() == corpus.data_ptr()
        and corpus.is_contiguous()
        and buf.shape[1:] == corpus.shape[1:]
        and buf.shape[0] >= n + m
        and buf.dtype == rows.dtype
        and buf.device == rows.device
    ):
        buf[n : n + m] = rows
    else:
        buf = corpus.new_empty((n + m + max(m, (n + m) // SPARE_SHARE), *corpus.shape[1:]))
        buf[:n] = corpus
        buf[n : n + m] = rows
    buf._geograph_rows = n + m  # type: ignore[attr-defined]  # a plain attribute of the tensor object
    return buf[: n + m]


def kept_rows(corpus: Tensor, keep: Tensor) -> Tensor:
    """``corpus[keep]`` (``keep``: ``(N,)`` bool) in a new buffer with spare rows past them, as
    :func:`appended` leaves one, so that the next addition writes there instead of copying.

    Example:
        >>> kept = kept_rows(torch.arange(6.0).view(3, 2), torch.tensor([True, False, True]))
        >>> kept.tolist(), appended(kept, torch.ones(1, 2)).data_ptr() == kept.data_ptr()
        ([[0.0, 1.0], [4.0, 5.0]], True)
    """
    idx = keep.to(corpus.device).nonzero().squeeze(1)
    n = idx.numel()
    buf = corpus.new_empty((n + max(1, n // SPARE_SHARE), *corpus.shape[1:]))
    torch.index_select(corpus, 0, idx, out=buf[:n])
    buf._geograph_rows = n  # type: ignore[attr-defined]  # a plain attribute of the tensor object
    return buf[:n]


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
    emb = appended(graph.embeddings, embeddings)
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
    emb = kept_rows(graph.embeddings, keep_d)
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
