"""Dtype follows the input: float32 and float64 for every module and kernel this file covers,
float32 results close to float64 ones; and NaN/inf hyperparameters rejected at construction."""

import math

import numpy as np
import pytest
import torch

from geograph import CorpusGraph, DenseRetriever, G3Graph, G3Retriever, ISORetriever, Maniscope, PoincareProjection
from geograph.functional import (
    cosine_similarity,
    gain_density,
    gain_transition,
    isoperimetric_ratio,
    knn_graph,
    maniscope_scores,
    personalized_pagerank,
)

ATOL32 = 1e-5


def data(seed=0, n=80, d=8):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(5, d, generator=g, dtype=torch.float64)
    x = centers[torch.randint(5, (n,), generator=g)] + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    q = x[torch.randint(n, (6,), generator=g)] + 0.3 * torch.randn(6, d, generator=g, dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=1), q


def both(fn):
    """``fn(dtype)`` in float64 and float32, with the float32 result's dtypes checked."""
    return fn(torch.float64), fn(torch.float32)


def test_maniscope(device):
    x, q = data(1)
    docs = x[:60].view(6, 10, 8)
    mask = torch.ones(6, 10, dtype=torch.bool)
    mask[2, 7:] = False
    out64, out32 = both(lambda dt: Maniscope(k=3)(q.to(device, dt), docs.to(device, dt), mask.to(device)))
    for name in ("scores", "geodesic"):
        a, b = getattr(out64, name), getattr(out32, name)
        assert a.dtype == torch.float64 and b.dtype == torch.float32
        torch.testing.assert_close(b.double(), a, atol=ATOL32, rtol=0)
    s64, s32 = both(lambda dt: maniscope_scores(q.to(device, dt), docs.to(device, dt), k=3)[0])
    assert s32.dtype == torch.float32 and s64.dtype == torch.float64


def test_dense(device):
    x, q = data(2)
    for corpus_dt in (torch.float32, torch.float64):
        model = DenseRetriever(x.to(corpus_dt)).to(device)
        out64, out32 = both(lambda dt, model=model: model(q.to(device, dt), 5))
        assert out64.scores.dtype == torch.float64 and out32.scores.dtype == torch.float32
        assert torch.equal(out64.indices, out32.indices)
        torch.testing.assert_close(out32.scores.double(), out64.scores, atol=ATOL32, rtol=0)


def test_iso(device):
    x, q = data(3)
    g64 = ISORetriever(CorpusGraph.from_knn(x, 4), m=3, L=10).to(device)
    g32 = ISORetriever(CorpusGraph.from_knn(x.float(), 4), m=3, L=10).to(device)
    assert g64.graph.embeddings.dtype == torch.float64 and g64.phi.dtype == torch.float64
    assert g32.phi.dtype == torch.float32
    torch.testing.assert_close(g32.phi.double(), g64.phi, atol=ATOL32, rtol=0)
    a, b = g64(q.to(device), 5), g32(q.float().to(device), 5)
    assert a.scores.dtype == torch.float64 and b.scores.dtype == torch.float32
    assert torch.equal(a.indices, b.indices)
    torch.testing.assert_close(b.scores.double(), a.scores, atol=ATOL32, rtol=0)
    # a float32 query on the float64 module: computed in float64, returned in float32
    c = g64(q.float().to(device), 5)
    assert c.scores.dtype == torch.float32 and torch.equal(c.indices, a.indices)


def test_g3(device):
    x, q = data(4)
    graphs = {dt: G3Graph.build(x.to(dt), max_degree=12) for dt in (torch.float64, torch.float32)}
    assert graphs[torch.float64].val.dtype == torch.float64 and graphs[torch.float64].density.dtype == torch.float64
    assert graphs[torch.float32].val.dtype == torch.float32
    torch.testing.assert_close(
        graphs[torch.float32].transition.to_dense().double(),
        graphs[torch.float64].transition.to_dense(),
        atol=ATOL32,
        rtol=0,
    )
    a = G3Retriever(graphs[torch.float64]).to(device)(q.to(device), 5)
    b = G3Retriever(graphs[torch.float32]).to(device)(q.float().to(device), 5)
    assert a.scores.dtype == torch.float64 and b.scores.dtype == torch.float32
    assert torch.equal(a.indices, b.indices)
    torch.testing.assert_close(b.scores.double(), a.scores, atol=ATOL32, rtol=0)


def test_corpus_graph_keeps_float64():
    x, _ = data(5)
    g64, g32 = CorpusGraph.from_knn(x, 5), CorpusGraph.from_knn(x.float(), 5)
    assert g64.embeddings.dtype == torch.float64 and g32.embeddings.dtype == torch.float32
    assert torch.equal(g64.edge_index, g32.edge_index)  # clustered data: no near-ties at the cut
    # float64 resolves a neighbour that float32 cannot: passage 2 is 1e-12 nearer to 0 in cosine
    # than passage 1; 3 and 4 sit next to 1 and 2 so that only 0's own choice links 0
    a, d = 1e-3, 1e-9
    angles = [0.0, a + d, -a, a + d + 1e-4, -a - 1e-4]
    e = torch.tensor([[math.cos(t), math.sin(t)] for t in angles], dtype=torch.float64)
    en = e.numpy() / np.linalg.norm(e.numpy(), axis=1, keepdims=True)
    sim = en @ en.T
    np.fill_diagonal(sim, -np.inf)
    nearest = np.argsort(-sim, axis=1, kind="stable")[:, 0]
    expect = {(i, int(j)) for i, j in enumerate(nearest)} | {(int(j), i) for i, j in enumerate(nearest)}
    assert nearest[0] == 2
    assert {tuple(p) for p in CorpusGraph.from_knn(e, 1).edge_index.T.tolist()} == expect


