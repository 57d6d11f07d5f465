import numpy as np
import pytest
import torch
from ricci_helpers import (
    denominator_case,
    dense_adj,
    edge_dict,
    edges_of,
    load_fixture,
    random_adjacency,
    real_adjacency,
)

from geograph.functional import lazy_measures, ollivier_ricci

SEEDS = [0, 1, 2]


def fixture_graph(seed):
    d = load_fixture(f"grc_0.6.1_seed{seed}.json")
    adj = dense_adj(d["graph_construction"]["edge_list"], d["graph_construction"]["num_nodes"])
    return d, adj


def max_edge_error(kappa, ref):
    return max(abs(float(kappa[u, v]) - val) for (u, v), val in ref.items())


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_matches_fixture(seed):
    d, adj = fixture_graph(seed)
    kappa = ollivier_ricci(torch.ones(1, 21, 21, dtype=torch.float64), adj[None], solver="exact")[0]
    assert max_edge_error(kappa, edge_dict(d["ricci_curvature_initial"])) <= 1e-6
    assert torch.equal(kappa, kappa.T)
    assert (kappa[~adj] == 0).all()


def test_exact_matches_weighted_denominator_case():
    """Weights longer than a detour: GraphRicciCurvature 0.6.1 divides W1 by d(x, y)."""
    d, adj, lengths = denominator_case()
    kappa = ollivier_ricci(lengths[None], adj[None], solver="exact")[0]
    assert max_edge_error(kappa, edge_dict(d["ricci_curvature_initial"])) <= 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_sinkhorn_within_tolerance_of_fixture(seed, dtype):
    d, adj = fixture_graph(seed)
    kappa = ollivier_ricci(torch.ones(1, 21, 21, dtype=dtype), adj[None], solver="sinkhorn")[0]
    assert torch.isfinite(kappa).all() and kappa.dtype == dtype
    assert max_edge_error(kappa, edge_dict(d["ricci_curvature_initial"])) <= 5e-3


def test_sinkhorn_close_to_exact_on_real_graphs():
    adj = real_adjacency(10)
    ones = torch.ones(adj.shape, dtype=torch.float64)
    exact = ollivier_ricci(ones, adj, solver="exact")
    approx = ollivier_ricci(ones, adj, solver="sinkhorn")
    assert (exact - approx).abs().max() <= 5e-3


def test_lazy_measures_rows():
    rng = np.random.default_rng(0)
    adj = random_adjacency(rng, 4, 9)
    adj[:, 8, :] = adj[:, :, 8] = False  # an isolated real node
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[1, 6:] = False
    lengths = torch.from_numpy(rng.uniform(0.1, 2.0, (4, 9, 9)))
    lengths = (lengths + lengths.transpose(1, 2)) / 2
    m = lazy_measures(lengths, adj, mask, alpha=0.3)
    torch.testing.assert_close(m.sum(2)[mask], torch.ones(int(mask.sum()), dtype=torch.float64))
    assert (m[~mask] == 0).all()
    assert (m[mask[:, 8], 8, 8] == 1).all()  # isolated real node: all mass at home
    assert torch.allclose(m[0, 0, 0], torch.tensor(0.3, dtype=torch.float64))
    support = m > 0
    eye = torch.eye(9, dtype=torch.bool)
    adj_masked = adj & mask.unsqueeze(1) & mask.unsqueeze(2)
    assert torch.equal(support & ~eye, adj_masked & ~eye)


def test_lazy_measures_far_neighbours_fall_back_to_uniform():
    adj = dense_adj([(0, 1), (0, 2)], 3)[None]
    lengths = torch.full((1, 3, 3), 10.0, dtype=torch.float64)  # exp(-100) per neighbour
    m = lazy_measures(lengths, adj)
    torch.testing.assert_close(m[0, 0], torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))


