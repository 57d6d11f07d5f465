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
from torch import Tensor, nn

from geograph import registry
from geograph.bench.common import Split
from geograph.spec import MethodSpec, RankerReference

Ranker = Callable[..., tuple[Tensor, Tensor]]
#: a row's reference for one query: ``(query (D,), candidate indices (M,))`` -> corpus indices, best first
Reference = RankerReference
#: the suffix of the row of a method with a trained f_theta (a method that takes a projection)
TRAINED = "_trained"
#: f_theta's training epochs when the trained row's section names none
EPOCHS = 5


@dataclass
class Context:
    """One data set: its split, the dense candidates of both halves, and built artefacts."""

    name: str
    split: Split
    candidates: int
    tune_cands: Tensor
    report_cands: Tensor
    cache: dict[Any, Any] = field(default_factory=dict)

    @property
    def corpus(self) -> Tensor:
        return self.split.corpus


class Method:
    """A row of the table: a grid, a ranker per grid point and, where one exists, a reference.

    A registered method's row (:class:`RegistryMethod`) takes its reference from the registry
    entry (``spec.reference``, a factory in the method's folder).
    """

    kind = "rerank"
    spec: MethodSpec | None = None

    @property
    def reference_name(self) -> str | None:
        return None if self.spec is None else self.spec.reference_name

    def ranker(self, ctx: Context, params: dict[str, Any], cfg: dict[str, Any]) -> Ranker:
        raise NotImplementedError

    def reference(self, ctx: Context, params: dict[str, Any], cfg: dict[str, Any]) -> Reference | None:
        """The slow reference for one query: ``(query (D,), candidate indices (M,))`` to the
        corpus indices it returns, best first (a 1-D int64 array)."""
        return None


