"""The module a ``geograph serve`` worker runs, built from the method, its parameters and artefacts.

``params`` are the module's constructor arguments: every keyword-only argument of the method's
class (read from its signature, so a new constructor argument is servable at once), except the
ones a config file cannot hold (a Python callable, an artefact given by its own key), plus the
graph-building ``knn`` of ``iso``. They are checked here (:func:`check_params`) and by the
module's own constructor. ``graph`` is a directory written by
:meth:`geograph.CorpusGraph.save` (ISO) or :meth:`geograph.G3Graph.save` (G3) loaded instead of
building one at start; ``projection`` a directory written by
:meth:`geograph.PoincareProjection.save_pretrained`. Both are checked against the corpus (its
passage ids and embeddings) and the encoder in use, and refused with one line naming both sides
when they were made with another.

=========  ==========================================================================
method     class; params not taken from its signature
=========  ==========================================================================
maniscope  :class:`~geograph.Maniscope`
ricci      :class:`~geograph.RicciFiltration`; not ``scorer`` (a callable)
iso        :class:`~geograph.ISORetriever`; plus ``knn`` (k-NN graph built at start when no
           ``graph``); not ``projection`` (the ``projection`` key)
g3         :class:`~geograph.G3Retriever`; ``band``, ``beta``, ``max_degree`` only when no ``graph``
=========  ==========================================================================
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

METHODS = ("maniscope", "ricci", "iso", "g3")
RERANKERS = ("maniscope", "ricci")
#: methods that run geograph's numba kernels (the exact OT solver of the Ricci flow): their
#: workers compile or load them (:func:`geograph.functional.warmup`) before reporting ready
KERNEL_METHODS = ("ricci",)

#: constructor arguments a config cannot set: callables and artefacts with their own key
_NOT_PARAMS = {"ricci": ("scorer",), "iso": ("projection",)}
#: parameters that are not constructor arguments: building the graph at start
_EXTRA_PARAMS = {"iso": ("knn",)}
_GRAPH_BUILD = {"iso": ("knn",), "g3": ("band", "beta", "max_degree")}


def method_class(method: str) -> type:
    """The module class that serves ``method``."""
    if method == "maniscope":
        from geograph.rerankers import Maniscope as cls
    elif method == "ricci":
        from geograph.rerankers import RicciFiltration as cls
    elif method == "iso":
        from geograph.retrievers import ISORetriever as cls
    elif method == "g3":
        from geograph.retrievers import G3Retriever as cls
    else:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return cls


@functools.cache
def method_params(method: str) -> tuple[str, ...]:
    """The ``params`` keys ``method`` accepts, derived from its class's constructor signature.

    Example:
        >>> method_params("maniscope")
        ('k', 'alpha', 'early_stop')
    """
    sig = inspect.signature(method_class(method).__init__)
    skip = _NOT_PARAMS.get(method, ())
    own = tuple(name for name, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY and name not in skip)
    return _EXTRA_PARAMS.get(method, ()) + own


def __getattr__(name: str):
    if name == "PARAMS":  # the former hand-written table, now derived (computed on first use: imports torch)
        return {m: method_params(m) for m in METHODS}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_params(
    method: str, params: dict[str, Any], *, graph: str | None = None, projection: str | None = None
) -> None:
    """Raise ``ValueError`` on a parameter or artefact the method does not take.

    Example:
        >>> check_params("maniscope", {"k": 3})
        >>> try:
        ...     check_params("maniscope", {"beta": 0.4})
        ... except ValueError as e:
        ...     print(e)
        params: unknown key 'beta' for method maniscope (allowed: k, alpha, early_stop)
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    allowed = method_params(method)
    for key in params:
        if key not in allowed:
            raise ValueError(f"params: unknown key {key!r} for method {method} (allowed: {', '.join(allowed)})")
        if graph is not None and key in _GRAPH_BUILD.get(method, ()):
            raise ValueError(f"params: {key} is fixed by the saved graph (graph: {graph}); remove it")
    if graph is not None and method not in ("iso", "g3"):
        raise ValueError(f"graph applies to iso and g3, not {method}")
    if projection is not None and method != "iso":
        raise ValueError(f"projection applies to iso, not {method}")


