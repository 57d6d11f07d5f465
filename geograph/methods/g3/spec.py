"""The registry entry of G3RAG: its parameters and bounds, how it is built, its score range, its
bench reference and the hand-written part of its page (``docs/methods/g3.md``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

from geograph.graphs import G3Graph
from geograph.methods.g3.functional import g3_diffuse, g3_retrieve, g3_top_up
from geograph.methods.g3.module import G3Retriever
from geograph.spec import POS_INT, MethodSpec, Param


def _build_g3(
    corpus: Tensor | None, params: Mapping[str, Any], graph: G3Graph | None, projection: nn.Module | None
) -> nn.Module:
    params = dict(params)
    if "candidates" not in params:  # the default pool, not a configured one, shrinks to a small corpus
        size = graph.num_nodes if graph is not None else cast(Tensor, corpus).shape[0]
        params["candidates"] = min(inspect.signature(G3Retriever.__init__).parameters["candidates"].default, size)
    if graph is not None:
        model = G3Retriever(graph, **params)
        return model if corpus is None else model.to(corpus.device)
    if params.get("band") is not None:
        params["band"] = tuple(params["band"])
    with torch.no_grad():
        return G3Retriever(cast(Tensor, corpus), **params)  # create() checked: a corpus or a graph is given


def _g3_k(model: nn.Module, num_docs: int) -> tuple[int, int | None, str]:
    return int(cast(G3Retriever, model).seeds), num_docs, "the corpus size"


SPEC = MethodSpec(
    name="g3",
    label="G3RAG",
    kind="retriever",
    module=G3Retriever,
    functional=g3_retrieve,
    paper="G3RAG: Beyond Similarity through Zero-Token Geometric Graphs for Multi-Hop RAG",
    params=(
        Param("candidates", int, **POS_INT, doc="dense candidates per query"),
        Param("seeds", int, **POS_INT, doc="seeds kept per query (at most candidates)"),
    ),
    build_params=(
        Param("band", tuple, optional=True, doc="cosine band of the gain edges (null: every pair)"),
        Param("beta", float, doc="density penalty exp(-beta rho) on the edge's target"),
        Param("max_degree", int, **POS_INT, optional=True, doc="strongest edges kept per row (null: all)"),
    ),
    graph=G3Graph,
    build=_build_g3,
    k_range=_g3_k,
    reference=".bench:ranker_reference",
    bench_model=".bench:bench_model",
    reference_name="dense numpy T",
    bench_command=".command:main",
    bench_summary="blockwise G3 graph build against the dense numpy construction, and G3RAG against dense",
    about="""Builds a zero-token geometric gain graph over the corpus and diffuses one step from seed
passages. For `x = S_ij` inside `band`: `W_ij = x sqrt(1 - x^2) exp(-beta rho_j)` (`rho` the
normalised density), at most `max_degree` edges a row, `T` = row-normalised `W`. Per query: the
dense top-`candidates`, `seeds` of them as seeds, `y = p T` one step from the uniform seed vector,
the seeds first, then the best of `y`.""",
    example='passages = geograph.Retriever("g3", corpus=texts).retrieve(query, k=5)',
    exports=(g3_retrieve, g3_diffuse, g3_top_up),
    order=3,
)
