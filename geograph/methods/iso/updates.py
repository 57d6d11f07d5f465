"""Adding and removing passages of an :class:`~geograph.ISORetriever`: ``phi`` recomputed only where it can change.

``phi_u`` depends on ``u``'s closed neighbourhood and its 2-hop shell, i.e. on the edges with
an endpoint within one hop of ``u``, and on the volumes of the nodes within two hops. A graph
update changes some edges (the symmetric difference of the old edges, renumbered, and the new
ones); the nodes whose ``phi`` can move are the closed neighbourhoods, in the new graph, of
the new passages and of the changed edges' endpoints (an old neighbour that is no longer
adjacent is such an endpoint itself). Their ``phi`` is computed on
the subgraph induced by the nodes within two hops of them (every path ``phi_u`` reads lies
inside it), the rest is kept; the kept edges are then re-tested on all edges (``O(E)``).
Volumes are kept per passage: the projection runs on the new passages only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from geograph.geometry.isoperimetric import compatible_edges, isoperimetric_ratio
from geograph.graphs.updates import PassageId, UpdateReport, check_new_rows, passage_ids
from geograph.methods.dense.module import DenseRetriever

if TYPE_CHECKING:
    from geograph.methods.iso.module import ISORetriever

__all__ = ["iso_add", "iso_remove", "iso_reorder", "affected_phi_rows"]


def _keys(edge_index: Tensor, n: int) -> Tensor:
    return edge_index[0] * n + edge_index[1]


def _closed_neighbours(edge_index: Tensor, nodes: Tensor, n: int) -> Tensor:
    mark = torch.zeros(n, dtype=torch.bool, device=edge_index.device)
    mark[nodes] = True
    hit = mark[edge_index[0]]
    mark[edge_index[1][hit]] = True
    return mark


def affected_phi_rows(old_edges: Tensor, new_edges: Tensor, new_nodes: Tensor, n: int) -> Tensor:
    """``(n,)`` bool: the nodes whose ``phi`` can differ, given the old edges (renumbered to the new
    rows, removed passages dropped) and the new ones, both with both directions."""
    a, b = _keys(old_edges, n), _keys(new_edges, n)
    changed = torch.cat([old_edges[:, ~torch.isin(a, b)], new_edges[:, ~torch.isin(b, a)]], 1)
    ends = torch.cat([changed.reshape(-1), new_nodes])
    return _closed_neighbours(new_edges, ends, n)  # an old neighbour no longer adjacent is an endpoint itself


def _update_phi(model: ISORetriever, old_edges: Tensor, new_nodes: Tensor) -> None:
    g = model.graph
    n, ei = g.num_nodes, g.edge_index
    rows = affected_phi_rows(old_edges, ei, new_nodes, n)
    ball = _closed_neighbours(ei, rows.nonzero().squeeze(1), n)
    ball = _closed_neighbours(ei, ball.nonzero().squeeze(1), n)  # two hops
    keep = ball[ei[0]] & ball[ei[1]]
    pos = torch.cumsum(ball.long(), 0) - 1
    sub = torch.stack([pos[ei[0][keep]], pos[ei[1][keep]]])
    nodes = ball.nonzero().squeeze(1)
    vol = model._volume.to(g.device, torch.float64)
    phi_sub = isoperimetric_ratio(sub, vol[nodes], int(nodes.numel())).to(model.phi.dtype) if nodes.numel() else None
    phi = model.phi.new_zeros(n) if model.phi.numel() != n else model.phi.clone()
    if phi_sub is not None:
        phi[rows] = phi_sub[pos[rows]]
    model.phi = phi
    _kept_edges(model)


def _kept_edges(model: ISORetriever) -> None:
    """The kept edges, the largest degree and the dense index, from the graph and ``phi`` (``O(E)``)."""
    g = model.graph
    n, ei = g.num_nodes, g.edge_index
    kept = compatible_edges(ei, model.phi, beta=model.beta)
    kept_ei = ei[:, kept]
    model.kept_keys = torch.sort(kept_ei[0] * n + kept_ei[1]).values
    model.pruned_share = 1.0 - float(kept.float().mean()) if kept.numel() else 0.0
    model._max_degree = int(g.degree().max()) if n else 0
    model.dense = DenseRetriever(g.embeddings, persistent=False, chunk_size=model.dense.chunk_size)


def iso_add(model: ISORetriever, embeddings: Tensor, ids: Sequence[PassageId], **kwargs: Any) -> UpdateReport:
    """:meth:`geograph.ISORetriever.add`."""
    g = model.graph
    n, old = g.num_nodes, g.edge_index.clone()
    check_new_rows(embeddings, g.embeddings)  # before the projection sees them
    vol_new = model._volumes(embeddings)
    old_phi = model.phi
    report = g.add(embeddings, ids, **kwargs)
    model._volume = torch.cat([model._volume, vol_new.to(model._volume)])
    model.phi = torch.cat([old_phi, old_phi.new_zeros(report.added)])
    _update_phi(model, old, torch.arange(n, n + report.added, device=g.device))
    return report


def iso_remove(model: ISORetriever, ids: Iterable[PassageId] | PassageId) -> UpdateReport:
    """:meth:`geograph.ISORetriever.remove`."""
    g = model.graph
    ids = list(ids) if not isinstance(ids, (str, int)) else [ids]
    rows = passage_ids(g).rows(ids)
    n = g.num_nodes
    keep = torch.ones(n, dtype=torch.bool)
    keep[rows] = False
    old = g.edge_index.clone()
    report = g.remove(ids)
    keep_d = keep.to(g.device)
    pos = torch.cumsum(keep_d.long(), 0) - 1
    ok = keep_d[old[0]] & keep_d[old[1]]
    old_kept = torch.stack([pos[old[0][ok]], pos[old[1][ok]]])
    # a kept passage that lost an edge to a removed one: its neighbourhood changed
    lost = torch.cat([old[0][~ok & keep_d[old[0]]], old[1][~ok & keep_d[old[1]]]])
    model._volume = model._volume[keep.to(model._volume.device)]
    model.phi = model.phi[keep_d]
    _update_phi(model, old_kept, pos[lost])
    return report


def iso_reorder(model: ISORetriever, order: Sequence[int] | Tensor) -> None:
    """Put the retriever's passages in another order, in place (:func:`geograph.graphs.updates.reorder`
    on its graph: row ``r`` becomes row ``order[r]`` before). ``phi`` and the volumes follow their
    passages (``phi`` depends on the graph's shape, not on its numbering) and the kept edges are
    re-tested (``O(E)``); the projection is not run again.

    Raises:
        ValueError: ``order`` is not a permutation of ``0 .. V-1``.
    """
    from geograph.graphs.updates import reorder

    reorder(model.graph, order)  # (checks order)
    order = torch.as_tensor(order, dtype=torch.long)
    model._volume = model._volume[order.to(model._volume.device)]
    model.phi = model.phi[order.to(model.phi.device)]
    _kept_edges(model)