def build_model(
    method: str,
    corpus,
    params: dict | None = None,
    *,
    graph: str | None = None,
    projection: str | None = None,
    ids=None,
    encoder=None,
):
    """The module for ``method`` over ``corpus (V, D)`` (on the corpus's device).

    ``ids`` (the corpus's passage ids) and ``encoder`` (its :class:`~geograph.artefact.EncoderIdentity`
    or ``Encoder``) are checked against a saved ``graph``'s and ``projection``'s manifests.

    Raises:
        ValueError: a bad parameter (the module's message), an artefact that cannot be read or
            does not match the corpus (ids, embeddings, size or dimension) or the encoder.
    """
    import torch

    params = dict(params or {})
    check_params(method, params, graph=graph, projection=projection)
    if method == "maniscope":
        from geograph.rerankers import Maniscope

        return Maniscope(**params)
    if method == "ricci":
        from geograph.rerankers import RicciFiltration

        return RicciFiltration(**params)
    v, d = corpus.shape
    if method == "iso":
        from geograph.graphs.corpus_graph import CorpusGraph
        from geograph.projection import PoincareProjection
        from geograph.retrievers import ISORetriever

        if graph is not None:
            g = _load(CorpusGraph.from_pretrained, graph, "graph", corpus=_corpus(ids, corpus), encoder=encoder)
        else:
            knn = params.pop("knn", 10)
            if isinstance(knn, bool) or not isinstance(knn, int) or knn < 1:
                raise ValueError(f"params: knn must be a positive integer, got {knn!r}")
            g = CorpusGraph.from_knn(corpus, min(knn, v - 1))
        params.pop("knn", None)
        _match(g.embeddings.shape, v, d, graph)
        proj = None
        if projection:
            proj = _load(PoincareProjection.from_pretrained, projection, "projection", encoder=encoder)
        if proj is not None and proj.in_dim != d:
            raise ValueError(f"projection: {projection} takes {proj.in_dim}-dimensional inputs, the corpus has {d}")
        model = ISORetriever(g, projection=proj, **params)
        return model.to(corpus.device)
    from geograph.graphs import G3Graph
    from geograph.retrievers import G3Retriever

    if graph is not None:
        g = _load(G3Graph.from_pretrained, graph, "graph", corpus=_corpus(ids, corpus), encoder=encoder)
        _match(g.embeddings.shape, v, d, graph)
        return G3Retriever(g, **params).to(corpus.device)
    if "band" in params and params["band"] is not None:
        params["band"] = tuple(params["band"])
    with torch.no_grad():
        return G3Retriever(corpus, **params)


def _corpus(ids, corpus):
    cpu = corpus.cpu()
    return cpu if ids is None else (list(ids), cpu)


def _load(loader, path: str, what: str, **checks):
    from geograph.artefact import ArtefactMismatch

    try:
        return loader(path, **checks)
    except ArtefactMismatch as e:  # made with another encoder, over another corpus, in another format
        raise ValueError(f"{what}: {str(e).splitlines()[0]}") from e
    except Exception as e:  # noqa: BLE001 - any unreadable artefact is a one-line start error
        raise ValueError(f"{what}: cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def _match(shape, v: int, d: int, path: str) -> None:
    if tuple(shape) != (v, d):
        raise ValueError(f"graph: {path} holds {shape[0]} x {shape[1]} embeddings, the corpus is {v} x {d}")


def k_bounds(method: str, model, num_docs: int) -> tuple[int, int | None, str]:
    """``(k_min, k_max, why)`` the module accepts on ``/retrieve`` (rerankers: bounded by the pool)."""
    if method == "iso":
        return 1, int(model.max_k), "the guaranteed ISO local set size min(max(L, m), max_nodes, V)"
    if method == "g3":
        return int(model.seeds), num_docs, "the corpus size"
    return 1, None, ""


def score_bounds(method: str, model) -> tuple[float, float]:
    """``(lo, hi)``: the range of a reranker's scores, which ``/v1`` and ``/v2/rerank`` map onto [0, 1].

    Maniscope: ``alpha * cos + (1 - alpha) / (1 + d_geo)`` with ``cos`` in [-1, 1] and the
    geodesic term in [0, 1] gives ``[-alpha, 1]``; Ricci-Filtration orders its kept candidates
    by cosine, ``[-1, 1]``.

    Example:
        >>> from geograph.rerankers import Maniscope
        >>> score_bounds("maniscope", Maniscope(alpha=0.3))
        (-0.3, 1.0)
    """
    if method == "maniscope":
        return -float(model.alpha), 1.0
    if method == "ricci":
        return -1.0, 1.0
    raise ValueError(f"method must be one of {', '.join(RERANKERS)}, got {method!r}")
