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

from geograph.functional import ollivier_ricci, ricci_flow


def fixture_batch():
    ds, adjs = [], []
    for seed in range(3):
        d = load_fixture(f"grc_0.6.1_seed{seed}.json")
        ds.append(d)
        adjs.append(dense_adj(d["graph_construction"]["edge_list"], 21))
    return ds, torch.stack(adjs)


def test_exact_flow_matches_fixtures_batched():
    ds, adj = fixture_batch()
    out = ricci_flow(adj, torch.ones(adj.shape, dtype=torch.float64), solver="exact")
    for b, d in enumerate(ds):
        for (u, v), w in edge_dict(d["flowed_weights"]).items():
            assert abs(float(out.lengths[b, u, v]) - w) <= 1e-6
        for (u, v), k in edge_dict(d["flowed_ricci_curvature"]).items():
            assert abs(float(out.curvature[b, u, v]) - k) <= 1e-6
        kept = (torch.nonzero(out.lengths[b, 0, 1:] <= 1.0).squeeze(1) + 1).tolist()
        assert kept == d["kept_chunks_weight_le_1"]
        assert int(out.iterations[b]) == d["flow_iterations_logged"]
        assert bool(out.converged[b]) == d["flow_converged_early"]
    # normalised: mean edge length 1 on every graph
    for b in range(3):
        torch.testing.assert_close(out.lengths[b][adj[b]].mean(), torch.tensor(1.0, dtype=torch.float64))


def test_exact_flow_matches_weighted_denominator_case():
    d, adj, lengths = denominator_case()
    out = ricci_flow(adj[None], lengths[None], solver="exact", iterations=5)
    err = max(abs(float(out.lengths[0, u, v]) - w) for (u, v), w in edge_dict(d["flowed_weights_iter5"]).items())
    assert err <= 1e-6


def test_frozen_graph_in_a_batch_is_unchanged():
    """A graph that converges stops; the others keep flowing (per-graph early stop)."""
    tri = dense_adj([(0, 1), (1, 2), (0, 2)], 6)  # constant curvature: converges at once
    rng = np.random.default_rng(3)
    other = random_adjacency(rng, 1, 6)[0]
    adj = torch.stack([tri, other])
    out = ricci_flow(adj, torch.ones(2, 6, 6, dtype=torch.float64), solver="exact", iterations=8)
    assert int(out.iterations[0]) == 1 and bool(out.converged[0])
    torch.testing.assert_close(out.lengths[0][tri], torch.ones(6, dtype=torch.float64))
    alone = ricci_flow(other[None], torch.ones(1, 6, 6, dtype=torch.float64), solver="exact", iterations=8)
    torch.testing.assert_close(out.lengths[1], alone.lengths[0], atol=1e-12, rtol=0)
    assert int(out.iterations[1]) == int(alone.iterations[0])


def test_no_early_stop_gives_same_result():
    ds, adj = fixture_batch()
    ones = torch.ones(adj.shape, dtype=torch.float64)
    a = ricci_flow(adj, ones, solver="exact", iterations=4)
    b = ricci_flow(adj, ones, solver="exact", iterations=4, early_stop=False)
    torch.testing.assert_close(a.lengths, b.lengths)


@pytest.mark.slow
def test_sinkhorn_flow_close_to_exact_on_real_graphs():
    adj = real_adjacency(8)
    ones = torch.ones(adj.shape, dtype=torch.float64)
    exact = ricci_flow(adj, ones, solver="exact", iterations=5)
    approx = ricci_flow(adj, ones.float(), solver="sinkhorn", iterations=5)
    assert torch.isfinite(approx.lengths).all()
    agree = ((approx.lengths[:, 0, 1:] <= 1) == (exact.lengths[:, 0, 1:] <= 1)).float().mean()
    assert agree >= 0.95
    assert (approx.lengths.double() - exact.lengths)[adj].abs().max() <= 0.1


