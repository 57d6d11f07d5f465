import numpy as np
import pytest
import torch

from geograph import CorpusGraph, PoincareProjection
from geograph.projection import IdentityPoincare, conformal_volume


def unit(rng, v, d):
    x = rng.standard_normal((v, d))
    return torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True)).float()


def edge_set(g):
    return {tuple(e) for e in g.edge_index.T.tolist()}


def test_knn_matches_bruteforce_and_chunking(device):
    rng = np.random.default_rng(0)
    emb = unit(rng, 57, 12)
    g = CorpusGraph.from_knn(emb.to(device), 4, chunk_size=10).cpu()
    sim = emb @ emb.T
    sim.fill_diagonal_(-np.inf)
    nn = sim.topk(4, dim=1).indices
    expect = {(i, int(j)) for i in range(57) for j in nn[i]}
    expect |= {(j, i) for i, j in expect}
    assert edge_set(g) == expect
    assert edge_set(CorpusGraph.from_knn(emb, 4, chunk_size=1000)) == expect
    assert (g.degree() >= 4).all() and g.num_edges == len(expect) // 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_knn_ties_match_a_numpy_reference(dtype):
    """Exact ties everywhere (unit vectors with dyadic coordinates: every cosine is exact in any
    summation order), ranked by numpy's lexsort on (-cosine, index): the documented rule, lowest
    index first, computed without torch."""
    atoms = np.array(
        [[1, 0, 0, 0], [0, 1, 0, 0], [0.5, 0.5, 0.5, 0.5], [0.5, -0.5, 0.5, -0.5], [0, 0, 0.6, 0.8], [-1, 0, 0, 0]]
    )
    rng = np.random.default_rng(11)
    x = atoms[rng.integers(0, len(atoms), 40)]
    k = 5
    sim = x @ x.T
    expect = set()
    for i in range(len(x)):
        others = np.array([j for j in range(len(x)) if j != i])
        order = np.lexsort((others, -sim[i, others]))  # primary: cosine descending, then index
        expect |= {(i, int(j)) for j in others[order[:k]]}
    expect |= {(j, i) for i, j in expect}
    for chunk in (7, 1000):
        assert edge_set(CorpusGraph.from_knn(torch.from_numpy(x).to(dtype), k, chunk_size=chunk)) == expect


def test_knn_faiss_same_neighbours():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(1)
    emb = unit(rng, 40, 8)
    assert edge_set(CorpusGraph.from_knn(emb, 3, faiss=True)) == edge_set(CorpusGraph.from_knn(emb, 3))


def test_knn_small_corpus_and_duplicates():
    emb = torch.ones(3, 4)  # all duplicates
    g = CorpusGraph.from_knn(emb, 10)
    assert g.num_edges == 3  # k clamps to V - 1; no self loops
    assert CorpusGraph.from_knn(torch.ones(1, 4), 2).num_edges == 0


def test_groups_and_edge_index_builders():
    emb = torch.randn(6, 3)
    g = CorpusGraph.from_groups(emb, [[0, 1, 2], [2, 3], [4], []])
    assert edge_set(g) == {(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1), (2, 3), (3, 2)}
    assert g.degree().tolist() == [2, 2, 3, 1, 0, 0]
    with pytest.raises(ValueError, match="outside"):
        CorpusGraph.from_groups(emb, [[0, 9]])
    h = CorpusGraph.from_edge_index(emb, torch.tensor([[0, 0, 3, 5], [1, 0, 2, 5]]))  # self loops dropped
    assert edge_set(h) == {(0, 1), (1, 0), (2, 3), (3, 2)}
    with pytest.raises(ValueError, match="outside"):
        CorpusGraph.from_edge_index(emb, torch.tensor([[0], [6]]))
    with pytest.raises(ValueError, match="NaN"):
        CorpusGraph.from_edge_index(emb * float("nan"), torch.tensor([[0], [1]]))


def test_csr_is_consistent():
    rng = np.random.default_rng(2)
    g = CorpusGraph.from_knn(unit(rng, 30, 5), 3)
    for u in range(30):
        row = g.col[g.rowptr[u] : g.rowptr[u + 1]].tolist()
        assert row == sorted(v for a, v in edge_set(g) if a == u)


def test_mentions_matcher():
    titles = ["Paris", "Eiffel Tower", "Tower", "Lyon", "Ai"]
    texts = [
        "The Eiffel Tower stands in Paris.",  # -> 1 and 2 ('Tower'); 'Paris' is itself: no self loop
        "Built for the 1889 fair in paris; a tower of iron.",
        "A tower is a tall structure. Parisian style.",  # 'Parisian' is not 'Paris'
        "Lyon and Paris are French cities.",
        "Said about Lyon.",
    ]
    g = CorpusGraph.from_mentions(torch.randn(5, 3), titles, texts)
    directed = set()
    for u, v in [(0, 1), (0, 2), (1, 0), (1, 2), (3, 0), (4, 3)]:
        directed |= {(u, v), (v, u)}
    assert edge_set(g) == directed  # 'Ai' is below min_title_len; undirected union
    strict = CorpusGraph.from_mentions(torch.randn(5, 3), titles, texts, case_sensitive=True)
    assert (1, 2) not in edge_set(strict) and (0, 2) in edge_set(strict)  # 'a tower' != 'Tower'
    with pytest.raises(ValueError, match="one title and one text"):
        CorpusGraph.from_mentions(torch.randn(5, 3), titles[:2], texts)


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(3)
    g = CorpusGraph.from_knn(unit(rng, 20, 6), 2)
    g.save(tmp_path / "g")
    h = CorpusGraph.load(tmp_path / "g")
    assert torch.equal(h.embeddings, g.embeddings) and torch.equal(h.edge_index, g.edge_index) and h.name == g.name
    with pytest.raises(ValueError, match="not a saved CorpusGraph"):
        CorpusGraph.load(tmp_path)


def test_poincare_projection_inside_ball_and_matches_geoopt(tmp_path):
    import geoopt

    torch.manual_seed(0)
    f = PoincareProjection(10, 4, hidden=8, c=0.5)
    h = torch.randn(50, 10) * torch.logspace(-3, 4, 50).unsqueeze(1)
    z = f(h)
    assert z.dtype == torch.float32 and (z.norm(dim=1) < 1 / np.sqrt(0.5)).all()
    ball = geoopt.PoincareBall(c=0.5)
    torch.testing.assert_close(z, ball.projx(ball.expmap0(f.mlp(h))))
    f.save(tmp_path / "f.pt")
    g = PoincareProjection.load(tmp_path / "f.pt")
    torch.testing.assert_close(g(h), z)
    with pytest.raises(ValueError, match="dimension 10"):
        f(torch.randn(3, 9))
    torch.save({"x": 1}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="not a saved"):
        PoincareProjection.load(tmp_path / "bad.pt")


def test_conformal_volume():
    z = torch.tensor([[0.0, 0.0], [0.6, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(conformal_volume(z, p=2.0), torch.tensor([4.0, (2 / 0.64) ** 2], dtype=torch.float64))
    with pytest.raises(ValueError, match="strictly inside"):
        conformal_volume(torch.tensor([[1.0, 0.0]]))
    unit_norm = torch.nn.functional.normalize(torch.randn(5, 3), dim=1)
    vol = conformal_volume(IdentityPoincare()(unit_norm))
    torch.testing.assert_close(vol, vol[:1].expand(5))  # the identity signal: one volume for all
