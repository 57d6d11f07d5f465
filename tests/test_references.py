"""Public outputs not yet checked elsewhere against a reference computed from the raw inputs
(numpy / networkx only; nothing of geograph builds the expected values)."""

import numpy as np
import pytest
import torch

from geograph import CorpusGraph, DenseRetriever, ISORetriever
from geograph.functional import compatible_edges, query_graph


@pytest.mark.parametrize("percentile", [0.0, 30.0, 50.0, 87.5, 100.0])
def test_query_graph_matches_numpy(percentile):
    """Ricci-Filtration's graph: ``r = 1 - cos``, ``tau = numpy.percentile`` over the real pairs
    ``i < j`` (query included), edge iff ``r >= tau``, every query edge forced; padding has none."""
    rng = np.random.default_rng(int(percentile * 8))
    sizes = [9, 4, 1, 7]
    q = rng.standard_normal((4, 6))
    docs = rng.standard_normal((4, 9, 6))
    docs[1, 1] = docs[1, 0] * 3.0  # a duplicate direction: r = 0 ties
    out_adj, node_mask, tau = query_graph(
        torch.from_numpy(q),
        torch.from_numpy(docs),
        torch.arange(9)[None] < torch.tensor(sizes)[:, None],
        percentile=percentile,
    )
    for b, s in enumerate(sizes):
        z = np.concatenate([q[b][None], docs[b, :s]])
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
        r = 1.0 - z @ z.T
        iu, ju = np.triu_indices(s + 1, 1)
        ref_tau = np.percentile(r[iu, ju], percentile)
        ref = np.zeros((s + 1, s + 1), dtype=bool)
        sel = (r[iu, ju] >= ref_tau) | (iu == 0)
        ref[iu[sel], ju[sel]] = True
        ref |= ref.T
        assert float(tau[b]) == pytest.approx(ref_tau, abs=1e-12)
        assert np.array_equal(out_adj[b, : s + 1, : s + 1].numpy(), ref)
        assert not out_adj[b, s + 1 :].any() and not out_adj[b, :, s + 1 :].any()
        assert node_mask[b].tolist() == [True] * (s + 1) + [False] * (9 - s)


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.4, 0.8, 1.0])
def test_compatible_edges_matches_numpy(beta):
    """ISO-RAG's edge filter: keep iff ``min(phi) / max(phi) >= beta``, with ``0 / 0`` as 1."""
    rng = np.random.default_rng(int(beta * 100))
    phi = rng.uniform(0.0, 2.0, 60)
    phi[:6] = 0.0  # isolated-like nodes: 0 / 0 pairs and 0 / x pairs
    phi[6:9] = phi[9]  # exact ties: ratio 1
    ei = rng.integers(0, 60, (2, 400))
    lo, hi = np.minimum(phi[ei[0]], phi[ei[1]]), np.maximum(phi[ei[0]], phi[ei[1]])
    ratio = np.divide(lo, hi, out=np.ones_like(lo), where=hi > 0)
    ours = compatible_edges(torch.from_numpy(ei), torch.from_numpy(phi), beta=beta)
    assert ours.tolist() == (ratio >= beta).tolist()
    assert 0 < (ratio >= beta).sum() < len(ratio) or beta == 0.0


def test_iso_pruned_share_matches_reference():
    """``pruned_share``: the share of the graph's (directed) edges the phi filter removes,
    with phi from networkx BFS on the raw edge list and exp_0 of the raw embeddings."""
    import networkx as nx

    rng = np.random.default_rng(7)
    emb = rng.standard_normal((70, 8))
    z = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    nn = np.argsort(-(z @ z.T - 2 * np.eye(70)), axis=1, kind="stable")[:, :3]
    edges = np.stack([np.repeat(np.arange(70), 3), nn.ravel()])
    norm = np.linalg.norm(emb, axis=1, keepdims=True)
    ball = np.tanh(norm) * emb / norm  # exp_0, c = 1
    vol = (2.0 / (1.0 - (ball**2).sum(1))) ** 2.0
    g = nx.Graph(list(map(tuple, edges.T)))
    phi = np.zeros(70)
    for u in range(70):
        hops = nx.single_source_shortest_path_length(g, u, cutoff=2)
        phi[u] = sum(vol[w] for w, d in hops.items() if d == 2) / (
            sum(vol[w] for w, d in hops.items() if d <= 1) + np.finfo(np.float64).eps
        )
    ratios = np.array([min(phi[a], phi[b]) / max(phi[a], phi[b]) for a, b in g.edges])
    model = ISORetriever(CorpusGraph.from_edge_index(torch.from_numpy(emb), torch.from_numpy(edges)))
    assert model.pruned_share == pytest.approx(float((ratios < 0.4).mean()), abs=1e-6)  # a float32 mean inside
    assert 0 < model.pruned_share < 1


@pytest.mark.parametrize("chunk_size", [7, 1000])
def test_dense_retriever_scores_and_ids_match_numpy(chunk_size):
    """Exact cosine top-k: scores within float64 rounding, ids as numpy's stable argsort."""
    rng = np.random.default_rng(3)
    corpus, query = rng.standard_normal((120, 16)), rng.standard_normal((5, 16))
    cn = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    cos = (query / np.linalg.norm(query, axis=1, keepdims=True)) @ cn.T
    ref = np.argsort(-cos, axis=1, kind="stable")[:, :10]
    out = DenseRetriever(torch.from_numpy(corpus), chunk_size=chunk_size)(torch.from_numpy(query), 10)
    assert out.indices.numpy().tolist() == ref.tolist()
    np.testing.assert_allclose(out.scores.numpy(), np.take_along_axis(cos, ref, 1), atol=1e-12, rtol=0)