def test_default_lengths_and_bad_input():
    adj = dense_adj([(0, 1), (1, 2)], 3)[None]
    out = ricci_flow(adj, solver="exact", iterations=2)
    assert out.lengths.dtype == torch.float32 and torch.isfinite(out.lengths).all()
    with pytest.raises(ValueError, match="iterations"):
        ricci_flow(adj, iterations=0)
    with pytest.raises(ValueError, match="delta"):
        ricci_flow(adj, delta=-1.0)
    with pytest.raises(ValueError, match="adj"):
        ricci_flow(adj[0])


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_single_edge_and_empty_graph_match_the_reference(alpha):
    """One edge (0, 1): m_0 = (alpha, 1 - alpha) on (0, 1), m_1 mirrored, so W1 = |2 alpha - 1| and
    kappa = 1 - |2 alpha - 1|. One step leaves |2 alpha - 1|, rescaled to mean length 1: back to 1,
    except at alpha = 0.5 where it is 0 and stays 0 (then d < 1e-7 gives kappa 0). One edge has
    curvature spread 0: it stops after one step. The empty graph does not flow. Also checked
    against the numpy + POT flow of ricci_reference, with a two-component graph alongside."""
    pytest.importorskip("ot")
    from ricci_reference import ref_flow

    adj = torch.zeros(3, 5, 5, dtype=torch.bool)
    adj[0, 0, 1] = adj[0, 1, 0] = True  # one edge, nodes 2..4 isolated
    adj[2] = dense_adj([(0, 1), (2, 3), (3, 4), (2, 4)], 5)  # an edge and a triangle: both flow
    out = ricci_flow(adj, torch.ones(3, 5, 5, dtype=torch.float64), alpha=alpha, solver="exact")
    w01, k01 = (0.0, 0.0) if alpha == 0.5 else (1.0, 1.0 - abs(2 * alpha - 1))
    assert float(out.lengths[0, 0, 1]) == pytest.approx(w01, abs=1e-12)
    assert float(out.curvature[0, 0, 1]) == pytest.approx(k01, abs=1e-12)
    assert (out.lengths[1] == 0).all() and (out.curvature[1] == 0).all()
    assert out.iterations.tolist()[:2] == [1, 0] and out.converged.tolist()[:2] == [True, False]
    for b in range(3):
        w, kappa, steps, converged = ref_flow(adj[b].numpy(), alpha=alpha)
        np.testing.assert_allclose(out.lengths[b].numpy(), w, atol=1e-9, rtol=0)
        np.testing.assert_allclose(out.curvature[b].numpy(), kappa, atol=1e-9, rtol=0)
        assert (int(out.iterations[b]), bool(out.converged[b])) == (steps, converged)


@pytest.mark.slow
def test_live_graphriccicurvature_flow_parity():
    """Flowed lengths and curvature vs compute_ricci_flow on real and random graphs."""
    pytest.importorskip("GraphRicciCurvature")
    from geograph.methods.ricci.bench import ricci_reference

    rng = np.random.default_rng(11)
    adj = torch.cat([real_adjacency(4), random_adjacency(rng, 4, 21)[:, :21, :21]])
    out = ricci_flow(adj, torch.ones(adj.shape, dtype=torch.float64), solver="exact")
    for b in range(adj.shape[0]):
        curv, lengths = ricci_reference(edges_of(adj[b]), 21, iterations=20)
        assert max(abs(float(out.lengths[b, u, v]) - w) for (u, v), w in lengths.items()) <= 1e-6
        assert max(abs(float(out.curvature[b, u, v]) - k) for (u, v), k in curv.items()) <= 1e-6