def test_kernels(device):
    x, q = data(6)
    docs = x[:48].view(4, 12, 8)
    c64, c32 = both(lambda dt: cosine_similarity(docs.to(device, dt)))
    assert c32.dtype == torch.float32 and c64.dtype == torch.float64
    torch.testing.assert_close(c32.double(), c64, atol=ATOL32, rtol=0)
    a64, a32 = both(lambda dt: knn_graph(docs.to(device, dt), 3))
    assert torch.equal(a64, a32)
    w = (c64.clamp_min(0) * (c64 > 0.3)).to(device)
    r = torch.rand(4, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    p64, p32 = both(lambda dt: personalized_pagerank(w.to(dt), r.to(dt)))
    assert p32.dtype == torch.float32 and p64.dtype == torch.float64
    torch.testing.assert_close(p32.double(), p64, atol=ATOL32, rtol=0)
    d64, d32 = both(lambda dt: gain_density(x.to(device, dt)))
    assert d32.dtype == torch.float32 and d64.dtype == torch.float64
    t64, t32 = both(lambda dt: gain_transition(x.to(device, dt), max_degree=10))
    assert t32.dtype == torch.float32 and t64.dtype == torch.float64


def test_isoperimetric_eps_from_dtype():
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    vol = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    for dt in (torch.float32, torch.float64):
        phi = isoperimetric_ratio(ei, vol.to(dt), 4)
        assert phi.dtype == dt
        # path 0-1-2-3: shell/ball by hand, plus the dtype's eps in the denominator
        ball = np.array([3.0, 6.0, 9.0, 7.0])
        shell = np.array([3.0, 4.0, 1.0, 2.0])
        ref = shell / (ball + torch.finfo(dt).eps)
        np.testing.assert_allclose(phi.double().numpy(), ref, rtol=torch.finfo(dt).eps * 4, atol=0)
    zero = isoperimetric_ratio(ei, torch.zeros(4, dtype=torch.float64), 4)
    assert torch.equal(zero, torch.zeros(4, dtype=torch.float64))  # 0 / eps, not NaN


def test_poincare_projection_double():
    f = PoincareProjection(8, 3, hidden=4)
    h = torch.randn(5, 8)
    z32, z64 = f(h), f.double()(h.double())
    assert z32.dtype == torch.float32 and z64.dtype == torch.float64
    torch.testing.assert_close(z32.double(), z64, atol=ATOL32, rtol=0)


BAD = [float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
def test_nonfinite_hyperparameters_rejected(bad):
    x, _ = data(7)
    graph = CorpusGraph.from_knn(x, 3)
    for name in ("beta", "p", "tau", "alpha", "lambda_g", "lambda_d"):
        with pytest.raises(ValueError, match=rf"^{name} must"):
            ISORetriever(graph, **{name: bad})
    for kwargs, name in [({"beta": bad}, "beta"), ({"band": (0.1, bad)}, "band"), ({"band": (bad, 0.5)}, "band")]:
        with pytest.raises(ValueError, match=rf"^{name} must"):
            G3Retriever(x, **kwargs)
        with pytest.raises(ValueError, match=rf"^{name} must"):
            G3Graph.build(x, **kwargs)
    with pytest.raises(ValueError, match="^beta must"):
        gain_transition(x, beta=bad)
    with pytest.raises(ValueError, match="^alpha must"):
        Maniscope(alpha=bad)
    with pytest.raises(ValueError, match="^alpha must"):
        personalized_pagerank(torch.ones(1, 2, 2), torch.ones(1, 2), alpha=bad)
    with pytest.raises(ValueError, match="^tol must"):
        personalized_pagerank(torch.ones(1, 2, 2), torch.ones(1, 2), tol=bad)
    for name in ("m", "L", "max_nodes", "max_iter"):
        with pytest.raises(ValueError, match=rf"^{name} must"):
            ISORetriever(graph, **{name: bad})
    with pytest.raises(ValueError, match="^candidates must"):
        G3Retriever(x, candidates=bad)
    with pytest.raises(ValueError, match="^eps must"):
        isoperimetric_ratio(torch.tensor([[0], [1]]), torch.ones(2), 2, eps=bad)


# -- one tie rule: equal weights at G3's max_degree cut keep the lowest column, like numpy's stable sort


def test_g3_degree_cut_ties_keep_the_lowest_index():
    from geograph.methods.g3.bench import g3_dense_reference

    # +-1 / 0 entries with norm 1 or 2: every cosine (0, +-0.5, 1), density and weight is computed
    # exactly, so duplicated passages tie exactly; every passage appears ~9 times
    h = 0.5
    base = np.array(
        [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [h, h, h, h], [h, h, -h, -h], [h, -h, h, -h]],
        dtype=np.float64,
    )
    x = base[np.random.default_rng(8).integers(0, 7, 60)]
    ref, _ = g3_dense_reference(x, (0.1, 0.7), 0.4, 4)
    ours = gain_transition(torch.from_numpy(x), band=(0.1, 0.7), beta=0.4, max_degree=4, block=7)
    np.testing.assert_allclose(ours.to_dense().numpy(), ref, atol=1e-12, rtol=0)