class RegistryMethod(Method):
    """A registered method, its module made for each grid point by the registry entry (its
    ``bench_model``, else ``spec.create``): a reranker over the dense candidates, or a retriever
    over the corpus. ``trained``: the row of a method that takes a projection, with f_theta
    trained on the method's corpus graph (``epochs`` of the section, default :data:`EPOCHS`)."""

    spec: MethodSpec

    def __init__(self, spec: MethodSpec, *, trained: bool = False) -> None:
        self.spec = spec
        self.trained = trained
        self.kind = "rerank" if spec.is_reranker else "retrieve"

    def model(self, ctx: Context, params: dict[str, Any], cfg: dict[str, Any], *, trained: bool = True) -> nn.Module:
        """The module of one grid point (with this row's projection unless ``trained=False``)."""
        spec = self.spec
        projection = self._projection(ctx, cfg) if trained else None
        if spec.bench_model is not None:
            built: nn.Module = spec.load(spec.bench_model)(ctx.corpus, params, cfg, ctx.cache, projection)
            return built
        corpus = None if spec.is_reranker else ctx.corpus
        return spec.create(corpus, params, projection=projection)

    def _projection(self, ctx: Context, cfg: dict[str, Any]) -> nn.Module | None:
        if not self.trained:
            return None
        epochs = cfg.get("epochs", EPOCHS)
        key = ("f_theta", self.spec.name, tuple(cfg.get(p.name) for p in self.spec.build_params), epochs)
        if key not in ctx.cache:
            from geograph.graphs.corpus_graph import CorpusGraph
            from geograph.train.fit import train_projection

            graph = self.model(ctx, {}, cfg, trained=False).graph
            assert isinstance(graph, CorpusGraph)
            ctx.cache[key] = train_projection(graph, epochs=epochs)
        projection: nn.Module = ctx.cache[key]
        return projection

    def ranker(self, ctx: Context, params: dict[str, Any], cfg: dict[str, Any]) -> Ranker:
        model = self.model(ctx, params, cfg)
        if self.spec.is_reranker:
            return reranker(model, ctx.corpus)

        def run(q: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
            out = model(q, cfg["k"])
            return out.indices, out.scores

        return run

    def reference(self, ctx: Context, params: dict[str, Any], cfg: dict[str, Any]) -> Reference | None:
        spec = self.spec
        if spec.reference is None:
            return None
        artefacts = {"projection": self._projection(ctx, cfg)} if self.trained else {}
        factory: Callable[..., Reference] = spec.load(spec.reference)
        return factory(ctx.corpus, params, cfg, ctx.cache, **artefacts)


class Dense(Method):
    kind = "retrieve"

    def ranker(self, ctx: Context, params: dict[str, Any], cfg: dict[str, Any]) -> Ranker:
        from geograph.retrievers import DenseRetriever

        model = DenseRetriever(ctx.corpus)

        def run(q: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
            out = model(q, c.shape[1])
            return out.indices, out.scores

        return run


class BM25Method(Method):
    """The lexical baseline: :class:`~geograph.retrievers.bm25.BM25Retriever` on the passage texts.

    Rankers get query embeddings; the query texts are found by their embedding row (each
    split's queries are embedded once, so a row identifies its text).
    """

    kind = "retrieve"

    def _texts(self, ctx: Context) -> dict[bytes, str]:
        if "bm25-texts" not in ctx.cache:
            sp = ctx.split
            table = {}
            for q, queries in ((sp.tune_q, sp.tune.queries), (sp.report_q, sp.report.queries)):
                for row, text in zip(q.contiguous().cpu().numpy(), queries):
                    table[row.tobytes()] = text
            ctx.cache["bm25-texts"] = table
        found: dict[bytes, str] = ctx.cache["bm25-texts"]
        return found

    def ranker(self, ctx: Context, params: dict[str, Any], cfg: dict[str, Any]) -> Ranker:
        from geograph.retrievers.bm25 import BM25Retriever

        key = ("bm25", params.get("k1", 1.5), params.get("b", 0.75))
        if key not in ctx.cache:
            ctx.cache[key] = BM25Retriever(ctx.split.test.passages(), k1=key[1], b=key[2])
        model, texts = ctx.cache[key], self._texts(ctx)

        def run(q: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
            out = model.retrieve([texts[row.tobytes()] for row in q.contiguous().cpu().numpy()], cfg["k"])
            return out.indices, out.scores

        return run


def reranker(model: nn.Module, corpus: Tensor) -> Ranker:
    """A reranking module as a ranker over candidate indices (with an optional mask, for chains)."""

    def run(q: Tensor, c: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        out = model(q, corpus[c], mask)
        return c.gather(1, out.order), out.scores.gather(1, out.order)

    return run


def _rows() -> dict[str, Method]:
    """Every row but dense: BM25, every registered (non-baseline) method and, for a method that takes
    a projection, its row with a trained f_theta (``<name>_trained``)."""
    rows: dict[str, Method] = {"bm25": BM25Method()}
    for name in registry.names(baseline=False):
        spec = registry.get(name)
        rows[name] = RegistryMethod(spec)
        if spec.projection:
            rows[name + TRAINED] = RegistryMethod(spec, trained=True)
    return rows


METHODS = _rows()
#: the table's name of every row: the registered methods' labels, and the rows of the bench's own
LABELS = {
    **{spec.name: spec.label for spec in registry.METHODS.values()},
    "bm25": "BM25",
    **{name + TRAINED: f"{registry.get(name).label} + f_theta" for name in METHODS if name + TRAINED in METHODS},
}


def chain_ranker(rankers: Sequence[Ranker]) -> Ranker:
    """Rerankers in sequence on the surviving candidates of the previous stage."""

    def run(q: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        idx, scores = rankers[0](q, c)
        for nxt in rankers[1:]:
            mask = torch.isfinite(scores)
            idx, scores = nxt(q, idx, mask)
        return idx, scores

    return run


def chain_reference(refs: Sequence[Reference]) -> Reference:
    """The references in sequence: each stage's returned ids are the next stage's candidates."""

    def run(q: Tensor, c: Any) -> Any:
        out = np.asarray(c)
        for ref in refs:
            out = ref(q, out)
        return out

    return run
