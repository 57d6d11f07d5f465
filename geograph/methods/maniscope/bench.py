"""Maniscope's slow, trusted per-query reference (scikit-learn, scipy), for parity tests and the benchmark.

:func:`ranker_reference` is the registry entry's ``reference`` (``spec.SPEC``): the benchmark times it
next to the module. Requires the ``bench`` extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from geograph.spec import RankerReference

__all__ = ["maniscope_reference", "ranker_reference"]


def maniscope_reference(
    query: np.ndarray, docs: np.ndarray, *, k: int = 5, alpha: float = 0.3
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Maniscope for one query: scikit-learn k-NN, CSR graph, scipy Dijkstra from the anchor.

    Args:
        query: ``(D,)`` query embedding.
        docs: ``(N, D)`` candidate embeddings (real ones only).
        k: neighbours per candidate.
        alpha: weight of the cosine term.

    Returns:
        ``(scores (N,), geodesic (N,), order (N,))`` as numpy arrays (float64 / int64).
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra
    from sklearn.neighbors import NearestNeighbors

    docs = np.asarray(docs, dtype=np.float64)
    query = np.asarray(query, dtype=np.float64)
    n = docs.shape[0]
    dn = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), np.finfo(np.float64).tiny)
    qn = query / max(np.linalg.norm(query), np.finfo(np.float64).tiny)
    q_cos = np.clip(dn @ qn, -1.0, 1.0)
    anchor = int(np.argmax(q_cos))
    kk = min(k, n - 1)
    if kk > 0:
        nn = NearestNeighbors(n_neighbors=kk, metric="cosine", algorithm="brute").fit(dn)
        dist, idx = nn.kneighbors()  # no X: each point's own entry is excluded
        eps = np.finfo(np.float64).eps
        rows = np.repeat(np.arange(n), kk)
        w = np.clip(dist.ravel(), eps, 2.0)
        g = csr_matrix((w, (rows, idx.ravel())), shape=(n, n))
        g = g.maximum(g.T)  # undirected: union of the directed k-NN links
        geo = dijkstra(g, directed=False, indices=anchor)
    else:
        geo = np.full(n, np.inf)
        geo[anchor] = 0.0
    sim_geo = np.where(np.isfinite(geo), 1.0 / (1.0 + geo), 0.0)
    scores = alpha * q_cos + (1.0 - alpha) * sim_geo
    order = np.argsort(-scores, kind="stable")
    return scores, geo, order


def ranker_reference(
    corpus: Tensor, params: Mapping[str, Any], cfg: Mapping[str, Any], cache: dict[Any, Any]
) -> RankerReference:
    """Maniscope with scikit-learn's k-NN graph and scipy's Dijkstra, one query at a time."""
    x = corpus.double().cpu().numpy()
    opts = {name: params[name] for name in ("k", "alpha") if name in params}

    def ref(q: Tensor, c: Any) -> np.ndarray:
        c = np.asarray(c)
        order: np.ndarray = maniscope_reference(q.double().cpu().numpy(), x[c], **opts)[2]
        return np.asarray(c[order])

    return ref
