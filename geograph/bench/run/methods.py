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

from geograph import registry
from geograph.bench.common import Split
from geograph.bench.reference import resolve
from geograph.registry import MethodSpec

#: the table's name of every row: the registered methods' labels, and the rows of the bench's own
LABELS = {
    **{spec.name: spec.label for spec in registry.METHODS.values()},
    "bm25": "BM25",
    "iso_trained": "ISO-RAG + f_theta",
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
    """A row of the table: a grid, a ranker per grid point and, where one exists, a reference.

    A registered method's row (:class:`RegistryMethod`) takes its reference from the registry
    entry (``spec.reference``, a factory of :mod:`geograph.bench.reference`).
    """

    kind = "rerank"
    spec: MethodSpec | None = None

    @property
    def reference_name(self) -> str | None:
        return None if self.spec is None else self.spec.reference_name

    def ranker(self, ctx: Context, params: dict, cfg: dict) -> Ranker:
        raise NotImplementedError

    def reference(self, ctx: Context, params: dict, cfg: dict) -> Callable[[Tensor, Tensor], Any] | None:
        """The slow reference for one query: ``(query (D,), candidate indices (M,))`` to the
        corpus indices it returns, best first (a 1-D int64 array)."""
        if self.spec is None or self.spec.reference is None:
            return None
        return resolve(self.spec.reference)(ctx.corpus, params, cfg, ctx.cache)


class RegistryMethod(Method):
    """A registered method, its module made by the registry (``spec.create``) for each grid point:
    a reranker over the dense candidates, or a retriever over the corpus."""

    def __init__(self, spec: MethodSpec) -> None:
        self.spec = spec
        self.kind = "rerank" if spec.is_reranker else "retrieve"

    def ranker(self, ctx, params, cfg):
        spec = self.spec
        if spec.is_reranker:
            return reranker(spec.create(params=params), ctx.corpus)
        model = spec.create(ctx.corpus, params)

        def run(q, c):
            out = model(q, cfg["k"])
            return out.indices, out.scores

        return run


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


class ISOMethod(RegistryMethod):
    """ISO-RAG with the k-NN graph, phi and an optional trained projection made once per data set."""

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
        factory = resolve(self.spec.reference)
        return factory(ctx.corpus, params, cfg, ctx.cache, projection=self._projection(ctx, cfg))


class ISOTrainedMethod(ISOMethod):
    trained = True


class G3Method(RegistryMethod):
    """G3RAG with its gain graph built once per data set and grid point of the graph's parameters."""

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


#: registered methods with a row of their own making (per-data-set caches); the others are RegistryMethod
_OWN: dict[str, type[RegistryMethod]] = {"iso": ISOMethod, "g3": G3Method}
#: every row but dense: BM25, every registered (non-baseline) method, and ISO-RAG with a trained f_theta
METHODS: dict[str, Method] = {"bm25": BM25Method()}
for _name in registry.names(baseline=False):
    METHODS[_name] = _OWN.get(_name, RegistryMethod)(registry.get(_name))
    if _name == "iso":
        METHODS["iso_trained"] = ISOTrainedMethod(registry.get("iso"))


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
