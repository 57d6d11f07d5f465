"""ISO-RAG: isoperimetric edge pruning and personalized PageRank on query-local subgraphs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields, replace
from typing import Any, TypedDict, cast

import torch
from torch import Tensor, nn

from geograph.geometry.isoperimetric import compatible_edges, conformal_volume, isoperimetric_ratio
from geograph.graphs.corpus_graph import CorpusGraph
from geograph.graphs.updates import PassageId, UpdateReport
from geograph.methods.dense.module import DenseRetriever
from geograph.methods.iso.functional import IsoOptions, _local_subgraph, _retrieve, check_iso_query, iso_max_k
from geograph.methods.iso.updates import iso_add, iso_remove
from geograph.outputs import LocalSubgraph, RetrievalOutput
from geograph.projection import IdentityPoincare

__all__ = ["ISORetriever", "LocalSubgraph"]


#: the hyperparameters an :class:`ISORetriever` holds as attributes (:class:`IsoOptions`)
_OPTION_NAMES = frozenset(f.name for f in fields(IsoOptions))


class _DenseKeywords(TypedDict, total=False):
    """The :class:`DenseRetriever` options kept across a :meth:`ISORetriever.refresh`."""

    chunk_size: int


class ISORetriever(nn.Module):
    r"""Retrieve passages by dense similarity and PageRank over an isoperimetrically pruned graph.

    Offline, once per (graph, projection), cached on the module: ``z_u = f_theta(h_u)`` in the
    Poincare ball, volumes ``v(u) = lambda(z_u) ** p`` (:func:`~geograph.functional.conformal_volume`),
    ``phi`` by :func:`~geograph.functional.isoperimetric_ratio`, and the edges kept by
    :func:`~geograph.functional.compatible_edges` with ``beta``. Without a ``projection`` the
    default signal is :class:`~geograph.projection.IdentityPoincare` (``exp_0`` of the raw
    embedding: for unit-norm embeddings every node gets the same volume, so ``phi`` is purely
    combinatorial).

    A holder of the hyperparameters and the offline state (:meth:`refresh`): :meth:`forward`
    calls :func:`geograph.functional.iso_retrieve`'s body, the method's one home (bitwise the
    same result). Per query, batched (no loop over queries): dense cosine ``s``; seeds = top-``m``; the local
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

    # set in __init__ from IsoOptions (the defaults and the check of the hyperparameters)
    m: int
    L: int
    hops: int
    max_nodes: int
    beta: float
    p: float
    tau: float
    alpha: float
    lambda_g: float
    lambda_d: float
    max_iter: int
    # buffers, registered in __init__
    phi: Tensor
    kept_keys: Tensor

    def __init__(
        self,
        graph: CorpusGraph,
        *,
        projection: nn.Module | None = None,
        m: int = IsoOptions.m,
        L: int = IsoOptions.L,
        hops: int = IsoOptions.hops,
        max_nodes: int = IsoOptions.max_nodes,
        beta: float = IsoOptions.beta,
        p: float = IsoOptions.p,
        tau: float = IsoOptions.tau,
        alpha: float = IsoOptions.alpha,
        lambda_g: float = IsoOptions.lambda_g,
        lambda_d: float = IsoOptions.lambda_d,
        max_iter: int = IsoOptions.max_iter,
    ) -> None:
        super().__init__()
        if not isinstance(graph, CorpusGraph):
            raise ValueError(f"graph must be a CorpusGraph, got {type(graph).__name__}")
        if projection is not None:
            for t in list(projection.parameters()) + list(projection.buffers()):
                if t.device != graph.device:
                    raise ValueError(
                        f"the projection is on {t.device} but the graph is on {graph.device}: "
                        "move one of them with .to() first"
                    )
        self.graph = graph
        self.projection = projection if projection is not None else IdentityPoincare()
        opts = IsoOptions(
            m=m,
            L=L,
            hops=hops,
            max_nodes=max_nodes,
            beta=beta,
            p=p,
            tau=tau,
            alpha=alpha,
            lambda_g=lambda_g,
            lambda_d=lambda_d,
            max_iter=max_iter,
        )
        self._options = opts
        for name, value in asdict(opts).items():
            setattr(self, name, value)
        self.register_buffer("phi", torch.empty(0), persistent=False)
        self.register_buffer("kept_keys", torch.empty(0, dtype=torch.long), persistent=False)
        self.register_buffer("_volume", torch.empty(0, dtype=torch.float64), persistent=False)  # for add / remove
        self.refresh()
        self.register_load_state_dict_post_hook(_refresh_after_load)  # type: ignore[no-untyped-call]  # unannotated in torch

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
        old = cast("DenseRetriever | None", self._modules.get("dense"))
        kw: _DenseKeywords = {} if old is None else {"chunk_size": old.chunk_size}
        self.dense = DenseRetriever(emb, persistent=False, **kw)  # derived from the graph: not in state_dict()
        self._max_degree = int(g.degree().max()) if g.num_nodes else 0
        vol = self._volumes(emb, chunk_size)
        self._volume = vol.to(emb.device)
        self.phi = isoperimetric_ratio(g.edge_index, vol.to(emb.device), g.num_nodes).to(emb.dtype)
        kept = compatible_edges(g.edge_index, self.phi, beta=self.beta)
        ei = g.edge_index[:, kept]
        self.kept_keys = torch.sort(ei[0] * g.num_nodes + ei[1]).values
        self.pruned_share = 1.0 - float(kept.float().mean()) if kept.numel() else 0.0

    def _volumes(self, emb: Tensor, chunk_size: int = 65536) -> Tensor:
        """``(V,)`` float64 conformal volumes of passages ``emb`` under the projection."""
        # the projection's dtype; the identity signal (whose only parameter is geoopt's float32
        # curvature) keeps the embeddings' dtype
        params = [] if isinstance(self.projection, IdentityPoincare) else list(self.projection.parameters())
        dev = params[0].device if params else emb.device
        dtype = params[0].dtype if params else emb.dtype
        was_training = self.projection.training
        self.projection.eval()
        z = torch.cat(
            [self.projection(emb[s : s + chunk_size].to(dev, dtype)) for s in range(0, emb.shape[0], chunk_size)]
        )
        self.projection.train(was_training)
        c = float(getattr(self.projection, "c", 1.0))
        if not bool(torch.isfinite(z).all()):
            raise ValueError("the projection produced NaN/inf for some passages")
        return conformal_volume(z.double(), p=self.p, c=c)

    @torch.no_grad()
    def add(self, embeddings: Tensor, ids: Sequence[PassageId], **kwargs: Any) -> UpdateReport:
        """Add passages to the graph in place (:meth:`CorpusGraph.add`, ``kwargs`` passed on) and
        recompute ``phi`` only where it can change (see :mod:`geograph.methods.iso.updates`):
        the same ``phi``, kept edges and answers as a retriever built on the updated graph.
        The projection is applied to the new passages only."""
        return iso_add(self, embeddings, ids, **kwargs)

    @torch.no_grad()
    def remove(self, ids: Iterable[PassageId] | PassageId) -> UpdateReport:
        """Remove passages from the graph in place, ``phi`` recomputed where it can change (as :meth:`add`)."""
        return iso_remove(self, ids)

    def local(self, query: Tensor) -> LocalSubgraph:
        """The batch's padded local subgraphs (:func:`geograph.functional.iso_local_subgraph`; exposed for
        inspection and the benchmark)."""
        check_iso_query(query, self.dense.embeddings, "the ISORetriever")
        return _local_subgraph(
            query,
            self.dense.embeddings,
            self.graph.rowptr,
            self.graph.col,
            self.kept_keys,
            max_degree=self._max_degree,
            options=self.options,
            chunk_size=self.dense.chunk_size,
        )

    @property
    def options(self) -> IsoOptions:
        """The hyperparameters as they are now, checked (:class:`IsoOptions`): what :meth:`forward` reads."""
        return self._options

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OPTION_NAMES:  # a hyperparameter: checked, and kept in the options the forward reads
            object.__setattr__(self, "_options", replace(self._options, **{name: value}))
        super().__setattr__(name, value)

    @property
    def max_k(self) -> int:
        """The largest ``k`` every query can get: the guaranteed local set size min(max(L, m), max_nodes, V)."""
        return iso_max_k(self.m, self.L, self.max_nodes, self.graph.num_nodes)

    def forward(self, query: Tensor, k: int) -> RetrievalOutput:
        return _retrieve(
            query,
            self.dense.embeddings,
            self.graph.rowptr,
            self.graph.col,
            self.kept_keys,
            k,
            max_degree=self._max_degree,
            options=self.options,
            chunk_size=self.dense.chunk_size,
            owner="the ISORetriever",
        )

    def extra_repr(self) -> str:
        return (
            f"nodes={self.graph.num_nodes}, m={self.m}, L={self.L}, hops={self.hops}, max_nodes={self.max_nodes}, "
            f"beta={self.beta}, p={self.p}, tau={self.tau}, alpha={self.alpha}"
        )


def _refresh_after_load(module: ISORetriever, incompatible_keys: object) -> None:
    """``load_state_dict`` post hook: the derived state follows the loaded graph and projection."""
    module.refresh()