def test_graphriccicurvature_in_process_equals_its_forked_pool():
    """The reference's passes run in a thread (geograph.methods.ricci.bench): the same flow, bit for
    bit, as GraphRicciCurvature's own forked pool (its memoised helpers cleared between passes)."""
    pytest.importorskip("GraphRicciCurvature")
    import networkx as nx
    from GraphRicciCurvature.OllivierRicci import OllivierRicci

    from geograph.methods.ricci.bench import ricci_reference

    rng = np.random.default_rng(5)
    edges = [(u, v) for u in range(12) for v in range(u + 1, 12) if rng.random() < 0.4]
    weights = {e: float(rng.uniform(0.5, 1.5)) for e in edges}
    curv, lengths = ricci_reference(edges, 12, weights=weights, iterations=4)
    g = nx.Graph()
    g.add_nodes_from(range(12))
    g.add_weighted_edges_from((u, v, weights[(u, v)]) for u, v in edges)
    forked = OllivierRicci(g, method="OTD", proc=1, verbose="ERROR").compute_ricci_flow(iterations=4)
    assert curv == {(min(u, v), max(u, v)): float(d["ricciCurvature"]) for u, v, d in forked.edges(data=True)}
    assert lengths == {(min(u, v), max(u, v)): float(d["weight"]) for u, v, d in forked.edges(data=True)}


