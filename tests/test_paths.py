import numpy as np
import pytest
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra, shortest_path

from geograph.functional import shortest_paths, single_source_shortest_paths


def random_graphs(seed, count=50, max_n=14):
    """Padded batch of random weighted digraphs: sparse, dense, disconnected, zero lengths."""
    rng = np.random.default_rng(seed)
    n_max = max_n
    lengths = np.zeros((count, n_max, n_max))
    adj = np.zeros((count, n_max, n_max), dtype=bool)
    mask = np.zeros((count, n_max), dtype=bool)
    for b in range(count):
        n = int(rng.integers(1, n_max + 1))
        p = rng.choice([0.05, 0.15, 0.4, 0.9])
        a = rng.random((n, n)) < p
        np.fill_diagonal(a, False)
        w = rng.random((n, n)) * rng.choice([1.0, 10.0])
        w[rng.random((n, n)) < 0.05] = 0.0  # zero-length edges exist
        if b % 2:  # undirected half
            a = a | a.T
            w = np.triu(w) + np.triu(w, 1).T
        lengths[b, :n, :n] = np.where(a, w, 0.0)
        adj[b, :n, :n] = a
        mask[b, :n] = True
        # junk in padding must not leak
        lengths[b, n:, :] = rng.random((n_max - n, n_max))
        adj[b, n:, :] = True
    return lengths, adj, mask


def scipy_apsp(lengths, adj, n):
    w = lengths[:n, :n].copy()
    a = adj[:n, :n]
    # scipy drops explicit zeros from a dense matrix; keep zero-length edges with a sparse one
    rows, cols = np.nonzero(a)
    g = csr_matrix((w[rows, cols], (rows, cols)), shape=(n, n))
    return shortest_path(g, method="D", directed=True)


@pytest.mark.parametrize("seed", range(5))
def test_apsp_matches_scipy(seed, device):
    lengths, adj, mask = random_graphs(seed)
    ours = (
        shortest_paths(
            torch.from_numpy(lengths).to(device), torch.from_numpy(adj).to(device), torch.from_numpy(mask).to(device)
        )
        .cpu()
        .numpy()
    )
    for b in range(lengths.shape[0]):
        n = int(mask[b].sum())
        ref = scipy_apsp(lengths[b], adj[b], n)
        assert np.array_equal(np.isinf(ours[b, :n, :n]), np.isinf(ref))
        fin = np.isfinite(ref)
        assert np.abs(ours[b, :n, :n][fin] - ref[fin]).max(initial=0.0) <= 1e-6
        assert np.isinf(ours[b, n:, :]).all() and np.isinf(ours[b, :, n:]).all()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("early_stop", [False, True])
def test_sssp_matches_dijkstra(seed, early_stop, device):
    lengths, adj, mask = random_graphs(100 + seed)
    rng = np.random.default_rng(seed)
    source = np.array([rng.integers(0, max(int(m.sum()), 1)) for m in mask])
    ours = (
        single_source_shortest_paths(
            torch.from_numpy(lengths).to(device),
            torch.from_numpy(adj).to(device),
            torch.from_numpy(source).to(device),
            torch.from_numpy(mask).to(device),
            early_stop=early_stop,
        )
        .cpu()
        .numpy()
    )
    for b in range(lengths.shape[0]):
        n = int(mask[b].sum())
        rows, cols = np.nonzero(adj[b, :n, :n])
        g = csr_matrix((lengths[b, :n, :n][rows, cols], (rows, cols)), shape=(n, n))
        ref = dijkstra(g, directed=True, indices=int(source[b]))
        assert np.array_equal(np.isinf(ours[b, :n]), np.isinf(ref))
        fin = np.isfinite(ref)
        assert np.abs(ours[b, :n][fin] - ref[fin]).max(initial=0.0) <= 1e-6
        assert np.isinf(ours[b, n:]).all()


def test_sssp_equals_apsp_row(dtype, tol):
    lengths, adj, mask = random_graphs(7, count=20)
    lt = torch.from_numpy(lengths).to(dtype)
    at, mt = torch.from_numpy(adj), torch.from_numpy(mask)
    src = torch.zeros(20, dtype=torch.long)
    d_all = shortest_paths(lt, at, mt)
    d_one = single_source_shortest_paths(lt, at, src, mt)
    torch.testing.assert_close(d_one, d_all[:, 0, :], **tol)
    assert d_one.dtype == dtype


def test_batched_equals_loop():
    lengths, adj, mask = random_graphs(3, count=10)
    lt, at, mt = map(torch.from_numpy, (lengths, adj, mask))
    full = shortest_paths(lt, at, mt)
    for b in range(10):
        n = int(mask[b].sum())
        one = shortest_paths(lt[b : b + 1, :n, :n], at[b : b + 1, :n, :n])
        torch.testing.assert_close(full[b : b + 1, :n, :n], one)


def test_adj_none_uses_finite_entries():
    w = torch.tensor([[[0.0, 2.0, float("inf")], [2.0, 0.0, 1.0], [float("inf"), 1.0, 0.0]]])
    d = shortest_paths(w)
    assert d[0, 0, 2] == 3.0


def test_max_iter_limits_hops():
    # path 0-1-2-3 with unit lengths: one relaxation reaches only node 1
    w = torch.zeros(1, 4, 4)
    for i in range(3):
        w[0, i, i + 1] = w[0, i + 1, i] = 1.0
    d = single_source_shortest_paths(w, w > 0, torch.tensor([0]), max_iter=1)
    assert d[0].tolist() == [0.0, 1.0, float("inf"), float("inf")]


def test_exceptions():
    w = torch.rand(2, 3, 3)
    with pytest.raises(ValueError, match="lengths must have 3 dimensions"):
        shortest_paths(torch.rand(3, 3))
    with pytest.raises(ValueError, match="square"):
        shortest_paths(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="adj must have shape"):
        shortest_paths(w, torch.ones(2, 3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="non-negative"):
        shortest_paths(-w, torch.ones(2, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="source must"):
        single_source_shortest_paths(w, w > 0, torch.tensor([0]))
    with pytest.raises(ValueError, match="source must index"):
        single_source_shortest_paths(w, w > 0, torch.tensor([0, 3]))


def test_all_padding_row_is_inf():
    w = torch.rand(2, 3, 3)
    mask = torch.tensor([[True, True, True], [False, False, False]])
    d = shortest_paths(w, w > 0, mask)
    assert torch.isinf(d[1]).all() and torch.isfinite(d[0]).all()
    s = single_source_shortest_paths(w, w > 0, torch.tensor([0, 0]), mask)
    assert torch.isinf(s[1]).all() and not torch.isnan(s).any()
