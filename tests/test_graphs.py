import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

from geograph.functional import knn_graph


def sklearn_knn(x, k):
    n = x.shape[0]
    kk = min(k, n - 1)
    a = np.zeros((n, n), dtype=bool)
    if kk == 0:
        return a
    _, idx = NearestNeighbors(n_neighbors=kk, metric="cosine", algorithm="brute").fit(x).kneighbors()
    a[np.repeat(np.arange(n), kk), idx.ravel()] = True
    return a | a.T


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 3, 5, 50])
def test_matches_sklearn_with_padding(seed, k, device):
    rng = np.random.default_rng(seed)
    b, n, d = 30, 20, 8
    x = rng.standard_normal((b, n, d))
    sizes = rng.integers(1, n + 1, size=b)
    mask = np.arange(n)[None] < sizes[:, None]
    ours = knn_graph(torch.from_numpy(x).to(device), k, torch.from_numpy(mask).to(device)).cpu().numpy()
    for i in range(b):
        m = sizes[i]
        assert np.array_equal(ours[i, :m, :m], sklearn_knn(x[i, :m], k))
        assert not ours[i, m:].any() and not ours[i, :, m:].any()


def test_symmetric_no_self_loops(dtype):
    x = torch.randn(3, 12, 4, dtype=dtype)
    a = knn_graph(x, 3)
    assert torch.equal(a, a.transpose(1, 2))
    assert not a.diagonal(dim1=1, dim2=2).any()
    assert (a.sum(-1) >= 3).all()


def test_k_clamps_to_real_nodes():
    x = torch.randn(1, 4, 3)
    assert knn_graph(x, 10).sum() == 12  # complete graph on 4 nodes
    assert not knn_graph(x[:, :1], 5).any()  # a single node has no edges


def test_exception():
    with pytest.raises(ValueError, match="k must be a positive integer"):
        knn_graph(torch.rand(1, 3, 2), 0)
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        knn_graph(torch.rand(3, 2), 1)


def test_no_nodes():
    assert knn_graph(torch.zeros(2, 0, 3), 4).shape == (2, 0, 0)
    assert knn_graph(torch.zeros(2, 0, 3), 1, torch.zeros(2, 0, dtype=torch.bool)).dtype == torch.bool
