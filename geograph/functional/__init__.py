"""Pure tensor functions: no state, batched ``(B, ...)``, masked, CPU or CUDA.

The public facade over the engines (:mod:`geograph.knn`, :mod:`geograph.transport`), the shared
ops (:mod:`geograph.ops`), the corpus-graph geometry (:mod:`geograph.geometry`) and the methods'
math: each registered method's ``exports`` (its functional twin and helpers, e.g.
``maniscope_scores``) are read from the method registry on first use, so a method folder or an
installed plugin adds its functions here without an edit.
"""

from typing import Any

from geograph import registry
from geograph.geometry.gain import gain_density, gain_density_info, gain_edges, gain_transition, gain_transition_edges
from geograph.geometry.isoperimetric import compatible_edges, conformal_volume, isoperimetric_ratio
from geograph.knn.allpairs import tiled_pairs, tiled_topk
from geograph.ops.adjacency import (
    clean_edge_index,
    csr_row_slots,
    csr_rowptr,
    knn_from_similarity,
    knn_graph,
    masked_percentile,
    query_graph,
)
from geograph.ops.paths import shortest_paths, single_source_shortest_paths
from geograph.ops.ranking_metrics import (
    hit_all_at_k,
    hit_answer_at_k,
    mrr_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
)
from geograph.ops.similarity import cosine_similarity, minmax_normalize, normalize, unit_rows
from geograph.transport._numba.runtime import cache_info as numba_cache_info
from geograph.transport._numba.runtime import compile_stats as numba_compile_stats
from geograph.transport._numba.runtime import warmup
from geograph.transport.curvature import lazy_measures, ollivier_ricci
from geograph.transport.flow import RicciFlowOutput, SimplexStats, exact_flow_stats, ricci_flow
from geograph.transport.solvers import SinkhornOptions, SinkhornOutput, TransportBounds, emd, sinkhorn, transport_bounds

# the names every release has exported; the methods' names are added from the registry (``__getattr__``)
_STATIC = [
    "cosine_similarity",
    "normalize",
    "unit_rows",
    "knn_graph",
    "knn_from_similarity",
    "query_graph",
    "masked_percentile",
    "shortest_paths",
    "single_source_shortest_paths",
    "sinkhorn",
    "SinkhornOutput",
    "SinkhornOptions",
    "lazy_measures",
    "ollivier_ricci",
    "ricci_flow",
    "RicciFlowOutput",
    "exact_flow_stats",
    "SimplexStats",
    "isoperimetric_ratio",
    "compatible_edges",
    "gain_density",
    "gain_transition",
    "recall_at_k",
    "precision_at_k",
    "ndcg_at_k",
    "mrr_at_k",
    "hit_all_at_k",
    "hit_answer_at_k",
    "warmup",
    "numba_cache_info",
    "numba_compile_stats",
    "conformal_volume",
    "minmax_normalize",
    "csr_row_slots",
]

# The helpers other docstrings and docs/architecture.md cite as ``geograph.functional.*``.
_STATIC += [
    "emd",
    "transport_bounds",
    "TransportBounds",
    "gain_edges",
    "gain_density_info",
    "gain_transition_edges",
    "clean_edge_index",
    "csr_rowptr",
    "tiled_pairs",
    "tiled_topk",
]


def _method_exports() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for spec in registry.METHODS.values():  # the first registered of two same-named functions is exported
        for obj in spec.exports:
            found.setdefault(obj.__name__, obj)
    return found


__getattr__, __dir__ = registry.lazy_exports(__name__, _method_exports, _STATIC, lambda: list(globals()))
