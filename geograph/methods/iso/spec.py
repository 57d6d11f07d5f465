"""The registry entry of ISO-RAG: its parameters and bounds, how it is built, its score range, its
bench reference and the hand-written part of its page (``docs/methods/iso.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from torch import Tensor, nn

from geograph.graphs import CorpusGraph
from geograph.methods.iso.functional import (
    ISO_PARAMS,
    iso_fusion,
    iso_local_subgraph,
    iso_personalization,
    iso_retrieve,
)
from geograph.methods.iso.module import ISORetriever
from geograph.methods.iso.pagerank import personalized_pagerank
from geograph.spec import POS_INT, MethodSpec, Param


def _build_iso(
    corpus: Tensor | None, params: Mapping[str, Any], graph: CorpusGraph | None, projection: nn.Module | None
) -> nn.Module:
    params = dict(params)
    knn = params.pop("knn", 10)
    if graph is None:
        corpus = cast(Tensor, corpus)  # create() checked: a corpus or a graph is given
        graph = CorpusGraph.from_knn(corpus, min(knn, corpus.shape[0] - 1))
    if projection is not None and projection.in_dim != graph.embeddings.shape[1]:
        raise ValueError(
            f"projection: takes {projection.in_dim}-dimensional inputs, the corpus has {graph.embeddings.shape[1]}"
        )
    model = ISORetriever(graph, projection=projection, **params)
    return model if corpus is None else model.to(corpus.device)


def _iso_k(model: nn.Module, num_docs: int) -> tuple[int, int | None, str]:
    return 1, int(cast(ISORetriever, model).max_k), "the guaranteed ISO local set size min(max(L, m), max_nodes, V)"


SPEC = MethodSpec(
    name="iso",
    label="ISO-RAG",
    kind="retriever",
    module=ISORetriever,
    functional=iso_retrieve,
    paper="ISO-RAG: Isoperimetric Noise Control for Retrieval-Augmented Generation",
    params=ISO_PARAMS,
    build_params=(Param("knn", int, **POS_INT, default=10, doc="k of the k-NN corpus graph built at start"),),
    not_params=("projection",),
    graph=CorpusGraph,
    projection=True,
    build=_build_iso,
    k_range=_iso_k,
    reference=".bench:ranker_reference",
    bench_model=".bench:bench_model",
    reference_name="numpy + networkx PageRank",
    bench_command=".command:main",
    bench_summary="ISO-RAG against dense on MuSiQue and SciFact, and against per-query networkx PageRank",
    about="""Prunes corpus-graph edges by a hyperbolic Cheeger ratio, then runs personalised PageRank on a
query-local subgraph. `phi_u = V(dS_u) / V(S_u)` with volumes `lambda(z)^p` of the (optionally
projected) points in the Poincare ball; an edge is kept iff `min(phi_u, phi_v) / max(phi_u, phi_v) >= beta`.
Per query: `m` seeds, the top-`L` dense passages and the `hops`-hop neighbourhood (at most
`max_nodes`), `pi = (1 - alpha) r + alpha W pi` with `r = softmax(tau * s)` on the seeds, and

    score = lambda_g * minmax(pi) + lambda_d * minmax(s)

`knn` is the k of the k-NN corpus graph built when no saved graph is given.""",
    example='passages = geograph.Retriever("iso", corpus=texts, knn=10).retrieve(query, k=5)',
    exports=(iso_retrieve, iso_local_subgraph, iso_personalization, iso_fusion, personalized_pagerank),
    order=2,
)
