"""The registry entry of Ricci-Filtration: its parameters and bounds, how it is built, its score range, its
bench reference and the hand-written part of its page (``docs/methods/ricci.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from geograph.methods.ricci.functional import RICCI_PARAMS, ricci_filtration, ricci_surgery
from geograph.methods.ricci.module import RicciFiltration
from geograph.spec import MethodSpec


def _build_ricci(
    corpus: Tensor | None, params: Mapping[str, Any], graph: nn.Module | None, projection: nn.Module | None
) -> nn.Module:
    return RicciFiltration(**params)


def _cosine_range(model: nn.Module) -> tuple[float, float]:
    return -1.0, 1.0


SPEC = MethodSpec(
    name="ricci",
    label="Ricci-Filtration",
    kind="reranker",
    module=RicciFiltration,
    functional=ricci_filtration,
    paper="Ricci-Filtration: Boosting Retrieval-Augmented Generation Reranker to Query-Answer Tasks by "
    "Discrete Ricci Flow, arXiv:2606.15482",
    params=RICCI_PARAMS,
    not_params=("scorer",),
    build=_build_ricci,
    warmup=("numba",),
    score_range=_cosine_range,
    reference=".bench:ranker_reference",
    reference_name="GraphRicciCurvature 0.6.1",
    bench_command=".command:main",
    bench_summary="RicciFiltration against GraphRicciCurvature 0.6.1 per query",
    # the work grows with about the fourth power of the candidates (docs/guide/serving-limits.md): 100 took seconds
    max_candidates=100,
    about="""Drops candidates whose query edge is stretched by the normalised discrete Ricci flow. Graph per
query: the query and its candidates, `r_ij = 1 - cos`, an edge where `r_ij` is at or above the
`percentile`-th percentile (query edges forced). Ollivier-Ricci curvature with lazy measures
(`alpha`, `exp_power`), then `iterations` flow steps

    w <- w - step * kappa * w,   rescaled to mean length 1,

stopping once `max kappa - min kappa < delta`; a candidate is kept iff its final query-edge length
is at most `eta`. Kept candidates are ordered by cosine (scores in `[-1, 1]`, relevance
`(cos + 1) / 2`); the dropped ones are listed apart (`RankedResults.dropped`).""",
    example='ranked = geograph.Ranker("ricci").rank(query, documents)  # ranked.dropped: the positions it removed',
    exports=(ricci_filtration, ricci_surgery),
    order=1,
)