class _HostReads:
    """Counts host reads (item, tolist, bool/int/float of a tensor) while active."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.NAMES:
            orig = getattr(torch.Tensor, name)

            def counted(t, *args, _orig=orig, **kw):
                self.count += 1
                return _orig(t, *args, **kw)

            monkeypatch.setattr(torch.Tensor, name, counted)


def test_sinkhorn_flow_has_no_host_read_per_step_or_iteration(monkeypatch):
    adj = real_adjacency(3)
    ones = torch.ones(adj.shape)
    counts = {}
    for steps, warm in [(1, 5), (4, 5), (4, 40)]:
        reads = _HostReads(monkeypatch)
        ricci_flow(
            adj, ones, solver="sinkhorn", iterations=steps, max_iter=20, warm_iter=warm, cert_tol=None, early_stop=False
        )
        counts[(steps, warm)] = reads.count
        monkeypatch.undo()
    assert len(set(counts.values())) == 1, counts  # independent of flow steps and Sinkhorn iterations


def test_flow_dtype_follows_input_and_step_is_validated():
    ds, adj = fixture_batch()
    for solver in ("exact", "sinkhorn"):
        for dtype in (torch.float32, torch.float64):
            out = ricci_flow(
                adj[:1], torch.ones(1, 21, 21, dtype=dtype), solver=solver, iterations=2, max_iter=50, warm_iter=20
            )
            assert out.lengths.dtype == dtype and out.curvature.dtype == dtype
    for step in (0.0, -0.5, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="step"):
            ricci_flow(adj, step=step)
    with pytest.raises(ValueError, match="cert_tol"):
        ricci_flow(adj, cert_tol=float("nan"))
    with pytest.raises(ValueError, match="delta"):
        ricci_flow(adj, delta=float("nan"))


def test_compiled_flow_equals_the_torch_loop():
    """The one-call numba flow vs the torch loop over steps with per-step compiled curvature."""
    from geograph.transport.curvature import validate_graph
    from geograph.transport.flow import _torch_flow
    from geograph.transport.solvers import SinkhornOptions

    rng = np.random.default_rng(5)
    adj = torch.cat([real_adjacency(3), random_adjacency(rng, 3, 21)])
    w, adj_v, mask = validate_graph(torch.ones(adj.shape, dtype=torch.float64), adj, None)
    fast = ricci_flow(adj, torch.ones(adj.shape, dtype=torch.float64), solver="exact")
    loop = _torch_flow(
        w,
        adj_v,
        mask,
        iterations=20,
        step=1.0,
        delta=1e-4,
        alpha=0.5,
        exp_power=2.0,
        solver="exact",
        sinkhorn=SinkhornOptions(reg=0.01, max_iter=10, relaxation=1.0, cert_tol=None),
        warm_iter=10,
        early_stop=True,
        check_every=1,
    )
    torch.testing.assert_close(fast.lengths, loop.lengths, atol=1e-10, rtol=0)  # summation order differs
    torch.testing.assert_close(fast.curvature, loop.curvature, atol=1e-10, rtol=0)
    assert torch.equal(fast.iterations, loop.iterations)


@pytest.mark.parametrize("step", [1.0, 0.35])
def test_torch_and_compiled_flow_steps_are_the_same_update(step):
    """The flow's update is written twice (the torch loop's ``flow._flow_step`` on dense batches, the
    compiled ``_numba.ricci._flow_step`` on one graph's edge list): both equal numpy's
    ``w - step * kappa * w`` rescaled to mean edge length 1, on the same random graphs and curvatures."""
    from geograph.transport._numba.ricci import _flow_step as compiled_step
    from geograph.transport.flow import _flow_step as torch_step

    rng = np.random.default_rng(21)
    adj = torch.cat([real_adjacency(2), random_adjacency(rng, 4, 21)])
    adj[-1, 12:, :] = adj[-1, :, 12:] = False  # a padded graph: its last nodes have no edge
    a = adj.numpy()
    w = rng.uniform(0.2, 3.0, a.shape)
    w = np.where(a, (w + w.transpose(0, 2, 1)) / 2, 0.0)
    kappa = rng.uniform(-1.0, 1.0, a.shape)
    kappa = np.where(a, (kappa + kappa.transpose(0, 2, 1)) / 2, 0.0)
    # numpy, from the raw arrays
    ref = np.where(a, w - step * kappa * w, 0.0)
    ref *= (np.triu(a, 1).sum((1, 2)) / np.triu(ref, 1).sum((1, 2)))[:, None, None]
    wt, kt = torch.from_numpy(w), torch.from_numpy(kappa)
    n_edges = torch.triu(adj, 1).sum((1, 2)).to(torch.float64)
    got_torch = torch_step(wt, kt, adj, n_edges, step, torch.zeros((), dtype=torch.float64)).numpy()
    got_numba = np.empty_like(w)
    for g in range(len(a)):
        ex, ey = np.nonzero(np.triu(a[g], 1))
        wg = w[g].copy()
        compiled_step(wg, kappa[g, ex, ey].copy(), 0, len(ex), ex.astype(np.int64), ey.astype(np.int64), step)
        got_numba[g] = wg
    assert not np.allclose(ref, w)  # the step moved the lengths: the comparison is not vacuous
    # the sums run in different orders (torch: both triangles, numba: the edge list): a few ulps apart
    np.testing.assert_allclose(got_torch, ref, rtol=1e-14, atol=0)
    np.testing.assert_allclose(got_numba, ref, rtol=1e-14, atol=0)
    np.testing.assert_allclose(got_numba, got_torch, rtol=1e-14, atol=0)
    assert np.array_equal(got_numba == 0, ~a) and np.array_equal(got_torch == 0, ~a)


@pytest.mark.parametrize("steps", [1, 4])
def test_certified_sinkhorn_curvature_within_its_bound(steps):
    """The curvature returned at the last step is within the reported bound of the exact one."""
    adj = real_adjacency(6)
    out = ricci_flow(
        adj, torch.ones(adj.shape, dtype=torch.float64), solver="sinkhorn", iterations=steps, early_stop=False
    )
    exact = ollivier_ricci(out.lengths, adj, solver="exact")
    err = (exact - out.curvature)[adj].abs().max()
    assert err <= float(out.bound.max()) + 1e-9 and float(out.bound.max()) <= 1e-3 + 1e-12
    assert out.resolved.shape == (steps + 1,) and (out.work > 0).all()


def test_warm_started_simplex_equals_cold_solves():
    """Each edge's simplex starts from its previous optimal basis (completed where the supports
    changed, repaired by dual steps where the new masses make it infeasible): the flow equals
    the one with every problem solved cold, and the warm path is the one taken."""
    from geograph.transport._numba.ricci import flow_batch
    from geograph.transport.solvers import _MAX_PIVOTS

    rng = np.random.default_rng(11)
    adj = torch.cat([real_adjacency(4), random_adjacency(rng, 4, 21), torch.zeros(2, 21, 21, dtype=torch.bool)])
    adj[-2:, :9, :9] = random_adjacency(rng, 2, 9, p_range=(0.6, 0.9))  # padded graphs
    lengths = rng.uniform(0.3, 2.0, adj.shape)
    lengths = np.where(adj.numpy(), (lengths + lengths.transpose(0, 2, 1)) / 2, 0.0)
    mask = adj.any(2).numpy()
    opts = dict(alpha=0.5, exp_power=2.0, iterations=20, step=1.0, delta=1e-4, max_pivots=_MAX_PIVOTS)
    warm = flow_batch(lengths, adj.numpy(), mask, warm_start=True, **opts)
    cold = flow_batch(lengths, adj.numpy(), mask, warm_start=False, **opts)
    np.testing.assert_allclose(warm.lengths, cold.lengths, atol=1e-10, rtol=0)
    # kappa * d = d - W1 (the solver's error is on W1; kappa divides it by d, and the flow shrinks
    # some random-graph edges to ~2e-7, where kappa differs by 3e-8 between solve orders)
    np.testing.assert_allclose(warm.curvature * warm.lengths, cold.curvature * cold.lengths, atol=1e-12, rtol=0)
    np.testing.assert_array_equal(warm.steps, cold.steps)
    edges_per_step = int(np.triu(adj.numpy(), 1).sum())
    st = warm.stats
    assert st.warm_started >= st.problems - edges_per_step - st.problems // 50  # every step after the first, nearly
    assert st.dual_steps > 0 and st.pivots < cold.stats.pivots / 3
    assert cold.stats.warm_started == 0 and cold.stats.dual_steps == 0
    assert cold.stats.problems == st.problems


def test_exact_flow_stats_are_the_flows_and_thread_independent():
    """The public statistics count the same flow as ricci_flow runs, and do not depend on how the
    problems are split over numba's threads (each problem's pivots depend only on its own edge)."""
    from geograph.functional import SimplexStats, exact_flow_stats
    from geograph.transport._numba.ricci import flow_batch
    from geograph.transport.solvers import _MAX_PIVOTS

    rng = np.random.default_rng(3)
    adj = torch.cat([real_adjacency(3), random_adjacency(rng, 3, 21)])
    lengths = torch.ones(adj.shape, dtype=torch.float64)
    warm = exact_flow_stats(adj, lengths)
    cold = exact_flow_stats(adj, lengths, warm_start=False)
    assert isinstance(warm, SimplexStats) and warm.problems == cold.problems > 0
    assert 0 < warm.warm_started <= warm.problems and cold.warm_started == 0
    assert warm.pivots < cold.pivots
    # one graph at a time, and one chunk: the sums are the same
    opts = dict(alpha=0.5, exp_power=2.0, iterations=20, step=1.0, delta=1e-4, max_pivots=_MAX_PIVOTS)
    a, m = adj.numpy(), adj.any(2).numpy()
    per_graph = [
        flow_batch(lengths.numpy()[g : g + 1], a[g : g + 1], m[g : g + 1], **opts).stats for g in range(len(adj))
    ]
    assert sum(s.pivots for s in per_graph) == warm.pivots
    assert sum(s.problems for s in per_graph) == warm.problems
    assert flow_batch(lengths.numpy(), a, m, nchunk=1, **opts).stats == warm
    # the flow it counts is ricci_flow's: the same steps
    out = ricci_flow(adj, lengths, solver="exact")
    np.testing.assert_array_equal(flow_batch(lengths.numpy(), a, m, **opts).steps, out.iterations.numpy())
    with pytest.raises(ValueError, match="step"):
        exact_flow_stats(adj, lengths, step=2.0)
