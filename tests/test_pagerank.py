import networkx as nx
import numpy as np
import pytest
import torch

from geograph.functional import personalized_pagerank


def random_batch(rng, b, n, *, directed):
    w = rng.uniform(0.1, 2.0, (b, n, n)) * (rng.random((b, n, n)) < rng.uniform(0.05, 0.5, (b, 1, 1)))
    np.einsum("bii->bi", w)[:] = 0
    if not directed:
        w = np.triu(w, 1)
        w = w + w.transpose(0, 2, 1)
    r = rng.random((b, n)) * (rng.random((b, n)) < 0.3)
    return w, r


def nx_reference(w, r, alpha):
    n = w.shape[0]
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for i, j in zip(*np.nonzero(w)):
        g.add_edge(int(i), int(j), weight=float(w[i, j]))
    pers = {i: float(r[i]) for i in range(n)} if r.sum() > 0 else None
    out = nx.pagerank(g, alpha=alpha, personalization=pers, dangling=pers, max_iter=10000, tol=1e-13)
    return np.array([out[i] for i in range(n)])


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("directed", [False, True])
def test_matches_networkx_with_padding(seed, directed, device):
    """10 seeds x 2 kinds x 12 graphs = 240 random weighted graphs, padded batches."""
    rng = np.random.default_rng(seed)
    b, n = 12, 15
    w, r = random_batch(rng, b, n, directed=directed)
    sizes = rng.integers(1, n + 1, size=b)
    mask = np.arange(n)[None] < sizes[:, None]
    alpha = [0.85, 0.5, 0.99][seed % 3]
    w_pad = w.copy()
    w_pad[~mask] = 7.0  # padding rows/columns hold garbage
    ours = personalized_pagerank(
        torch.from_numpy(w_pad).to(device),
        torch.from_numpy(r).to(device),
        torch.from_numpy(mask).to(device),
        alpha=alpha,
        max_iter=3000,
    ).cpu()
    for i, s in enumerate(sizes):
        ref = nx_reference(w[i, :s, :s], r[i, :s], alpha)
        assert np.abs(ours[i, :s].numpy() - ref).max() <= 1e-6
        assert (ours[i, s:] == 0).all()
    real_sums = ours.sum(1)
    torch.testing.assert_close(real_sums, torch.ones(b, dtype=torch.float64))
    assert (ours >= 0).all()


def test_tolerance_stops_early_with_same_answer(dtype):
    rng = np.random.default_rng(0)
    w, r = random_batch(rng, 6, 10, directed=False)
    w, r = torch.from_numpy(w).to(dtype), torch.from_numpy(r).to(dtype)
    full = personalized_pagerank(w, r, max_iter=500)
    early = personalized_pagerank(w, r, max_iter=500, tol=1e-10)
    torch.testing.assert_close(early, full, atol=1e-6 if dtype == torch.float32 else 1e-8, rtol=0)
    assert early.dtype == dtype


def test_uniform_fallback_and_empty_graphs():
    w = torch.zeros(2, 4, 4)
    w[0, 0, 1] = w[0, 1, 0] = 1.0
    out = personalized_pagerank(w, torch.zeros(2, 4))
    torch.testing.assert_close(out[1], torch.full((4,), 0.25))  # no edges, no personalization: uniform
    assert torch.isfinite(out).all()
    none = personalized_pagerank(w, torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.bool))
    assert (none == 0).all()


def test_bad_input():
    w = torch.ones(1, 3, 3)
    with pytest.raises(ValueError, match="personalization must have shape"):
        personalized_pagerank(w, torch.ones(1, 4))
    with pytest.raises(ValueError, match="non-negative"):
        personalized_pagerank(-w, torch.ones(1, 3))
    with pytest.raises(ValueError, match="alpha"):
        personalized_pagerank(w, torch.ones(1, 3), alpha=1.0)
    with pytest.raises(ValueError, match="NaN"):
        personalized_pagerank(w * float("nan"), torch.ones(1, 3))
    with pytest.raises(ValueError, match="square"):
        personalized_pagerank(torch.ones(1, 3, 2), torch.ones(1, 3))
