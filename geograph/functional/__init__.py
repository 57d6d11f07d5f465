"""Pure tensor functions: no state, batched ``(B, ...)``, masked, CPU or CUDA."""

from geograph.functional.g3 import g3_diffuse, g3_retrieve, g3_top_up
from geograph.functional.gain import gain_density, gain_transition
from geograph.functional.iso import iso_fusion, iso_local_subgraph, iso_personalization, iso_retrieve
from geograph.functional.isoperimetric import compatible_edges, conformal_volume, isoperimetric_ratio
from geograph.functional.maniscope import maniscope_scores
from geograph.functional.pagerank import personalized_pagerank
from geograph.functional.ricci import ricci_filtration, ricci_surgery
from geograph.ops.adjacency import csr_row_slots, knn_from_similarity, knn_graph, masked_percentile, query_graph
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
from geograph.transport._numba.runtime import warmup
from geograph.transport.curvature import lazy_measures, ollivier_ricci
from geograph.transport.flow import RicciFlowOutput, SimplexStats, exact_flow_stats, ricci_flow
from geograph.transport.solvers import SinkhornOutput, sinkhorn

__all__ = [
    "cosine_similarity",
    "normalize",
    "unit_rows",
    "knn_graph",
    "knn_from_similarity",
    "query_graph",
    "masked_percentile",
    "shortest_paths",
    "single_source_shortest_paths",
    "maniscope_scores",
    "sinkhorn",
    "SinkhornOutput",
    "lazy_measures",
    "ollivier_ricci",
    "ricci_flow",
    "RicciFlowOutput",
    "exact_flow_stats",
    "SimplexStats",
    "isoperimetric_ratio",
    "compatible_edges",
    "personalized_pagerank",
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
    "ricci_filtration",
    "ricci_surgery",
    "iso_retrieve",
    "iso_local_subgraph",
    "iso_personalization",
    "iso_fusion",
    "g3_retrieve",
    "g3_diffuse",
    "g3_top_up",
    "conformal_volume",
    "minmax_normalize",
    "csr_row_slots",
]

# The helpers other docstrings and docs/architecture.md cite as ``geograph.functional.*``.
from geograph.functional.gain import gain_density_info, gain_edges, gain_transition_edges
from geograph.knn.allpairs import tiled_pairs, tiled_topk
from geograph.ops.adjacency import clean_edge_index, csr_rowptr
from geograph.transport.solvers import TransportBounds, emd, transport_bounds

__all__ += [
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
