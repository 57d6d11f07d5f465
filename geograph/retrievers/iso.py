"""ISO-RAG: isoperimetric edge pruning and personalized PageRank on query-local subgraphs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from geograph._checks import (check_finite_float, check_finite_where, check_positive_int, check_same_device,
                              check_tensor, check_unit_interval)
from geograph.corpus import CorpusGraph
from geograph.encoders import IdentityPoincare, conformal_volume
from geograph.functional.isoperimetric import compatible_edges, isoperimetric_ratio
from geograph.functional.pagerank import personalized_pagerank
from geograph.functional.similarity import normalize
from geograph.outputs import RetrievalOutput, topk_by_key, topk_stable
from geograph.retrievers.dense import DenseRetriever

__all__ = ["ISORetriever", "LocalSubgraph"]


@dataclass(frozen=True)
class LocalSubgraph:
    """The padded query-local subgraphs of one batch (returned by :meth:`ISORetriever.local`).

    Attributes:
        nodes: ``(B, n)`` long corpus ids, by dense score; ``-1`` at padding.
        mask: ``(B, n)`` bool, True = real node.
        dense: ``(B, n)`` cosine to the query (``-inf`` at padding).
        adj: ``(B, n, n)`` bool kept edges among the nodes.
        personalization: ``(B, n)`` ``softmax(tau * s)`` over the seeds, 0 elsewhere.
    """

    nodes: Tensor
    mask: Tensor
    dense: Tensor
    adj: Tensor
    personalization: Tensor


class ISORetriever(nn.Module):
    r"""Retrieve passages by dense similarity and PageRank over an isoperimetrically pruned graph.

    Offline, once per (graph, projection), cached on the module: ``z_u = f_theta(h_u)`` in the
    Poincare ball, volumes ``v(u) = lambda(z_u) ** p`` (:func:`~geograph.encoders.conformal_volume`),
    ``phi`` by :func:`~geograph.functional.isoperimetric_ratio`, and the edges kept by
    :func:`~geograph.functional.compatible_edges` with ``beta``. Without a ``projection`` the
    default signal is :class:`~geograph.encoders.IdentityPoincare` (``exp_0`` of the raw
    embedding: for unit-norm embeddings every node gets the same volume, so ``phi`` is purely
    combinatorial).

    Per query, batched (no loop over queries): dense cosine ``s``; seeds = top-``m``; the local
    set = dense top-``L`` plus the ``hops``-hop neighbourhood of the seeds in the full graph,
    deduplicated and capped at ``max_nodes`` by dense score; its induced subgraph with kept
    edges only (unit weights); personalization ``softmax(tau * s)`` on the seeds;
    :func:`~geograph.functional.personalized_pagerank` with ``alpha``; then with both
    min-max normalised over the local set (a constant vector normalises to 0)

    .. math:: \mathrm{score} = \lambda_g\, \hat\pi + \lambda_d\, \hat s

    and the top-``k`` of the local set are returned. ``k`` may not exceed
    ``min(max(L, m), max_nodes, V)`` (the local set's guaranteed size); ``m`` and ``L`` larger
    than ``V`` clamp to ``V``.

    Padded widths are bounded a priori, so a call makes no host read after validating the
    query: hop ``h`` lists ``m * D^h`` neighbour slots a query, with ``D`` the graph's largest
    degree (read once, at construction and :meth:`refresh`). A graph with one huge hub thus
    widens every query's neighbour list; the local set is still capped at ``max_nodes``.

    Ties: equal dense scores at the ``max_nodes`` cap and equal final scores are broken by the
    lowest corpus index (:func:`~geograph.outputs.topk_stable`).

    State: the graph and the projection are submodules, so ``.to()``, ``.cuda()`` and
    ``state_dict()`` move or save everything the answers depend on. What is derived from them
    (``phi``, the kept edges, the largest degree and the dense index over the graph's
    embeddings) is not saved: :meth:`refresh` rebuilds it at construction and after every
    ``load_state_dict`` of the retriever (a load hook), so a retriever loaded with another's
    state answers exactly like it. Loading a state into ``graph`` or ``projection`` alone
    needs a :meth:`refresh` call afterwards. The graph and the projection must
    sit on one device at construction, and a query on another device than the module raises a
    ``ValueError`` naming both. Dense scores are computed in the corpus's dtype; the returned
    scores have the query's floating dtype.

    Compilation: ``torch.compile(model, fullgraph=True)`` gives the same output (tested): no
    graph break, no data-dependent shape. ``torch.export`` does not work yet (its unflattening
    fails on the graph submodule's buffers).

    Args:
        graph: the :class:`~geograph.CorpusGraph` (its embeddings are the dense index).
        projection: f_theta (e.g. a trained :class:`~geograph.PoincareProjection`); ``None`` =
            the identity signal above.
        m: seeds per query.
        L: dense candidates in the local set.
        hops: neighbourhood radius around the seeds (0 = none).
        max_nodes: cap on the local set.
        beta: edge compatibility threshold.
        p: volume power.
        tau: personalization temperature.
        alpha: PageRank damping.
        lambda_g, lambda_d: weights of the graph and dense terms.
        max_iter: PageRank iterations (fixed; no host sync).

    Shape:
        query ``(B, D)`` -> :class:`~geograph.RetrievalOutput` ``indices (B, k)``, ``scores (B, k)``.

    References:
        ISO-RAG: Isoperimetric Noise Control for Retrieval-Augmented Generation (no arXiv id or
        venue known to us).

    Example:
        >>> emb = torch.nn.functional.normalize(torch.randn(30, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> iso = ISORetriever(CorpusGraph.from_knn(emb, 3), m=2, L=5, max_nodes=10)
        >>> iso(emb[:2], k=3).indices.shape
        torch.Size([2, 3])
    """

    def __init__(
        self,
        graph: CorpusGraph,
        *,
        projection: Optional[nn.Module] = None,
        m: int = 5,
        L: int = 50,
        hops: int = 1,
        max_nodes: int = 100,
        beta: float = 0.4,
        p: float = 2.0,
        tau: float = 10.0,
        alpha: float = 0.85,
        lambda_g: float = 0.5,
        lambda_d: float = 0.5,
        max_iter: int = 100,
    ) -> None:
        super().__init__()
        if not isinstance(graph, CorpusGraph):
            raise ValueError(f"graph must be a CorpusGraph, got {type(graph).__name__}")
        if projection is not None:
            for t in list(projection.parameters()) + list(projection.buffers()):
                if t.device != graph.device:
                    raise ValueError(f"the projection is on {t.device} but the graph is on {graph.device}: "
                                     "move one of them with .to() first")
        self.graph = graph
        self.projection = projection if projection is not None else IdentityPoincare()
        self.m = check_positive_int(m, "m")
        self.L = check_positive_int(L, "L")
        if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
            raise ValueError(f"hops must be a non-negative integer, got {hops!r}")
        self.hops = hops
        self.max_nodes = check_positive_int(max_nodes, "max_nodes")
        if self.max_nodes < self.m:
            raise ValueError(f"max_nodes ({max_nodes}) must be at least m ({m})")
        self.beta = check_unit_interval(beta, "beta")
        self.p = check_finite_float(p, "p")
        self.tau = check_finite_float(tau, "tau")
        self.alpha = check_finite_float(alpha, "alpha")
        if not 0.0 <= self.alpha < 1.0:
            raise ValueError(f"alpha must lie in [0, 1), got {alpha!r}")
        self.lambda_g = check_finite_float(lambda_g, "lambda_g")
        self.lambda_d = check_finite_float(lambda_d, "lambda_d")
        self.max_iter = check_positive_int(max_iter, "max_iter")
        self.register_buffer("phi", torch.empty(0), persistent=False)
        self.register_buffer("kept_keys", torch.empty(0, dtype=torch.long), persistent=False)
        self.refresh()
        self.register_load_state_dict_post_hook(_refresh_after_load)

    @torch.no_grad()
    def refresh(self, chunk_size: int = 65536) -> None:
        """Recompute ``phi``, the kept edges and the dense index from the graph and the projection.

        Called at construction and by ``load_state_dict``; call it after changing the
        projection, ``beta`` or ``p``, or after loading a state into ``graph`` or ``projection``
        alone. Host reads here are offline (once per graph and projection): the finiteness
        check, the pruned share, the 2-hop walk's size and the graph's largest degree (the a
        priori padded width of :meth:`local`).
        """
        g = self.graph
        emb = g.embeddings
        old = self._modules.get("dense")
        kw = {} if old is None else {"chunk_size": old.chunk_size}
        self.dense = DenseRetriever(emb, persistent=False, **kw)  # derived from the graph: not in state_dict()
        self._max_degree = int(g.degree().max()) if g.num_nodes else 0
        # the projection's dtype; the identity signal (whose only parameter is geoopt's float32
        # curvature) keeps the embeddings' dtype
        params = [] if isinstance(self.projection, IdentityPoincare) else list(self.projection.parameters())
        dev = params[0].device if params else emb.device
        dtype = params[0].dtype if params else emb.dtype
        was_training = self.projection.training
        self.projection.eval()
        z = torch.cat([self.projection(emb[s : s + chunk_size].to(dev, dtype)) for s in range(0, g.num_nodes, chunk_size)])
        self.projection.train(was_training)
        c = float(getattr(self.projection, "c", 1.0))
        if not bool(torch.isfinite(z).all()):
            raise ValueError("the projection produced NaN/inf for some passages")
        vol = conformal_volume(z.double(), p=self.p, c=c)
        self.phi = isoperimetric_ratio(g.edge_index, vol.to(emb.device), g.num_nodes).to(emb.dtype)
        kept = compatible_edges(g.edge_index, self.phi, beta=self.beta)
        ei = g.edge_index[:, kept]
        self.kept_keys = torch.sort(ei[0] * g.num_nodes + ei[1]).values
        self.pruned_share = 1.0 - float(kept.float().mean()) if kept.numel() else 0.0

    def _neighbours(self, seeds: Tensor, seed_ok: Tensor) -> tuple[Tensor, Tensor]:
        """All neighbours ``(B, S * Dmax)`` of ``seeds (B, S)`` in the full graph, with validity.

        ``Dmax`` is the graph's largest degree, known a priori: no host read.
        """
        rowptr, col = self.graph.rowptr, self.graph.col
        safe = seeds.clamp_min(0)
        start, deg = rowptr[safe], rowptr[safe + 1] - rowptr[safe]
        deg = torch.where(seed_ok, deg, torch.zeros_like(deg))
        dmax = self._max_degree
        if dmax == 0:
            return seeds.new_zeros(seeds.shape[0], 0), seed_ok.new_zeros(seeds.shape[0], 0)
        offs = torch.arange(dmax, device=seeds.device)
        ok = offs < deg.unsqueeze(-1)
        idx = torch.where(ok, start.unsqueeze(-1) + offs, torch.zeros_like(start).unsqueeze(-1))
        return col[idx].flatten(1), ok.flatten(1)

    def local(self, query: Tensor) -> LocalSubgraph:
        """The batch's padded local subgraphs (exposed for inspection and the benchmark)."""
        check_same_device(query, "query", self.graph.device, "the ISORetriever")
        check_tensor(query, "query", 2, finite=False)
        check_finite_where(query, None, "query")
        g = self.graph
        if query.shape[1] != self.dense.embeddings.shape[1]:
            raise ValueError(f"query must have shape (B, D={self.dense.embeddings.shape[1]}), got {tuple(query.shape)}")
        v = g.num_nodes
        top = self.dense(query, min(max(self.L, self.m), v))
        seeds = top.indices[:, : self.m]
        pool, pool_ok = [top.indices], [torch.ones_like(top.indices, dtype=torch.bool)]
        frontier, frontier_ok = seeds, torch.ones_like(seeds, dtype=torch.bool)
        for _ in range(self.hops):
            frontier, frontier_ok = self._neighbours(frontier, frontier_ok)
            pool.append(frontier)
            pool_ok.append(frontier_ok)
        cand = torch.cat(pool, 1)
        ok = torch.cat(pool_ok, 1)
        # dedupe per row: sort ids (invalid ones as v), keep the first of each run
        ids = torch.where(ok, cand, torch.full_like(cand, v))
        ids = ids.sort(1).values
        first = torch.ones_like(ids, dtype=torch.bool)
        first[:, 1:] = ids[:, 1:] != ids[:, :-1]
        ok = first & (ids < v)
        qn = normalize(query.to(self.dense.embeddings.dtype))
        emb = self.dense.embeddings[ids.clamp_max(v - 1)]  # unit rows
        s = (emb * qn.unsqueeze(1)).sum(-1)
        s = torch.where(ok, s, torch.full_like(s, float("-inf")))
        n = min(self.max_nodes, ids.shape[1])
        dense, pos = topk_stable(s, n)  # by dense score (ids ascending: ties to the lower id), seeds survive
        nodes = ids.gather(1, pos)
        mask = torch.isfinite(dense)
        nodes = torch.where(mask, nodes, torch.full_like(nodes, -1))
        key = nodes.clamp_min(0).unsqueeze(2) * v + nodes.clamp_min(0).unsqueeze(1)
        if self.kept_keys.numel():
            at = torch.searchsorted(self.kept_keys, key.flatten(1)).clamp_max(self.kept_keys.numel() - 1)
            adj = (self.kept_keys[at] == key.flatten(1)).view_as(key)
        else:
            adj = torch.zeros_like(key, dtype=torch.bool)
        adj = adj & mask.unsqueeze(2) & mask.unsqueeze(1)
        is_seed = (nodes.unsqueeze(2) == seeds.unsqueeze(1)).any(2) & mask
        logits = torch.where(is_seed, self.tau * dense, torch.full_like(dense, float("-inf")))
        r = torch.softmax(logits, dim=1)
        r = torch.where(torch.isfinite(r), r, torch.zeros_like(r))
        return LocalSubgraph(nodes, mask, dense, adj, r)

    @property
    def max_k(self) -> int:
        """The largest ``k`` every query can get: the guaranteed local set size min(max(L, m), max_nodes, V)."""
        return min(max(self.L, self.m), self.max_nodes, self.graph.num_nodes)

    def forward(self, query: Tensor, k: int) -> RetrievalOutput:
        k = check_positive_int(k, "k")
        limit = self.max_k
        if k > limit:
            raise ValueError(f"k={k} exceeds the guaranteed local set size min(max(L, m), max_nodes, V) = {limit}")
        sub = self.local(query)
        w = sub.adj.to(sub.dense.dtype)
        pi = personalized_pagerank(w, sub.personalization, sub.mask, alpha=self.alpha, max_iter=self.max_iter)
        score = self.lambda_g * _minmax(pi, sub.mask) + self.lambda_d * _minmax(sub.dense, sub.mask)
        score = torch.where(sub.mask, score, torch.full_like(score, float("-inf")))
        top, pos = topk_by_key(score, torch.where(sub.mask, sub.nodes, self.graph.num_nodes), k)
        return RetrievalOutput(indices=sub.nodes.gather(1, pos), scores=top.to(query.dtype))

    def extra_repr(self) -> str:
        return (f"nodes={self.graph.num_nodes}, m={self.m}, L={self.L}, hops={self.hops}, max_nodes={self.max_nodes}, "
                f"beta={self.beta}, p={self.p}, tau={self.tau}, alpha={self.alpha}")


def _refresh_after_load(module: ISORetriever, incompatible_keys) -> None:
    """``load_state_dict`` post hook: the derived state follows the loaded graph and projection."""
    module.refresh()


def _minmax(x: Tensor, mask: Tensor) -> Tensor:
    big = torch.finfo(x.dtype).max
    lo = torch.where(mask, x, torch.full_like(x, big)).amin(1, keepdim=True)
    hi = torch.where(mask, x, torch.full_like(x, -big)).amax(1, keepdim=True)
    span = hi - lo
    out = (x - lo) / torch.where(span > 0, span, torch.ones_like(span))
    return torch.where(mask & (span > 0), out, torch.zeros_like(x))
