"""The registry entry of Maniscope: its parameters and bounds, how it is built, its score range, its
bench reference and the hand-written part of its page (``docs/methods/maniscope.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from torch import Tensor, nn

from geograph.methods.maniscope.functional import maniscope_scores
from geograph.methods.maniscope.module import Maniscope
from geograph.spec import POS_INT, UNIT, MethodSpec, Param


def _build_maniscope(
    corpus: Tensor | None, params: Mapping[str, Any], graph: nn.Module | None, projection: nn.Module | None
) -> nn.Module:
    return Maniscope(**params)


def _maniscope_range(model: nn.Module) -> tuple[float, float]:
    # alpha * cos + (1 - alpha) / (1 + d_geo): cos in [-1, 1], the geodesic term in [0, 1]
    return -float(cast(Maniscope, model).alpha), 1.0


SPEC = MethodSpec(
    name="maniscope",
    label="Maniscope",
    kind="reranker",
    module=Maniscope,
    functional=maniscope_scores,
    paper="W. G. Gong, Reranker Optimization via Geodesic Distances on k-NN Manifolds, arXiv:2602.15860, TMLR 2026",
    params=(
        Param("k", int, **POS_INT, doc="neighbours per candidate in the k-NN graph"),
        Param("alpha", float, **UNIT, doc="weight of the cosine against the geodesic similarity"),
        Param("early_stop", bool, doc="stop the relaxation once no distance changes (one check every 4 steps)"),
    ),
    build=_build_maniscope,
    score_range=_maniscope_range,
    reference=".bench:ranker_reference",
    reference_name="sklearn + scipy Dijkstra",
    bench_command=".command:main",
    bench_summary="batched Maniscope against the per-query scikit-learn + scipy reference",
    about="""Reranks the top-M dense candidates of a query by geodesic distance on their k-NN graph, mixed
with cosine. Each candidate links to its `k` nearest other candidates (undirected, length `1 - cos`);
the anchor is the candidate closest to the query; `d_geo` is the shortest-path distance from it.

    score_j = alpha * cos(q, c_j) + (1 - alpha) / (1 + d_geo(anchor, c_j))      (0 when unreachable)

Scores lie in `[-alpha, 1]`; the relevance in [0, 1] is `(score + alpha) / (1 + alpha)`.""",
    example='ranked = geograph.Ranker("maniscope", k=5, alpha=0.3).rank(query, documents, top_k=5)',
    exports=(maniscope_scores,),
    order=0,
)
