"""ISO-RAG's query-time math: the local set, the personalization, PageRank and the fusion."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TypedDict, Unpack

import torch
from torch import Tensor

from geograph._checks import check_finite_where, check_positive_int, check_same_device, check_tensor
from geograph.knn.allpairs import tiled_topk
from geograph.methods.iso.pagerank import personalized_pagerank
from geograph.ops.adjacency import csr_row_slots
from geograph.ops.similarity import minmax_normalize, normalize
from geograph.outputs import LocalSubgraph, RetrievalOutput, topk_by_key, topk_stable
from geograph.spec import POS_INT, UNIT, Param, check_values

__all__ = [
    "iso_retrieve",
    "iso_local_subgraph",
    "iso_personalization",
    "iso_fusion",
    "iso_max_k",
    "IsoOptions",
    "ISO_PARAMS",
]

#: ISO-RAG's hyperparameters and their bounds: the registry's (``spec.SPEC.params``) and
#: :class:`IsoOptions`' one check
ISO_PARAMS = (
    Param("m", int, **POS_INT, doc="seeds per query"),
    Param("L", int, **POS_INT, doc="dense candidates in the local set"),
    Param("hops", int, low=0, doc="graph hops from the seeds into the local set"),
    Param("max_nodes", int, **POS_INT, doc="cap on the local set (at least m)"),
    Param("beta", float, **UNIT, doc="an edge is kept iff min(phi) / max(phi) >= beta"),
    Param("p", float, doc="the volume's power of the conformal factor"),
    Param("tau", float, doc="temperature of the personalisation softmax"),
    Param("alpha", float, low=0.0, high=1.0, high_open=True, doc="PageRank's continuation probability"),
    Param("lambda_g", float, doc="weight of the graph score"),
    Param("lambda_d", float, doc="weight of the dense score"),
    Param("max_iter", int, **POS_INT, doc="PageRank power iterations"),
)


@dataclass(frozen=True)
class IsoOptions:
    """ISO-RAG's hyperparameters: their defaults (those of :class:`~geograph.ISORetriever`,
    :func:`iso_retrieve` and :func:`iso_local_subgraph`) and their check (:data:`ISO_PARAMS`, in the
    registry's wording, and ``max_nodes >= m``), normalised on construction (floats as ``float``).
    ``beta`` and ``p`` are used offline (the kept edges), the others per query."""

    m: int = 5
    L: int = 50
    hops: int = 1
    max_nodes: int = 100
    beta: float = 0.4
    p: float = 2.0
    tau: float = 10.0
    alpha: float = 0.85
    lambda_g: float = 0.5
    lambda_d: float = 0.5
    max_iter: int = 100

    def __post_init__(self) -> None:
        for name, value in check_values(ISO_PARAMS, asdict(self)).items():
            object.__setattr__(self, name, value)
        if self.max_nodes < self.m:
            raise ValueError(f"max_nodes ({self.max_nodes}) must be at least m ({self.m})")


class IsoLocalKeywords(TypedDict, total=False):
    """The :class:`IsoOptions` of the local set (:func:`iso_local_subgraph`), as keyword arguments."""

    m: int
    L: int
    hops: int
    max_nodes: int
    tau: float


class IsoQueryKeywords(IsoLocalKeywords, total=False):
    """The query-time :class:`IsoOptions` (:func:`iso_retrieve`), as keyword arguments."""

    alpha: float
    lambda_g: float
    lambda_d: float
    max_iter: int


def iso_max_k(m: int, L: int, max_nodes: int, num_nodes: int) -> int:
    """The largest ``k`` every query can get: the guaranteed local set size ``min(max(L, m), max_nodes, V)``."""
    return min(max(L, m), max_nodes, num_nodes)


def check_iso_query(query: Tensor, embeddings: Tensor, owner: str = "the corpus") -> None:
    """Raise unless ``query`` is a ``(B, D)`` floating tensor, finite, on ``embeddings``' device and ``D``."""
    check_same_device(query, "query", embeddings.device, owner)
    check_tensor(query, "query", 2, finite=False)
    check_finite_where(query, None, "query")
    if query.shape[1] != embeddings.shape[1]:
        raise ValueError(f"query must have shape (B, D={embeddings.shape[1]}), got {tuple(query.shape)}")


def iso_personalization(nodes: Tensor, mask: Tensor, dense: Tensor, seeds: Tensor, tau: float) -> Tensor:
    r"""ISO-RAG's restart distribution: ``softmax(tau * s)`` over the seeds among ``nodes``, 0 elsewhere.

    Args:
        nodes: ``(B, n)`` corpus ids of the local set.
        mask: ``(B, n)`` bool, True = real node.
        dense: ``(B, n)`` cosine to the query.
        seeds: ``(B, S)`` corpus ids of the seeds.
        tau: temperature.

    Returns:
        ``(B, n)``; a row with no seed is all 0.
    """
    is_seed = (nodes.unsqueeze(2) == seeds.unsqueeze(1)).any(2) & mask
    logits = torch.where(is_seed, tau * dense, torch.full_like(dense, float("-inf")))
    r = torch.softmax(logits, dim=1)
    return torch.where(torch.isfinite(r), r, torch.zeros_like(r))


def iso_fusion(pagerank: Tensor, dense: Tensor, mask: Tensor, lambda_g: float, lambda_d: float) -> Tensor:
    r"""ISO-RAG's final score :math:`\lambda_g \hat\pi + \lambda_d \hat s` (both min-max normalised
    over the real nodes, :func:`~geograph.functional.minmax_normalize`); ``-inf`` at padding.

    Shapes: ``pagerank``, ``dense``, ``mask`` ``(B, n)`` -> ``(B, n)``.
    """
    score = lambda_g * minmax_normalize(pagerank, mask, dim=1) + lambda_d * minmax_normalize(dense, mask, dim=1)
    return torch.where(mask, score, torch.full_like(score, float("-inf")))


def _neighbours(rowptr: Tensor, col: Tensor, seeds: Tensor, seed_ok: Tensor, max_degree: int) -> tuple[Tensor, Tensor]:
    """All neighbours ``(B, S * max_degree)`` of ``seeds (B, S)`` in the full graph, with validity."""
    if max_degree == 0:
        return seeds.new_zeros(seeds.shape[0], 0), seed_ok.new_zeros(seeds.shape[0], 0)
    at, ok = csr_row_slots(rowptr, seeds, max_degree, seed_ok)
    return col[at].flatten(1), ok.flatten(1)


def iso_local_subgraph(
    query: Tensor,
    embeddings: Tensor,
    rowptr: Tensor,
    col: Tensor,
    kept_keys: Tensor,
    *,
    max_degree: int,
    chunk_size: int = 4096,
    **options: Unpack[IsoLocalKeywords],
) -> LocalSubgraph:
    r"""ISO-RAG's padded query-local subgraphs (what :meth:`geograph.ISORetriever.local` returns).

    Dense cosine ``s`` (exact, in the corpus's dtype); seeds = top-``m``; the local set =
    dense top-``L`` plus the ``hops``-hop neighbourhood of the seeds in the full graph,
    deduplicated and capped at ``max_nodes`` by dense score (ties: lowest corpus id); its
    induced subgraph with the kept edges only; the personalization of
    :func:`iso_personalization`.

    Args:
        query: ``(B, D)``.
        embeddings: ``(V, D)`` unit-norm passage embeddings (the dense index).
        rowptr, col: the full graph in CSR (``(V + 1,)`` and ``(E,)`` long).
        kept_keys: ``(K,)`` sorted ``u * V + v`` of the kept (compatible) directed edges.
        max_degree: the graph's largest degree (the padded width of a hop; a bound known a
            priori, so no host read).
        chunk_size: passages scored per matrix product.
        **options: ``m``, ``L``, ``hops``, ``max_nodes``, ``tau`` (see :class:`~geograph.ISORetriever`;
            the defaults are :class:`IsoOptions`').

    Returns:
        :class:`~geograph.outputs.LocalSubgraph` with ``n = min(max_nodes, width)`` columns.
    """
    check_iso_query(query, embeddings)
    return _local_subgraph(
        query,
        embeddings,
        rowptr,
        col,
        kept_keys,
        max_degree=max_degree,
        options=IsoOptions(**options),
        chunk_size=check_positive_int(chunk_size, "chunk_size"),
    )


def _local_subgraph(
    query: Tensor,
    embeddings: Tensor,
    rowptr: Tensor,
    col: Tensor,
    kept_keys: Tensor,
    *,
    max_degree: int,
    options: IsoOptions,
    chunk_size: int,
) -> LocalSubgraph:
    """:func:`iso_local_subgraph` on a validated query and options."""
    m, L, hops, max_nodes, tau = options.m, options.L, options.hops, options.max_nodes, options.tau
    v = embeddings.shape[0]
    qn = normalize(query.to(embeddings.dtype))
    _, top = tiled_topk(qn, embeddings, min(max(L, m), v), block=chunk_size)
    seeds = top[:, :m]
    pool, pool_ok = [top], [torch.ones_like(top, dtype=torch.bool)]
    frontier, frontier_ok = seeds, torch.ones_like(seeds, dtype=torch.bool)
    for _ in range(hops):
        frontier, frontier_ok = _neighbours(rowptr, col, frontier, frontier_ok, max_degree)
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
    emb = embeddings[ids.clamp_max(v - 1)]  # unit rows
    s = (emb * qn.unsqueeze(1)).sum(-1)
    s = torch.where(ok, s, torch.full_like(s, float("-inf")))
    n = min(max_nodes, ids.shape[1])
    dense, pos = topk_stable(s, n)  # by dense score (ids ascending: ties to the lower id), seeds survive
    nodes = ids.gather(1, pos)
    mask = torch.isfinite(dense)
    nodes = torch.where(mask, nodes, torch.full_like(nodes, -1))
    key = nodes.clamp_min(0).unsqueeze(2) * v + nodes.clamp_min(0).unsqueeze(1)
    if kept_keys.numel():
        at = torch.searchsorted(kept_keys, key.flatten(1)).clamp_max(kept_keys.numel() - 1)
        adj = (kept_keys[at] == key.flatten(1)).view_as(key)
    else:
        adj = torch.zeros_like(key, dtype=torch.bool)
    adj = adj & mask.unsqueeze(2) & mask.unsqueeze(1)
    return LocalSubgraph(nodes, mask, dense, adj, iso_personalization(nodes, mask, dense, seeds, tau))


def iso_retrieve(
    query: Tensor,
    embeddings: Tensor,
    rowptr: Tensor,
    col: Tensor,
    kept_keys: Tensor,
    k: int,
    *,
    max_degree: int,
    chunk_size: int = 4096,
    **options: Unpack[IsoQueryKeywords],
) -> RetrievalOutput:
    r"""ISO-RAG retrieval: the function :class:`~geograph.ISORetriever` calls (bitwise the same result).

    :func:`iso_local_subgraph`, then :func:`~geograph.functional.personalized_pagerank` on the
    kept edges (unit weights) with ``alpha`` and ``max_iter``, :func:`iso_fusion`, and the
    top-``k`` of the local set (ties: lowest corpus id). The offline part (``phi``, the kept
    edges, ``max_degree``) is the caller's: :meth:`geograph.ISORetriever.refresh` computes it.
    ``**options``: the query-time hyperparameters of :class:`~geograph.ISORetriever` (``m``,
    ``L``, ``hops``, ``max_nodes``, ``tau``, ``alpha``, ``lambda_g``, ``lambda_d``,
    ``max_iter``; the defaults are :class:`IsoOptions`').

    Shape:
        query ``(B, D)`` -> :class:`~geograph.RetrievalOutput` ``indices (B, k)``, ``scores (B, k)``
        (in the query's floating dtype).

    Raises:
        ValueError: ``k`` above :func:`iso_max_k`, a bad option or query.

    Example:
        >>> from geograph import CorpusGraph, ISORetriever
        >>> emb = torch.nn.functional.normalize(torch.randn(30, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> iso = ISORetriever(CorpusGraph.from_knn(emb, 3), m=2, L=5, max_nodes=10)
        >>> g = iso.graph
        >>> out = iso_retrieve(emb[:2], iso.dense.embeddings, g.rowptr, g.col, iso.kept_keys, 3,
        ...                    max_degree=int(g.degree().max()), m=2, L=5, max_nodes=10)
        >>> ref = iso(emb[:2], k=3)
        >>> torch.equal(out.indices, ref.indices), torch.equal(out.scores, ref.scores)
        (True, True)
    """
    return _retrieve(
        query,
        embeddings,
        rowptr,
        col,
        kept_keys,
        k,
        max_degree=max_degree,
        options=IsoOptions(**options),
        chunk_size=check_positive_int(chunk_size, "chunk_size"),
    )


def _retrieve(
    query: Tensor,
    embeddings: Tensor,
    rowptr: Tensor,
    col: Tensor,
    kept_keys: Tensor,
    k: int,
    *,
    max_degree: int,
    options: IsoOptions,
    chunk_size: int,
    owner: str = "the corpus",
) -> RetrievalOutput:
    """:func:`iso_retrieve` with validated options (``k`` and the query are checked here, in that order)."""
    k = check_positive_int(k, "k")
    v = embeddings.shape[0]
    limit = iso_max_k(options.m, options.L, options.max_nodes, v)
    if k > limit:
        raise ValueError(f"k={k} exceeds the guaranteed local set size min(max(L, m), max_nodes, V) = {limit}")
    check_iso_query(query, embeddings, owner)
    sub = _local_subgraph(
        query, embeddings, rowptr, col, kept_keys, max_degree=max_degree, options=options, chunk_size=chunk_size
    )
    w = sub.adj.to(sub.dense.dtype)
    pi = personalized_pagerank(w, sub.personalization, sub.mask, alpha=options.alpha, max_iter=options.max_iter)
    score = iso_fusion(pi, sub.dense, sub.mask, options.lambda_g, options.lambda_d)
    top, pos = topk_by_key(score, torch.where(sub.mask, sub.nodes, v), k)
    return RetrievalOutput(indices=sub.nodes.gather(1, pos), scores=top.to(query.dtype))
