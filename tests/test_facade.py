"""``geograph.functional`` is the public facade over the engines, the shared ops and the methods'
math: every name it exported before the engines became packages still imports from it, and each
is the very object its home module defines (no copies)."""

import importlib

import pytest

import geograph.functional as F

# the facade's public names as released; a name may be added, never dropped
RELEASED = """
RicciFlowOutput SimplexStats SinkhornOptions SinkhornOutput TransportBounds clean_edge_index compatible_edges
conformal_volume cosine_similarity csr_row_slots csr_rowptr emd exact_flow_stats g3_diffuse
g3_retrieve g3_top_up gain_density gain_density_info gain_edges gain_transition
gain_transition_edges hit_all_at_k hit_answer_at_k iso_fusion iso_local_subgraph
iso_personalization iso_retrieve isoperimetric_ratio knn_from_similarity knn_graph lazy_measures
maniscope_scores masked_percentile minmax_normalize mrr_at_k ndcg_at_k normalize numba_cache_info
ollivier_ricci personalized_pagerank precision_at_k query_graph recall_at_k ricci_filtration
ricci_flow ricci_surgery shortest_paths single_source_shortest_paths sinkhorn tiled_pairs
tiled_topk transport_bounds unit_rows warmup
""".split()


@pytest.mark.parametrize("name", RELEASED)
def test_released_name_imports(name):
    assert name in F.__all__
    obj = getattr(F, name)
    home = importlib.import_module(obj.__module__)
    assert getattr(home, getattr(obj, "__name__", name)) is obj


def test_all_names_resolve():
    missing = [name for name in F.__all__ if not hasattr(F, name)]
    assert not missing
    assert len(F.__all__) == len(set(F.__all__))


@pytest.mark.parametrize("engine", ["geograph.knn", "geograph.ops"])
def test_engine_is_not_under_functional(engine):
    # the engines and shared ops are packages of their own, re-exported by the facade
    module = importlib.import_module(engine)
    assert not module.__name__.startswith("geograph.functional")
    for name in getattr(module, "__all__", []):
        assert hasattr(module, name)
