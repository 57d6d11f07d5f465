"""Adding and removing passages of a :class:`~geograph.G3Graph` in place, equal to an exact rebuild.

G3's weights ``W_ij = f(S_ij) e^{-beta rho_j}`` depend on the density ``rho``, which every
passage moves (its raw sums, and their min-max normalisation), so every penalty changes with
every update. What does not change is each row's ranking of **cosines**. The update keeps:

- the raw density sums ``sum_{k != j} max(0, S_jk)`` of every passage (float64), updated
  exactly by the ``(old x new)`` / ``(kept x removed)`` blocks of the change, then min-max
  normalised again over all passages (``O(N)``);
- every row's top-``K'`` cosine list below the band's ceiling
  (:class:`~geograph.knn.update.TopkLists`, updated by
  :func:`~geograph.knn.update.lists_add` / :func:`~geograph.knn.update.lists_remove`).

``T`` is then made from the lists under the new penalties by
:func:`~geograph.functional.gain_transition_edges` with ``ranking="cosine"``: a row whose
list proves it (every pair outside weighs at most ``f(x_K')``, below the row's kept
``max_degree``-th weight) costs ``O(K')``; a row it cannot prove is recomputed against every
passage. The result is the exact build's ``T`` (``index="exact"``) up to float rounding of the
density sums. Costs: ``O((N M + R N) D + N K')`` for ``M`` changed passages and ``R``
unproved rows (:class:`G3UpdateReport`); the first update of a graph without lists pays one
all-pairs pass (the cost of the build's density stage) to make them. ``max_degree=None`` (the
full ``T``) is rebuilt from the kept density: every weight of it moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from geograph.geometry.gain import _unit, candidate_cap, gain_transition_edges
from geograph.graphs.updates import check_new_rows, mapped_lists, passage_ids
from geograph.knn.allpairs import DEFAULT_BLOCK, Score, tiled_pairs
from geograph.knn.update import TopkLists, lists_add, lists_remove
from geograph.ops.similarity import minmax_normalize

if TYPE_CHECKING:
    from geograph.graphs.g3_graph import G3Graph
    from geograph.graphs.updates import PassageId

__all__ = ["G3State", "G3UpdateReport", "g3_add", "g3_remove", "DEFAULT_UPDATE_CANDIDATES"]

#: cosine candidates a row keeps for updates unless told (twice ``max_degree``, at least this)
DEFAULT_UPDATE_CANDIDATES = 256


@dataclass
class G3State:
    """What a :class:`~geograph.G3Graph` keeps to be updated: raw density sums and cosine lists."""

    raw: Tensor
    lists: TopkLists | None

    def apply(self, fn: Callable[[Tensor], Tensor]) -> None:
        """Apply a module's ``_apply`` function (``.to()``, ``.cuda()``) to the sums and lists."""
        self.raw = fn(self.raw)
        if self.lists is not None:
            self.lists = mapped_lists(self.lists, fn)


@dataclass(frozen=True)
class G3UpdateReport:
    """What a G3 update did.

    Attributes:
        added, removed, num_nodes: passages added, removed, and after the update.
        lists_changed: rows whose cosine list changed.
        lists_rescanned: rows whose cosine list was computed by a scan (new rows included).
        certified: rows of ``T`` proven from their lists.
        redone: rows of ``T`` recomputed against every passage.
        seconds: wall time.
    """

    added: int
    removed: int
    num_nodes: int
    lists_changed: int
    lists_rescanned: int
    certified: int
    redone: int
    seconds: float


def _positive(s: Tensor) -> Tensor:
    return s.clamp_min(0)


def _width(graph: G3Graph) -> int:
    return max(2 * (graph.max_degree or 0), DEFAULT_UPDATE_CANDIDATES)


def g3_state(graph: G3Graph, block: int = DEFAULT_BLOCK, width: int | None = None) -> G3State:
    """The graph's update state, made by one all-pairs pass when it has none (``width``: the
    cosine list length, default ``max(2 max_degree, DEFAULT_UPDATE_CANDIDATES)``)."""
    state = getattr(graph, "update_state", None)
    if state is not None:
        if state.raw.device != graph.device:  # the graph was moved with .to()
            state = G3State(state.raw.to(graph.device), state.lists and state.lists.to(graph.device))
            graph.update_state = state
        return state
    z = _unit(graph.embeddings)
    if graph.max_degree is None:
        _, _, sums = tiled_pairs(z, z, 0, block=block, exclude=True, row_sum=_positive)
        assert sums is not None  # (a row_sum was given)
        state = G3State(sums.double(), None)
    else:
        width = _width(graph) if width is None else max(int(width), graph.max_degree)
        k = min(width, z.shape[0] - 1)
        cap = candidate_cap(graph.band)
        v, i, sums = tiled_pairs(z, z, k, block=block, exclude=True, row_sum=_positive, score=_score(cap))
        assert sums is not None
        ok = torch.isfinite(v)
        i = torch.where(ok, i, torch.full_like(i, -1))
        if k < width:
            v = torch.cat([v, v.new_full((v.shape[0], width - k), float("-inf"))], 1)
            i = torch.cat([i, i.new_full((i.shape[0], width - k), -1)], 1)
        state = G3State(sums.double(), TopkLists(v, i, ok.sum(1) < width))
    graph.update_state = state
    return state


