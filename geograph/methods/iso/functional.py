"""ISO-RAG's query-time math: the local set, the personalization, PageRank and the fusion."""

from __future__ import annotations

from typing import TypedDict, overload

import torch
from torch import Tensor

from geograph._checks import (
    check_finite_float,
    check_finite_where,
    check_positive_int,
    check_same_device,
    check_tensor,
    check_unit_interval,
)
from geograph.knn.allpairs import tiled_topk
from geograph.methods.iso.pagerank import personalized_pagerank
from geograph.ops.adjacency import csr_row_slots
from geograph.ops.similarity import minmax_normalize, normalize
from geograph.outputs import LocalSubgraph, RetrievalOutput, topk_by_key, topk_stable

__all__ = ["iso_retrieve", "iso_local_subgraph", "iso_personalization", "iso_fusion", "iso_max_k", "check_iso_options"]


class IsoQueryOptions(TypedDict, total=False):
    """ISO-RAG's query-time hyperparameters as :func:`check_iso_options` returns them."""

    m: int
    L: int
    hops: int
    max_nodes: int
    tau: float
    alpha: float
    lambda_g: float
    lambda_d: float
    max_iter: int


class IsoOptions(IsoQueryOptions, total=False):
    """:class:`IsoQueryOptions` with the offline ``beta`` and ``p``, when given."""

    beta: float
    p: float


@overload
def check_iso_options(
    *,
    m: int,
    L: int,
    hops: int,
    max_nodes: int,
    tau: float,
    alpha: float,
    lambda_g: float,
    lambda_d: float,
    max_iter: int,
    beta: None = None,
    p: None = None,
) -> IsoQueryOptions: ...
@overload
def check_iso_options(
    *,
    m: int,
    L: int,
    hops: int,
    max_nodes: int,
    tau: float,
    alpha: float,
    lambda_g: float,
    lambda_d: float,
    max_iter: int,
    beta: float | None = None,
    p: float | None = None,
) -> IsoOptions: ...
def check_iso_options(
    *,
    m: int,
    L: int,
    hops: int,
    max_nodes: int,
    tau: float,
    alpha: float,
    lambda_g: float,
    lambda_d: float,
    max_iter: int,
    beta: float | None = None,
    p: float | None = None,
) -> IsoOptions:
    """Validate ISO-RAG's hyperparameters; returns them normalised, or raises ``ValueError``.

    The one check of :func:`iso_retrieve` and :class:`~geograph.ISORetriever` (``beta`` and
    ``p``, used offline, are checked when given).
    """
    out: IsoOptions = dict(m=check_positive_int(m, "m"), L=check_positive_int(L, "L"))
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise ValueError(f"hops must be a non-negative integer, got {hops!r}")
    out["hops"] = hops
    out["max_nodes"] = check_positive_int(max_nodes, "max_nodes")
    if out["max_nodes"] < out["m"]:
        raise ValueError(f"max_nodes ({max_nodes}) must be at least m ({m})")
    if beta is not None:
        out["beta"] = check_unit_interval(beta, "beta")
    if p is not None:
        out["p"] = check_finite_float(p, "p")
    out["tau"] = check_finite_float(tau, "tau")
    out["alpha"] = check_finite_float(alpha, "alpha")
    if not 0.0 <= out["alpha"] < 1.0:
        raise ValueError(f"alpha must lie in [0, 1), got {alpha!r}")
    out["lambda_g"] = check_finite_float(lambda_g, "lambda_g")
    out["lambda_d"] = check_finite_float(lambda_d, "lambda_d")
    out["max_iter"] = check_positive_int(max_iter, "max_iter")
    return out


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
    m: int = 5,
    L: int = 50,
    hops: int = 1,
    max_nodes: int = 100,
    tau: float = 10.0,
    chunk_size: int = 4096,
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
        m, L, hops, max_nodes, tau: see :class:`~geograph.ISORetriever`.
        chunk_size: passages scored per matrix product.

    Returns:
        :class:`~geograph.outputs.LocalSubgraph` with ``n = min(max_nodes, width)`` columns.
    """
    check_iso_query(query, embeddings)
    opts = check_iso_options(
        m=m, L=L, hops=hops, max_nodes=max_nodes, tau=tau, alpha=0.0, lambda_g=0.0, lambda_d=0.0, max_iter=1
    )
    return _local_subgraph(
        query,
        embeddings,
        rowptr,
        col,
        kept_keys,
        max_degree=max_degree,
        m=opts["m"],
        L=opts["L"],
        hops=opts["hops"],
        max_nodes=opts["max_nodes"],
        tau=opts["tau"],
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
    m: int,
    L: int,
    hops: int,
    max_nodes: int,
    tau: float,
    chunk_size: int,
) -> LocalSubgraph:
    """:func:`iso_local_subgraph` on a validated query and options."""
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
    m: int = 5,
    L: int = 50,
    hops: int = 1,
    max_nodes: int = 100,
    tau: float = 10.0,
    alpha: float = 0.85,
    lambda_g: float = 0.5,
    lambda_d: float = 0.5,
    max_iter: int = 100,
    chunk_size: int = 4096,
) -> RetrievalOutput:
    r"""ISO-RAG retrieval: the function :class:`~geograph.ISORetriever` calls (bitwise the same result).

    :func:`iso_local_subgraph`, then :func:`~geograph.functional.personalized_pagerank` on the
    kept edges (unit weights) with ``alpha`` and ``max_iter``, :func:`iso_fusion`, and the
    top-``k`` of the local set (ties: lowest corpus id). The offline part (``phi``, the kept
    edges, ``max_degree``) is the caller's: :meth:`geograph.ISORetriever.refresh` computes it.

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
    opts = check_iso_options(
        m=m,
        L=L,
        hops=hops,
        max_nodes=max_nodes,
        tau=tau,
        alpha=alpha,
        lambda_g=lambda_g,
        lambda_d=lambda_d,
        max_iter=max_iter,
    )
    return _retrieve(
        query,
        embeddings,
        rowptr,
        col,
        kept_keys,
        k,
        max_degree=max_degree,
        chunk_size=check_positive_int(chunk_size, "chunk_size"),
        **opts,
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
    m: int,
    L: int,
    hops: int,
    max_nodes: int,
    tau: float,
    alpha: float,
    lambda_g: float,
    lambda_d: float,
    max_iter: int,
    chunk_size: int,
    owner: str = "the corpus",
) -> RetrievalOutput:
    """:func:`iso_retrieve` with validated options (``k`` and the query are checked here, in that order)."""
    k = check_positive_int(k, "k")
    v = embeddings.shape[0]
    limit = iso_max_k(m, L, max_nodes, v)
    if k > limit:
        raise ValueError(f"k={k} exceeds the guaranteed local set size min(max(L, m), max_nodes, V) = {limit}")
    check_iso_query(query, embeddings, owner)
    sub = _local_subgraph(
        query,
        embeddings,
        rowptr,
        col,
        kept_keys,
        max_degree=max_degree,
        m=m,
        L=L,
        hops=hops,
        max_nodes=max_nodes,
        tau=tau,
        chunk_size=chunk_size,
    )
    w = sub.adj.to(sub.dense.dtype)
    pi = personalized_pagerank(w, sub.personalization, sub.mask, alpha=alpha, max_iter=max_iter)
    score = iso_fusion(pi, sub.dense, sub.mask, lambda_g, lambda_d)
    top, pos = topk_by_key(score, torch.where(sub.mask, sub.nodes, v), k)
    return RetrievalOutput(indices=sub.nodes.gather(1, pos), scores=top.to(query.dtype))
