"""G3RAG's slow, trusted reference (the authors' dense numpy construction) and its benchmark row.

:func:`ranker_reference` is the registry entry's ``reference`` and :func:`bench_model` its
``bench_model`` (``spec.SPEC``): the benchmark builds the module per grid point with the gain graph
built once per data set and graph parameters, and times the reference next to it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor, nn

from geograph.graphs.g3_graph import DEFAULT_MAX_DEGREE, G3Graph
from geograph.methods.g3.module import G3Retriever
from geograph.spec import RankerReference

__all__ = ["g3_dense_reference", "g3_retrieve_reference", "ranker_reference", "bench_model"]

#: corpora up to this many passages get the authors' full T in the benchmark (no ``max_degree``)
FULL_T_PASSAGES = 2000


def g3_dense_reference(
    x: np.ndarray,
    band: tuple[float, float] | None = (0.1, 0.7),
    beta: float = 0.4,
    max_degree: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """G3RAG's transition matrix as the authors' code builds it: dense ``N x N`` numpy.

    ``S`` = cosine with diagonal 0, ``rho`` = mean clipped similarity min-max normalised,
    ``W = x sqrt(1 - x^2) exp(-beta rho_j)`` inside ``band`` (``None``: every positive weight),
    optional per-row top-``max_degree`` (stable order on ties), ``T`` row-normalised.

    Returns:
        ``(T, rho)`` float64 arrays.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = x @ x.T
    np.fill_diagonal(s, 0.0)
    n = len(s)
    rho = np.maximum(s, 0).sum(1) / n
    rho = (rho - rho.min()) / (rho.max() - rho.min()) if rho.max() > rho.min() else np.zeros(n)
    w = s * np.sqrt(np.clip(1 - s**2, 0, None)) * np.exp(-beta * rho)[None, :]
    ok = (s > 0) & (s < 1) if band is None else (s >= band[0]) & (s <= band[1])
    np.fill_diagonal(ok, False)
    w = np.where(ok & (w > 0), w, 0.0)
    if max_degree is not None:
        cut = np.argsort(-w, axis=1, kind="stable")[:, max_degree:]
        np.put_along_axis(w, cut, 0.0, axis=1)
    rs = w.sum(1, keepdims=True)
    return np.divide(w, rs, out=np.zeros_like(w), where=rs > 0), rho


def g3_retrieve_reference(
    x: np.ndarray, t: np.ndarray, q: np.ndarray, *, candidates: int, seeds: int, k: int
) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """G3RAG retrieval for one query with a dense ``T`` (:func:`g3_dense_reference`), in numpy.

    Seeds = the first ``seeds`` of the cosine top-``candidates`` (ties: lowest index first);
    ``y = p T`` with ``p`` uniform on the seeds; then the passages of largest positive ``y``;
    then a cosine top-up (the remaining candidates first, then the rest of the corpus). Each
    returned passage's score is the value of the stage that picked it: cosine for seeds and
    top-ups, ``y`` for diffused passages.

    Returns:
        ``(chosen ids (list of k), scores (k,), y (N,), cos (N,))``.
    """
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = xn @ (q / np.linalg.norm(q))
    by_cos = np.argsort(-cos, kind="stable")
    cand = by_cos[:candidates]
    seed = cand[:seeds]
    p = np.zeros(len(x))
    p[seed] = 1.0 / seeds
    y = p @ t
    y[seed] = -np.inf
    order = np.argsort(-y, kind="stable")
    diffused = [i for i in order[: k - seeds] if y[i] > 0]
    chosen = list(seed) + diffused
    rest = [i for i in cand if i not in chosen] + [i for i in by_cos if i not in cand]
    top_up = [i for i in rest if i not in chosen][: k - len(chosen)]
    scores = np.concatenate(
        [cos[seed], y[np.asarray(diffused, dtype=np.int64)], cos[np.asarray(top_up, dtype=np.int64)]]
    )
    return chosen + top_up, scores, y, cos


def _default(name: str) -> Any:
    """The default of :class:`~geograph.G3Retriever`'s parameter ``name`` (its signature is the one home)."""
    return inspect.signature(G3Retriever.__init__).parameters[name].default


def _graph_settings(
    corpus: Tensor, params: Mapping[str, Any], cfg: Mapping[str, Any]
) -> tuple[tuple[float, float] | None, float, int | None]:
    """``(band, beta, max_degree)`` of a grid point: ``band``, ``beta`` from ``params``, ``max_degree`` from
    ``cfg`` (default: all edges up to :data:`FULL_T_PASSAGES` passages, else :data:`DEFAULT_MAX_DEGREE`)."""
    band = params.get("band", _default("band"))
    band = tuple(band) if band is not None else None
    beta = params.get("beta", _default("beta"))
    max_degree = cfg.get("max_degree", None if corpus.shape[0] <= FULL_T_PASSAGES else DEFAULT_MAX_DEGREE)
    return band, beta, max_degree


def _seeds(params: Mapping[str, Any], cfg: Mapping[str, Any]) -> int:
    seeds: int = params.get("seeds", cfg.get("seeds", _default("seeds")))
    return seeds


def bench_model(
    corpus: Tensor, params: Mapping[str, Any], cfg: Mapping[str, Any], cache: dict[Any, Any], projection: None = None
) -> nn.Module:
    """G3RAG for one grid point, its gain graph built once per data set and ``(beta, band, max_degree)``;
    ``candidates`` and ``seeds`` from ``cfg`` (``seeds`` also from ``params``)."""
    band, beta, max_degree = _graph_settings(corpus, params, cfg)
    key = ("g3", beta, band, max_degree)
    if key not in cache:
        cache[key] = G3Graph.build(corpus, band=band, beta=beta, max_degree=max_degree)
    return G3Retriever(cache[key], candidates=cfg.get("candidates", _default("candidates")), seeds=_seeds(params, cfg))


def ranker_reference(
    corpus: Tensor, params: Mapping[str, Any], cfg: Mapping[str, Any], cache: dict[Any, Any]
) -> RankerReference:
    """G3RAG with the dense numpy transition matrix (:func:`g3_dense_reference`), the grid point's
    graph parameters as :func:`bench_model` reads them."""
    band, beta, max_degree = _graph_settings(corpus, params, cfg)
    x = corpus.double().cpu().numpy()
    key = ("g3-reference", band, beta, max_degree)
    if key not in cache:
        cache[key] = g3_dense_reference(x, band, beta, max_degree)[0]
    seeds = _seeds(params, cfg)
    candidates = cfg.get("candidates", _default("candidates"))

    def ref(q: Tensor, c: Any) -> np.ndarray:
        out = g3_retrieve_reference(
            x, cache[key], q.double().cpu().numpy(), candidates=candidates, seeds=seeds, k=cfg["k"]
        )
        return np.asarray(out[0], dtype=np.int64)

    return ref