@pytest.mark.parametrize("solver", ["exact", "sinkhorn"])
def test_batched_equals_one_by_one_with_padding(solver):
    rng = np.random.default_rng(1)
    b, n = 5, 12
    adj = random_adjacency(rng, b, n)
    sizes = [12, 7, 9, 3, 12]
    mask = torch.arange(n)[None] < torch.tensor(sizes)[:, None]
    lengths = torch.from_numpy(rng.uniform(0.5, 1.5, (b, n, n)))
    lengths = (lengths + lengths.transpose(1, 2)) / 2
    lengths[~(mask.unsqueeze(1) & mask.unsqueeze(2))] = float("nan")  # padding never read
    kappa = ollivier_ricci(lengths, adj, mask, solver=solver)
    assert torch.isfinite(kappa).all()
    for i, s in enumerate(sizes):
        one = ollivier_ricci(lengths[i : i + 1, :s, :s], adj[i : i + 1, :s, :s], solver=solver)
        torch.testing.assert_close(kappa[i, :s, :s], one[0], atol=1e-5 if solver == "sinkhorn" else 1e-12, rtol=0)
        assert (kappa[i, s:] == 0).all() and (kappa[i, :, s:] == 0).all()


def test_isolated_nodes_and_empty_graphs_are_finite():
    adj = dense_adj([(0, 1), (1, 2)], 5)[None].repeat(2, 1, 1)
    adj[1] = False  # no edge at all
    for solver in ("exact", "sinkhorn"):
        kappa = ollivier_ricci(torch.ones(2, 5, 5), adj, solver=solver)
        assert torch.isfinite(kappa).all()
        assert (kappa[0, 3:] == 0).all() and (kappa[1] == 0).all()
        assert kappa[0, 0, 1] == kappa[0, 1, 0] and kappa[0, 0, 1] != 0


def test_zero_length_edges_get_zero_curvature():
    """Duplicates joined by a zero-length edge: d(x, y) < 1e-7, so kappa = 0 (the GRC rule)."""
    adj = dense_adj([(0, 1), (1, 2), (0, 2), (2, 3)], 4)[None]
    lengths = torch.ones(1, 4, 4, dtype=torch.float64)
    lengths[0, 0, 1] = lengths[0, 1, 0] = 0.0
    for solver in ("exact", "sinkhorn"):
        kappa = ollivier_ricci(lengths, adj, solver=solver)
        assert torch.isfinite(kappa).all()
        assert kappa[0, 0, 1] == 0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda L, A: (L, A[..., :3]), "adj must have shape"),
        (
            lambda L, A: (
                L,
                A.clone().index_put_((torch.tensor([0]), torch.tensor([0]), torch.tensor([1])), torch.tensor(False)),
            ),
            "symmetric",
        ),
        (lambda L, A: (-L, A), "non-negative"),
        (lambda L, A: (L.masked_fill(A, float("nan")), A), "finite"),
        (lambda L, A: (L[0], A), "3 dimensions"),
    ],
)
def test_bad_input(change, message):
    adj = dense_adj([(0, 1), (1, 2), (0, 2)], 4)[None]
    lengths, adj = change(torch.ones(1, 4, 4), adj)
    with pytest.raises(ValueError, match=message):
        ollivier_ricci(lengths, adj, solver="exact")


def test_bad_options():
    adj = dense_adj([(0, 1)], 2)[None]
    with pytest.raises(ValueError, match="solver"):
        ollivier_ricci(torch.ones(1, 2, 2), adj, solver="emd")
    with pytest.raises(ValueError, match="reg"):
        ollivier_ricci(torch.ones(1, 2, 2), adj, reg=0.0)
    with pytest.raises(ValueError, match="alpha"):
        ollivier_ricci(torch.ones(1, 2, 2), adj, alpha=1.5)


@pytest.mark.slow
def test_live_graphriccicurvature_parity():
    """>= 50 graphs: 24 real SciFact query graphs and 30 random weighted ones, all edges."""
    pytest.importorskip("GraphRicciCurvature")
    from geograph.methods.ricci.bench import ricci_reference

    rng = np.random.default_rng(7)
    real = real_adjacency()
    rand = random_adjacency(rng, 30, 15)
    worst = 0.0
    for adj, weighted in [(real, False), (rand, True)]:
        n = adj.shape[1]
        lengths = torch.ones(adj.shape, dtype=torch.float64)
        if weighted:
            w = torch.from_numpy(rng.uniform(0.2, 2.0, adj.shape))
            lengths = torch.triu(w, 1) + torch.triu(w, 1).transpose(1, 2)
        kappa = ollivier_ricci(lengths, adj, solver="exact")
        for b in range(adj.shape[0]):
            edges = edges_of(adj[b])
            weights = {e: float(lengths[b, e[0], e[1]]) for e in edges}
            ref, _ = ricci_reference(edges, n, weights=weights)
            worst = max(worst, max_edge_error(kappa[b], ref))
    assert worst <= 1e-6
