import numpy as np
import pytest
import torch

from geograph import CorpusGraph, ISORetriever, PoincareProjection
from geograph.bench.reference import iso_reference as reference_retrieve
from geograph.encoders import conformal_volume


def clustered(rng, v, d, clusters=6):
    centers = rng.standard_normal((clusters, d)) * 2
    x = centers[rng.integers(0, clusters, v)] + rng.standard_normal((v, d))
    return torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True))


@pytest.mark.parametrize("seed", range(6))
def test_matches_reference(seed):
    rng = np.random.default_rng(seed)
    v = int(rng.integers(40, 150))
    emb = clustered(rng, v, 16)
    graph = CorpusGraph.from_knn(emb, int(rng.integers(2, 6)))
    kwargs = dict(m=int(rng.integers(1, 6)), L=int(rng.integers(5, 30)), hops=int(rng.integers(0, 3)),
                  max_nodes=int(rng.integers(30, 60)), beta=float(rng.uniform(0.2, 0.8)))
    proj = PoincareProjection(16, 4, hidden=8) if seed % 2 else None
    model = ISORetriever(graph, projection=proj, max_iter=2000, **kwargs)
    query = clustered(rng, 9, 16)
    out = model(query, 5)
    for b in range(9):
        ids, scores = reference_retrieve(model, query[b], 5)
        np.testing.assert_allclose(out.scores[b].numpy(), scores, atol=1e-6)
        assert out.indices[b].tolist() == ids.tolist()


def test_phi_cached_and_refresh():
    rng = np.random.default_rng(0)
    emb = clustered(rng, 80, 8)
    model = ISORetriever(CorpusGraph.from_knn(emb, 4), projection=PoincareProjection(8, 3, hidden=4))
    phi = model.phi.clone()
    assert phi.shape == (80,) and torch.isfinite(phi).all()
    assert 0.0 <= model.pruned_share <= 1.0
    with torch.no_grad():
        for prm in model.projection.parameters():
            prm.mul_(3.0)
    model.refresh()
    assert not torch.equal(phi, model.phi)


def test_batch_equals_one_by_one():
    rng = np.random.default_rng(1)
    emb = clustered(rng, 100, 8)
    model = ISORetriever(CorpusGraph.from_knn(emb, 3), m=3, L=10)
    q = clustered(rng, 7, 8)
    out = model(q, 4)
    for b in range(7):
        one = model(q[b : b + 1], 4)
        assert torch.equal(one.indices[0], out.indices[b])
        torch.testing.assert_close(one.scores[0], out.scores[b])


def test_isolated_nodes_self_loops_and_no_edges():
    rng = np.random.default_rng(2)
    emb = clustered(rng, 30, 6)
    ei = torch.tensor([[0, 1, 2, 3, 3], [1, 2, 0, 3, 3]])  # a triangle, a self loop, 26 isolated nodes
    model = ISORetriever(CorpusGraph.from_edge_index(emb, ei), m=2, L=5, max_nodes=10)
    out = model(emb[:4], 3)
    assert torch.isfinite(out.scores).all() and (out.indices >= 0).all()
    empty = ISORetriever(CorpusGraph.from_edge_index(emb, torch.zeros(2, 0, dtype=torch.long)), m=2, L=5)
    res = empty(emb[:3], 5)  # no edge at all: PageRank is the personalization, scores finite
    assert torch.isfinite(res.scores).all()
    assert res.indices[:, 0].tolist() == [0, 1, 2]  # each passage retrieves itself first


def test_large_m_and_L_clamp_and_bad_k():
    rng = np.random.default_rng(3)
    emb = clustered(rng, 12, 6)
    model = ISORetriever(CorpusGraph.from_knn(emb, 2), m=50, L=100, max_nodes=200)
    out = model(emb[:2], 12)
    assert sorted(out.indices[0].tolist()) == list(range(12))
    with pytest.raises(ValueError, match="exceeds"):
        model(emb[:2], 13)
    with pytest.raises(ValueError, match="D=6"):
        model(torch.randn(2, 5), 3)
    with pytest.raises(ValueError, match="NaN"):
        model(torch.full((1, 6), float("nan")), 3)
    with pytest.raises(ValueError, match="max_nodes"):
        ISORetriever(CorpusGraph.from_knn(emb, 2), m=5, max_nodes=3)


def test_projection_reaching_the_boundary_is_an_error():
    class Rim(torch.nn.Module):
        c = 1.0

        def forward(self, h):
            return torch.nn.functional.normalize(h, dim=-1)  # |z| = 1: on the boundary

    emb = clustered(np.random.default_rng(4), 20, 5)
    with pytest.raises(ValueError, match="strictly inside"):
        ISORetriever(CorpusGraph.from_knn(emb, 2), projection=Rim())
