"""Ricci-Filtration's slow, trusted per-query reference (GraphRicciCurvature, numpy), for parity tests
and the benchmark.

:func:`ranker_reference` is the registry entry's ``reference`` (``spec.SPEC``): the benchmark times it
next to the module. Requires the ``ref`` extra (GraphRicciCurvature).
"""

from __future__ import annotations

import contextlib
import multiprocessing.dummy
from collections.abc import Iterator, Mapping
from types import ModuleType
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
    defaults (``alpha``, ``exp_power``, ``step``, ``delta``), each curvature pass in this process
    (:func:`_passes_in_process`).

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
    with _passes_in_process():
        if iterations:
            out = orc.compute_ricci_flow(iterations=iterations, step=step, delta=delta)
        else:
            out = orc.compute_ricci_curvature()
    curv = {(min(u, v), max(u, v)): float(d["ricciCurvature"]) for u, v, d in out.edges(data=True)}
    lengths = {(min(u, v), max(u, v)): float(d["weight"]) for u, v, d in out.edges(data=True)}
    return curv, lengths


@contextlib.contextmanager
def _passes_in_process() -> Iterator[None]:
    """GraphRicciCurvature's curvature passes run in a thread of this process, not a forked pool.

    Every pass (each step of a flow) forks a ``multiprocessing`` pool, even with ``proc=1``; a fork
    of a process that holds torch costs more than the pass (a 20-step flow on 21 nodes: 2.2 s
    forked, 1.0 s here). The pool is a thread pool instead (``multiprocessing.dummy``, the same
    ``imap_unordered``), and the library's memoised helpers are cleared when it is made, as a
    fresh fork would find them (they are keyed by node, not by the weights a flow step changes),
    and again at the end, so that a forked pool made later by this process does not inherit them.
    The same library code computes the same numbers (tests compare them bit for bit)."""
    from GraphRicciCurvature import OllivierRicci as lib

    def clear() -> None:
        for name in ("_get_single_node_neighbors_distributions", "_source_target_shortest_path"):
            getattr(lib, name).cache_clear()
        paths = getattr(lib, "_source_target_shortest_paths", None)  # not in every release
        if paths is not None:
            paths.cache_clear()

    def pool(*args: Any, **kwargs: Any) -> Any:
        clear()
        return multiprocessing.dummy.Pool(*args, **kwargs)

    class _Context:
        Pool = staticmethod(pool)

    class _Threads(ModuleType):
        def get_context(self, method: str | None = None) -> _Context:
            return _Context()

        def __getattr__(self, name: str) -> Any:
            return getattr(multiprocessing, name)

    forked = lib.mp
    lib.mp = _Threads("multiprocessing")
    try:
        yield
    finally:
        lib.mp = forked
        clear()  # a forked pool made later in this process must not inherit them either


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
