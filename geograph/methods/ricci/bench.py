"""Ricci-Filtration's slow, trusted per-query reference (GraphRicciCurvature, numpy), for parity tests
and the benchmark.

:func:`ranker_reference` is the registry entry's ``reference`` (``spec.SPEC``): the benchmark times it
next to the module. Requires the ``ref`` extra (GraphRicciCurvature).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from geograph.methods.ricci.functional import RicciOptions
from geograph.spec import RankerReference

__all__ = ["ricci_reference", "ricci_graph_reference", "ranker_reference"]


def ricci_reference(
    edges: list[tuple[int, int]],
    num_nodes: int,
    *,
    weights: Mapping[tuple[int, int], float] | None = None,
    alpha: float = 0.5,
    exp_power: float = 2,
    iterations: int = 0,
    step: float = 1.0,
    delta: float = 1e-4,
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """GraphRicciCurvature 0.6.1 on one graph: ``OllivierRicci(..., method="OTD", proc=1)``, with its
    defaults (``alpha``, ``exp_power``, ``step``, ``delta``).

    Args:
        edges: undirected edges ``(u, v)``.
        num_nodes: nodes ``0 .. num_nodes - 1`` (isolated ones included).
        weights: ``{(u, v): length}``; default 1 on every edge.
        alpha, exp_power: the lazy measures.
        iterations: 0 = initial curvature only; else ``compute_ricci_flow(iterations)``.
        step, delta: of the flow.

    Returns:
        ``(curvature, lengths)``: dicts ``{(u, v): value}`` with ``u < v`` (the initial
        curvature and unit lengths when ``iterations == 0``, else the flowed ones).
    """
    import logging

    import networkx as nx
    from GraphRicciCurvature.OllivierRicci import OllivierRicci

    logging.getLogger("GraphRicciCurvature").setLevel(logging.ERROR)
    g = nx.Graph()
    g.add_nodes_from(range(num_nodes))
    for u, v in edges:
        g.add_edge(int(u), int(v), weight=1.0 if weights is None else float(weights[(u, v)]))
    orc = OllivierRicci(g, alpha=alpha, exp_power=exp_power, method="OTD", proc=1, verbose="ERROR")
    if iterations:
        out = orc.compute_ricci_flow(iterations=iterations, step=step, delta=delta)
    else:
        out = orc.compute_ricci_curvature()
    curv = {(min(u, v), max(u, v)): float(d["ricciCurvature"]) for u, v, d in out.edges(data=True)}
    lengths = {(min(u, v), max(u, v)): float(d["weight"]) for u, v, d in out.edges(data=True)}
    return curv, lengths


def ricci_graph_reference(query: np.ndarray, docs: np.ndarray, *, percentile: float = 50.0) -> list[tuple[int, int]]:
    """The Ricci-Filtration query graph of one query, built in numpy (independent of ``query_graph``).

    Node 0 = query, nodes 1..N = candidates; ``r_ij = 1 - cos``; ``tau = numpy.percentile`` of
    ``r_ij`` over the pairs ``i < j``; an edge iff ``r_ij >= tau``, plus every query edge.

    Args:
        query: ``(D,)``; docs: ``(N, D)``; percentile: in ``[0, 100]``.

    Returns:
        the undirected edges ``(u, v)``, ``u < v``.
    """
    z = np.concatenate([np.asarray(query, np.float64)[None], np.asarray(docs, np.float64)])
    z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), np.finfo(np.float64).tiny)
    r = 1.0 - z @ z.T
    iu, ju = np.triu_indices(len(z), 1)
    tau = np.percentile(r[iu, ju], percentile)
    return [(int(i), int(j)) for i, j in zip(iu, ju) if i == 0 or r[i, j] >= tau]


def ranker_reference(
    corpus: Tensor, params: Mapping[str, Any], cfg: Mapping[str, Any], cache: dict[Any, Any]
) -> RankerReference:
    """Ricci-Filtration with the query graph built in numpy (:func:`ricci_graph_reference`) and
    GraphRicciCurvature's flow (``iterations`` steps); the kept candidates ordered by cosine."""
    x = corpus.double().cpu().numpy()
    percentile = params.get("percentile", RicciOptions.percentile)
    eta = params.get("eta", RicciOptions.eta)
    iterations = params.get("iterations", RicciOptions.iterations)

    def ref(q: Tensor, c: Any) -> np.ndarray:
        c = np.asarray(c)
        qv, d = q.double().cpu().numpy(), x[c]
        edges = ricci_graph_reference(qv, d, percentile=percentile)
        n = len(c) + 1
        _, lengths = ricci_reference(edges, n, iterations=iterations)
        kept = np.flatnonzero([lengths[(0, j)] <= eta for j in range(1, n)])
        cos = d @ qv / (np.linalg.norm(d, axis=1) * np.linalg.norm(qv))
        return np.asarray(c[kept[np.argsort(-cos[kept], kind="stable")]])

    return ref