def _score(cap: Callable[[Tensor], Tensor] | None) -> Score | None:
    return None if cap is None else (lambda s, cols: cap(s))


def _block_sums(z_rows: Tensor, z_cols: Tensor, block: int) -> Tensor:
    """``sum_c max(0, <z_r, z_c>)`` of every row against the given columns (float64)."""
    out = torch.zeros(z_rows.shape[0], dtype=torch.float64, device=z_rows.device)
    for r0 in range(0, z_rows.shape[0], block):
        out[r0 : r0 + block] = (z_rows[r0 : r0 + block] @ z_cols.T).clamp_min_(0).sum(1, dtype=torch.float64)
    return out


def _remake(graph: G3Graph, embeddings: Tensor, z: Tensor, state: G3State, block: int) -> tuple[int, int]:
    raw = state.raw
    rho = minmax_normalize(raw, lo=raw.min(), hi=raw.max(), clip=True)
    cand = None if state.lists is None else (state.lists.values.clone(), state.lists.indices.clone())
    built = gain_transition_edges(
        z,
        band=graph.band,
        beta=graph.beta,
        max_degree=graph.max_degree,
        block=block,
        density=rho.to(z.dtype),
        candidates=cand,
        ranking="cosine",
    )
    t, edges = built.transition, built.edges
    graph.embeddings = embeddings
    graph.density = rho.to(embeddings.dtype)
    graph.crow = t.crow_indices().clone()
    graph.col = t.col_indices().clone()
    graph.val = t.values().to(embeddings.dtype).clone()
    graph._update_width()
    graph.corpus_version += 1
    if edges is None:
        return 0, z.shape[0]
    return int(edges.certified.sum()), int(edges.redone.sum())


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
    emb = torch.cat([graph.embeddings, embeddings])
    z = _unit(emb)
    new_rows = torch.arange(n, n + m, device=z.device)
    _, _, fresh = tiled_pairs(z[n:], z, 0, block=block, exclude=new_rows, row_sum=_positive)
    assert fresh is not None
    raw = torch.cat([state.raw + _block_sums(z[:n], z[n:], block), fresh.double()])
    changed = rescanned = 0
    lists = None
    if state.lists is not None:
        change = lists_add(z, state.lists, transform=candidate_cap(graph.band), block=block)
        lists, changed, rescanned = change.lists, int(change.changed.numel()) - m, int(change.rescanned.numel())
    state_new = G3State(raw, lists)
    certified, redone = _remake(graph, emb, z, state_new, block)
    graph.update_state = state_new
    known.add(new)
    return G3UpdateReport(m, 0, n + m, changed, rescanned, certified, redone, time.perf_counter() - t0)


def g3_remove(graph: G3Graph, ids: Iterable[PassageId], *, block: int = DEFAULT_BLOCK) -> G3UpdateReport:
    """:meth:`geograph.G3Graph.remove`."""
    t0 = time.perf_counter()
    known = passage_ids(graph)
    rows, keep = known.removal(ids, keep_at_least=2)
    n = graph.num_nodes
    state = g3_state(graph, block)
    keep_d = keep.to(graph.device)
    z_all = _unit(graph.embeddings)
    z = z_all[keep_d]
    raw = state.raw[keep_d] - _block_sums(z, z_all[rows.to(graph.device)], block)
    changed = rescanned = 0
    lists = None
    if state.lists is not None:
        cap = candidate_cap(graph.band)
        change = lists_remove(z, state.lists, keep_d, state.lists.width, transform=cap, block=block)
        lists, changed, rescanned = change.lists, int(change.changed.numel()), int(change.rescanned.numel())
    state_new = G3State(raw, lists)
    certified, redone = _remake(graph, graph.embeddings[keep_d], z, state_new, block)
    graph.update_state = state_new
    known.keep(keep)
    return G3UpdateReport(
        0, int(rows.numel()), n - int(rows.numel()), changed, rescanned, certified, redone, time.perf_counter() - t0
    )
