import networkx as nx
import numpy as np
import pytest
import torch

from geograph.functional import compatible_edges, isoperimetric_ratio


def reference_phi(g, vol, eps):
    phi = np.zeros(g.number_of_nodes())
    for u in g.nodes:
        dist = nx.single_source_shortest_path_length(g, u, cutoff=2)
        ball = [w for w, d in dist.items() if d <= 1]
        shell = [w for w, d in dist.items() if d == 2]
        phi[u] = sum(vol[w] for w in shell) / (sum(vol[w] for w in ball) + eps)
    return phi


def random_graph(rng, n):
    kind = rng.integers(0, 3)
    if kind == 0:
        g = nx.gnp_random_graph(n, rng.uniform(0.02, 0.3), seed=int(rng.integers(1 << 30)))
    elif kind == 1:
        g = nx.barabasi_albert_graph(n, int(rng.integers(1, 4)), seed=int(rng.integers(1 << 30)))  # hubs
    else:
        g = nx.star_graph(n - 1)
        g.add_edges_from((int(a), int(b)) for a, b in rng.integers(0, n, (n // 3, 2)) if a != b)
    g.add_nodes_from(range(n + 3))  # isolated nodes
    return g


@pytest.mark.parametrize("seed", range(60))
def test_matches_networkx_sets(seed, device):
    rng = np.random.default_rng(seed)
    g = random_graph(rng, int(rng.integers(5, 60)))
    n = g.number_of_nodes()
    vol = rng.uniform(0.5, 3.0, n)
    edges = np.array(list(g.edges), dtype=np.int64).reshape(-1, 2).T
    # duplicates, reversed copies and self loops must not change anything
    noisy = np.concatenate([edges, edges[::-1], np.array([[0, 1], [0, 1]])], 1) if edges.size else edges
    ours = isoperimetric_ratio(torch.from_numpy(noisy).to(device), torch.from_numpy(vol).to(device), n, eps=1e-8).cpu()
    np.testing.assert_allclose(ours.numpy(), reference_phi(g, vol, 1e-8), rtol=1e-12, atol=0)
    assert (ours[-3:] == 0).all()  # isolated: empty shell


def test_compatible_edges_rule():
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    phi = torch.tensor([1.0, 0.5, 0.1, 0.0, 0.0])
    assert compatible_edges(ei, phi, beta=0.4).tolist() == [True, False, False, True]
    assert compatible_edges(ei, phi, beta=0.0).all()
    with pytest.raises(ValueError, match="beta"):
        compatible_edges(ei, phi, beta=1.5)


def test_bad_input():
    with pytest.raises(ValueError, match="edge_index"):
        isoperimetric_ratio(torch.zeros(3, 2, dtype=torch.long), torch.ones(3), 3)
    with pytest.raises(ValueError, match="outside"):
        isoperimetric_ratio(torch.tensor([[0], [5]]), torch.ones(3), 3)
    with pytest.raises(ValueError, match="volume"):
        isoperimetric_ratio(torch.tensor([[0], [1]]), torch.ones(4), 3)
    with pytest.raises(ValueError, match="non-negative"):
        isoperimetric_ratio(torch.tensor([[0], [1]]), -torch.ones(3), 3)
