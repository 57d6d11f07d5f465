"""Adapters: each method of the table as a ranker per grid point and, where one exists, its slow reference.

A ranker maps ``(query (b, D), dense candidate indices (b, M))`` to ``(corpus indices, scores)``
with ``-inf`` = dropped; a reference maps one query ``(D,)`` and its candidate indices ``(M,)``
to the corpus indices it returns, best first. References are computed from the raw inputs
(embeddings, edge lists, texts) by separate code, never from the module's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from geograph.bench.common import Split

LABELS = {
    "dense": "dense",
    "bm25": "BM25",
    "maniscope": "Maniscope",
    "ricci": "Ricci-Filtration",
    "iso": "ISO-RAG",
    "iso_trained": "ISO-RAG + f_theta",
    "g3": "G3RAG",
}
Ranker = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass
class Context:
    """One data set: its split, the dense candidates of both halves, and built artefacts."""

    name: str
    split: Split
    candidates: int
    tune_cands: Tensor
    report_cands: Tensor
    cache: dict = field(default_factory=dict)

    @property
    def corpus(self) -> Tensor:
        return self.split.corpus


class Method:
    """A row of the table: a grid, a ranker per grid point and, where one exists, a reference."""

    kind = "rerank"
    reference_name: str | None = None

    def ranker(self, ctx: Context, params: dict, cfg: dict) -> Ranker:
        raise NotImplementedError

    def reference(self, ctx: Context, params: dict, cfg: dict) -> Callable[[Tensor, Tensor], Any] | None:
        """The slow reference for one query: ``(query (D,), candidate indices (M,))`` to the
        corpus indices it returns, best first (a 1-D int64 array)."""
        return None


class Dense(Method):
    kind = "retrieve"

    def ranker(self, ctx, params, cfg):
        from geograph.retrievers import DenseRetriever

        model = DenseRetriever(ctx.corpus)

        def run(q, c):
            out = model(q, c.shape[1])
            return out.indices, out.scores

        return run


class BM25Method(Method):
    """The lexical baseline: :class:`~geograph.retrievers.bm25.BM25Retriever` on the passage texts.

    Rankers get query embeddings; the query texts are found by their embedding row (each
    split's queries are embedded once, so a row identifies its text).
    """

    kind = "retrieve"

    def _texts(self, ctx):
        if "bm25-texts" not in ctx.cache:
            sp = ctx.split
            table = {}
            for q, texts in ((sp.tune_q, sp.tune.queries), (sp.report_q, sp.report.queries)):
                for row, text in zip(q.contiguous().cpu().numpy(), texts):
                    table[row.tobytes()] = text
            ctx.cache["bm25-texts"] = table
        return ctx.cache["bm25-texts"]

    def ranker(self, ctx, params, cfg):
        from geograph.retrievers.bm25 import BM25Retriever

        key = ("bm25", params.get("k1", 1.5), params.get("b", 0.75))
        if key not in ctx.cache:
            ctx.cache[key] = BM25Retriever(ctx.split.test.passages(), k1=key[1], b=key[2])
        model, texts = ctx.cache[key], self._texts(ctx)

        def run(q, c):
            out = model.retrieve([texts[row.tobytes()] for row in q.contiguous().cpu().numpy()], cfg["k"])
            return out.indices, out.scores

        return run


def reranker(model, corpus: Tensor) -> Ranker:
    """A reranking module as a ranker over candidate indices (with an optional mask, for chains)."""

    def run(q, c, mask=None):
        out = model(q, corpus[c], mask)
        return c.gather(1, out.order), out.scores.gather(1, out.order)

    return run


class ManiscopeMethod(Method):
    reference_name = "sklearn + scipy Dijkstra"

    def ranker(self, ctx, params, cfg):
        from geograph.rerankers import Maniscope

        return reranker(Maniscope(**params), ctx.corpus)

    def reference(self, ctx, params, cfg):
        from geograph.bench.reference import maniscope_reference

        corpus = ctx.corpus.double().numpy()

        def ref(q, c):
            c = np.asarray(c)
            return c[maniscope_reference(q.double().numpy(), corpus[c], **params)[2]]

        return ref


class RicciMethod(Method):
    reference_name = "GraphRicciCurvature 0.6.1"

    def ranker(self, ctx, params, cfg):
        from geograph.rerankers import RicciFiltration

        return reranker(RicciFiltration(**params), ctx.corpus)

    def reference(self, ctx, params, cfg):
        return lambda q, c: np.asarray(c)[ricci_filtration_reference(q, ctx.corpus[torch.as_tensor(c)], **params)]


def ricci_filtration_reference(
    query: Tensor, docs: Tensor, *, percentile: float = 50.0, eta: float = 1.0, **flow
) -> np.ndarray:
    """Ricci-Filtration for one query with GraphRicciCurvature's 20-step flow: kept candidates by cosine.

    The query graph is built in numpy (:func:`geograph.bench.reference.ricci_graph_reference`,
    independent of ours); curvature and flow are GraphRicciCurvature's. Returns the kept candidate
    positions, best first.
    """
    from geograph.bench.reference import ricci_graph_reference, ricci_reference

    edges = ricci_graph_reference(query.double().numpy(), docs.double().numpy(), percentile=percentile)
    n = docs.shape[0] + 1
    _, lengths = ricci_reference(edges, n, iterations=flow.get("iterations", 20))
    keep = np.array([lengths[(0, j)] <= eta for j in range(1, n)])
    d = docs.double().numpy()
    cos = d @ query.double().numpy() / (np.linalg.norm(d, axis=1) * np.linalg.norm(query.double().numpy()))
    kept = np.flatnonzero(keep)
    return kept[np.argsort(-cos[kept], kind="stable")]


class ISOMethod(Method):
    kind = "retrieve"
    reference_name = "numpy + networkx PageRank"
    trained = False

    def _graph(self, ctx, cfg):
        from geograph.graphs.corpus_graph import CorpusGraph

        key = ("knn", cfg.get("knn", 10))
        if key not in ctx.cache:
            ctx.cache[key] = CorpusGraph.from_knn(ctx.corpus, cfg.get("knn", 10))
        return ctx.cache[key]

    def _projection(self, ctx, cfg):
        if not self.trained:
            return None
        key = ("f_theta", cfg.get("knn", 10), cfg.get("epochs", 5))
        if key not in ctx.cache:
            from geograph.train.fit import train_projection

            ctx.cache[key] = train_projection(self._graph(ctx, cfg), epochs=cfg.get("epochs", 5))
        return ctx.cache[key]

    def model(self, ctx, params, cfg):
        from geograph.retrievers import ISORetriever

        params = dict(params)
        beta = params.pop("beta", 0.4)
        key = ("iso", self.trained, cfg.get("knn", 10), beta)
        if key not in ctx.cache:  # phi and the kept edges are computed once per beta
            ctx.cache[key] = ISORetriever(self._graph(ctx, cfg), projection=self._projection(ctx, cfg), beta=beta)
        model = ctx.cache[key]
        for name, value in params.items():
            setattr(model, name, value)
        return model

    def ranker(self, ctx, params, cfg):
        k = cfg["k"]

        def run(q, c):
            out = self.model(ctx, params, cfg)(q, k)
            return out.indices, out.scores

        return run

    def reference(self, ctx, params, cfg):
        return iso_method_reference(ctx, params, cfg, self._graph(ctx, cfg), self._projection(ctx, cfg))


def iso_method_reference(ctx, params, cfg, graph, projection):
    """The numpy + networkx ISO-RAG of one grid point, from the raw inputs: the corpus
    embeddings, the k-NN edge list and the projected points (never the module's phi)."""
    from geograph.bench.reference import expmap0_reference, iso_reference, iso_reference_prepare

    emb = ctx.corpus.double().numpy()
    edges = graph.edge_index.cpu().numpy()
    z, c = None, 1.0
    if projection is not None:
        with torch.no_grad():
            z = expmap0_reference(
                projection.eval().mlp(ctx.corpus.to(next(projection.parameters()).dtype)).double().numpy(), projection.c
            )
        c = projection.c
    beta = params.get("beta", 0.4)
    key = ("iso-reference", projection is not None, cfg.get("knn", 10), beta)
    if key not in ctx.cache:  # the per-corpus part, once per beta (outside the timed loop)
        ctx.cache[key] = iso_reference_prepare(emb, edges, z=z, c=c, beta=beta)
    kwargs = {name: value for name, value in params.items() if name != "beta"}
    return lambda q, cands: np.asarray(
        iso_reference(emb, edges, q.double().numpy(), cfg["k"], beta=beta, c=c, prepared=ctx.cache[key], **kwargs)[0],
        dtype=np.int64,
    )


class ISOTrainedMethod(ISOMethod):
    trained = True


class G3Method(Method):
    kind = "retrieve"
    reference_name = "dense numpy T"

    def _graph(self, ctx, params, cfg):
        from geograph.graphs import G3Graph

        band = params.get("band", (0.1, 0.7))
        band = tuple(band) if band is not None else None
        max_degree = cfg.get("max_degree", None if ctx.corpus.shape[0] <= 2000 else 128)
        key = ("g3", params.get("beta", 0.4), band, max_degree)
        if key not in ctx.cache:
            ctx.cache[key] = G3Graph.build(ctx.corpus, band=band, beta=params.get("beta", 0.4), max_degree=max_degree)
        return ctx.cache[key]

    def ranker(self, ctx, params, cfg):
        from geograph.retrievers import G3Retriever

        model = G3Retriever(
            self._graph(ctx, params, cfg),
            candidates=cfg.get("candidates", 10),
            seeds=params.get("seeds", cfg.get("seeds", 2)),
        )

        def run(q, c):
            out = model(q, cfg["k"])
            return out.indices, out.scores

        return run

    def reference(self, ctx, params, cfg):
        from geograph.bench.reference import g3_dense_reference, g3_retrieve_reference

        graph = self._graph(ctx, params, cfg)
        x = ctx.corpus.double().numpy()
        t, _ = g3_dense_reference(x, graph.band, graph.beta, graph.max_degree)
        seeds = params.get("seeds", cfg.get("seeds", 2))
        return lambda q, c: np.asarray(
            g3_retrieve_reference(
                x, t, q.double().numpy(), candidates=cfg.get("candidates", 10), seeds=seeds, k=cfg["k"]
            )[0],
            dtype=np.int64,
        )


METHODS: dict[str, Method] = {
    "bm25": BM25Method(),
    "maniscope": ManiscopeMethod(),
    "ricci": RicciMethod(),
    "iso": ISOMethod(),
    "iso_trained": ISOTrainedMethod(),
    "g3": G3Method(),
}


def chain_ranker(rankers: Sequence[Ranker]) -> Ranker:
    """Rerankers in sequence on the surviving candidates of the previous stage."""

    def run(q, c):
        idx, scores = rankers[0](q, c)
        for nxt in rankers[1:]:
            mask = torch.isfinite(scores)
            idx, scores = nxt(q, idx, mask)
        return idx, scores

    return run


def chain_reference(refs: Sequence[Callable]) -> Callable:
    """The references in sequence: each stage's returned ids are the next stage's candidates."""

    def run(q, c):
        out = np.asarray(c)
        for ref in refs:
            out = ref(q, out)
        return out

    return run
