import numpy as np
import pytest
import torch

from geograph.transport.solvers import sinkhorn

ot = pytest.importorskip("ot")

# |sinkhorn - emd| bound per reg on unit-scale costs (entropic bias shrinks with reg)
EMD_TOL = {0.5: 0.3, 0.1: 0.06, 0.03: 0.01}


def problems(seed, count=70, n=9, m=8):
    rng = np.random.default_rng(seed)
    c = rng.random((count, n, m))
    a, b = rng.random((count, n)), rng.random((count, m))
    na, nb = rng.integers(1, n + 1, count), rng.integers(1, m + 1, count)
    a[np.arange(n)[None] >= na[:, None]] = 0  # padding
    b[np.arange(m)[None] >= nb[:, None]] = 0
    a[rng.random(a.shape) < 0.1] = 0  # zero masses inside the support too
    a[:, 0] += 1e-3
    b[:, 0] += 1e-3
    return c, a / a.sum(1, keepdims=True), b / b.sum(1, keepdims=True)


@pytest.mark.parametrize("reg", [0.5, 0.1, 0.03])
def test_matches_pot(reg):
    c, a, b = problems(int(reg * 100))
    out = sinkhorn(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b), reg=reg, max_iter=3000)
    assert not torch.isnan(out.plan).any()
    for i in range(c.shape[0]):
        sa, sb = a[i] > 0, b[i] > 0
        sub = c[i][np.ix_(sa, sb)]
        ref = float(ot.sinkhorn2(a[i][sa], b[i][sb], sub, reg, method="sinkhorn_log", numItermax=100000, stopThr=1e-13))
        assert abs(out.cost[i].item() - ref) <= 1e-6
        assert abs(out.cost[i].item() - float(ot.emd2(a[i][sa], b[i][sb], sub))) <= EMD_TOL[reg]
        plan = out.plan[i].numpy()
        assert (plan[~sa] == 0).all() and (plan[:, ~sb] == 0).all()
        np.testing.assert_allclose(plan.sum(0), b[i], atol=1e-6)


def test_batched_equals_loop_and_float32():
    c, a, b = problems(5, count=6)
    ct, at, bt = map(torch.from_numpy, (c, a, b))
    full = sinkhorn(ct, at, bt, reg=0.1, max_iter=500)
    for i in range(6):
        one = sinkhorn(ct[i : i + 1], at[i : i + 1], bt[i : i + 1], reg=0.1, max_iter=500)
        torch.testing.assert_close(full.cost[i : i + 1], one.cost)
    f32 = sinkhorn(ct.float(), at.float(), bt.float(), reg=0.1, max_iter=500)
    torch.testing.assert_close(f32.cost.double(), full.cost, atol=1e-5, rtol=0)


def test_tolerance_and_warm_start():
    c, a, b = problems(6, count=10)
    ct, at, bt = map(torch.from_numpy, (c, a, b))
    ref = sinkhorn(ct, at, bt, reg=0.1, max_iter=2000)
    early = sinkhorn(ct, at, bt, reg=0.1, max_iter=2000, tol=1e-12)
    torch.testing.assert_close(early.cost, ref.cost, atol=1e-9, rtol=0)
    warm = sinkhorn(ct, at, bt, reg=0.1, max_iter=50, scaling_iter=0, f_init=ref.f, g_init=ref.g)
    torch.testing.assert_close(warm.cost, ref.cost, atol=1e-9, rtol=0)


def test_empty_problem_is_zero():
    c = torch.rand(2, 3, 3, dtype=torch.float64)
    a = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    out = sinkhorn(c, a, b, reg=0.05)
    assert out.cost[0] == 0 and (out.plan[0] == 0).all()
    torch.testing.assert_close(out.cost[1], 0.5 * (c[1, 0, 1] + c[1, 1, 1]), atol=1e-6, rtol=0)


def test_gradcheck():
    c = torch.rand(1, 3, 3, dtype=torch.float64, requires_grad=True)
    a = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    b = torch.tensor([[0.4, 0.6, 0.0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: sinkhorn(x, a, b, reg=0.5, max_iter=50).cost, (c,))


def test_exception():
    c = torch.rand(2, 3, 4)
    with pytest.raises(ValueError, match="a must have shape"):
        sinkhorn(c, torch.rand(2, 4), torch.rand(2, 4), reg=0.1)
    with pytest.raises(ValueError, match="reg must be positive"):
        sinkhorn(c, torch.rand(2, 3), torch.rand(2, 4), reg=0.0)
    with pytest.raises(ValueError, match="non-negative"):
        sinkhorn(c, -torch.rand(2, 3), torch.rand(2, 4), reg=0.1)
    with pytest.raises(ValueError, match="cost .* NaN"):
        sinkhorn(torch.full((1, 2, 2), float("nan")), torch.rand(1, 2), torch.rand(1, 2), reg=0.1)


# ---- exact solver (compiled transportation simplex) vs POT -----------------------------

from geograph.transport.solvers import emd, emd_numpy, transport_bounds  # noqa: E402


def exact_problems(seed, count=200, n=10, m=20):
    """Ties (integer costs), zero-mass rows/cols, single rows/cols, duplicated rows, padding."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 4, (count, n, m)).astype(np.float64)
    c[count // 2 :] = rng.random((count - count // 2, n, m))
    c[::7, 1] = c[::7, 0]  # duplicated rows: degenerate
    a, b = rng.random((count, n)), rng.random((count, m))
    a[rng.random(a.shape) < 0.3] = 0
    b[rng.random(b.shape) < 0.3] = 0
    a[::5, 1:] = 0  # single row
    b[::6, 1:] = 0  # single column
    a[:, 0] += 1e-3
    b[:, 0] += 1e-3
    a[::11] = np.round(a[::11], 1) + 0.1  # equal masses: degenerate bases
    return c, a / a.sum(1, keepdims=True), b / b.sum(1, keepdims=True)


def pot_emd(c, a, b):
    sa, sb = a > 0, b > 0
    return float(ot.emd2(a[sa], b[sb], np.ascontiguousarray(c[np.ix_(sa, sb)]), numItermax=10**7))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_emd_matches_pot(seed):
    c, a, b = exact_problems(seed)
    ours = emd(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b))
    ref = np.array([pot_emd(c[i], a[i], b[i]) for i in range(len(c))])
    assert np.abs(ours.numpy() - ref).max() <= 1e-9


def test_emd_blands_rule_and_shapes():
    """Bland's rule from the first pivot (the anti-cycling path) is exact too; 1 x m, n x 1."""
    c, a, b = exact_problems(3, count=60, n=7, m=9)
    ref = np.array([pot_emd(c[i], a[i], b[i]) for i in range(len(c))])
    assert np.abs(emd_numpy(c, a, b, max_pivots=0) - ref).max() <= 1e-9
    one = emd(torch.tensor([[[1.0, 2.0, 3.0]]]), torch.tensor([[1.0]]), torch.tensor([[0.2, 0.3, 0.5]]))
    assert one.dtype == torch.float32 and abs(float(one[0]) - 2.3) < 1e-6
    col = emd(
        torch.tensor([[[1.0], [3.0]]], dtype=torch.float64),
        torch.tensor([[0.5, 0.5]], dtype=torch.float64),
        torch.tensor([[1.0]], dtype=torch.float64),
    )
    assert float(col[0]) == 2.0


def test_emd_zero_mass_and_bad_input():
    c = torch.rand(3, 4, 5, dtype=torch.float64)
    a = torch.tensor([[0.0] * 4, [0.5, 0.5, 0, 0], [0.25] * 4], dtype=torch.float64)
    b = torch.tensor([[0.2] * 5, [0.0] * 5, [0.2] * 5], dtype=torch.float64)
    out = emd(c, a, b)
    assert out[0] == 0 and out[1] == 0
    assert abs(float(out[2]) - pot_emd(c[2].numpy(), a[2].numpy(), b[2].numpy())) <= 1e-12
    with pytest.raises(ValueError, match="b must be non-negative"):
        emd(c, a, -b)
    with pytest.raises(ValueError, match="a must have shape"):
        emd(c, a[:, :3], b)
    with pytest.raises(ValueError, match="cost .* NaN"):
        emd(torch.full((1, 2, 2), float("nan")), torch.ones(1, 2) / 2, torch.ones(1, 2) / 2)


def test_emd_on_real_graph_measures():
    """Full lazy measures of real query graphs, cost = scipy shortest paths: W1 vs POT."""
    sp = pytest.importorskip("scipy.sparse.csgraph")
    from ricci_helpers import real_adjacency

    adj = real_adjacency(6).numpy()
    costs, aa, bb = [], [], []
    for g in range(adj.shape[0]):
        dist = sp.shortest_path(adj[g].astype(float), unweighted=True)
        m = np.where(adj[g], 0.5 / adj[g].sum(1, keepdims=True), 0.0) + 0.5 * np.eye(adj.shape[1])
        for x, y in zip(*np.nonzero(np.triu(adj[g], 1))):
            costs.append(dist)
            aa.append(m[x])
            bb.append(m[y])
    c, a, b = map(np.stack, (costs, aa, bb))
    ours = emd(torch.from_numpy(c), torch.from_numpy(a), torch.from_numpy(b)).numpy()
    ref = np.array([ot.emd2(a[i], b[i], c[i]) for i in range(len(c))])
    assert len(c) > 500 and np.abs(ours - ref).max() <= 1e-9


def test_transport_bounds_bracket_exact_and_catch_a_bad_plan():
    c, a, b = problems(8, count=40)
    ct, at, bt = map(torch.from_numpy, (c, a, b))
    ref = np.array([pot_emd(c[i], a[i], b[i]) for i in range(len(c))])
    sk = sinkhorn(ct, at, bt, reg=0.01, max_iter=2000)
    bd = transport_bounds(ct, at, bt, sk.f, sk.plan)
    assert (bd.lower.numpy() <= ref + 1e-12).all() and (bd.upper.numpy() >= ref - 1e-12).all()
    assert (bd.upper - bd.lower).max() <= 0.05  # near optimal solution: tight
    # the rounded plan is feasible
    torch.testing.assert_close(bd.plan.sum(2), at, atol=1e-12, rtol=0)
    torch.testing.assert_close(bd.plan.sum(1), bt, atol=1e-12, rtol=0)
    # a corrupted solution still gives valid bounds, and its gap flags it
    bad_f = sk.f + torch.from_numpy(np.random.default_rng(0).normal(0, 0.3, sk.f.shape))
    bad_plan = sk.plan.flip(1)
    bad = transport_bounds(ct, at, bt, bad_f, bad_plan)
    assert (bad.lower.numpy() <= ref + 1e-12).all() and (bad.upper.numpy() >= ref - 1e-12).all()
    gap = (bad.upper - bad.lower).numpy()
    mid = 0.5 * (bad.upper + bad.lower).numpy()
    assert (np.abs(mid - ref) <= gap / 2 + 1e-12).all()  # the certified error bound holds
    assert (gap > 0.05).mean() >= 0.6  # and flags most corrupted problems for a re-solve


def test_sinkhorn_options_are_one_object_with_the_defaults_of_every_caller(monkeypatch):
    """The curvature and the flow take the Sinkhorn options as keywords and hand one checked
    SinkhornOptions down; its defaults are theirs and Ricci-Filtration's."""
    from geograph import registry
    from geograph.functional import SinkhornOptions, ollivier_ricci, ricci_flow
    from geograph.rerankers import RicciFiltration
    from geograph.transport import curvature, flow

    default = SinkhornOptions()
    model = RicciFiltration()
    assert (model.reg, model.cert_tol) == (default.reg, default.cert_tol)
    assert registry.get("ricci").defaults()["reg"] == default.reg
    seen = []
    solve = curvature.ollivier_ricci_solve

    def spy(*args, **kwargs):
        seen.append(kwargs["sinkhorn"])
        return solve(*args, **kwargs)

    monkeypatch.setattr(curvature, "ollivier_ricci_solve", spy)
    monkeypatch.setattr(flow, "ollivier_ricci_solve", spy)
    adj = torch.ones(1, 4, 4, dtype=torch.bool) & ~torch.eye(4, dtype=torch.bool)
    ollivier_ricci(torch.ones(1, 4, 4), adj, solver="sinkhorn")
    ollivier_ricci(torch.ones(1, 4, 4), adj, solver="sinkhorn", reg=0.05, max_iter=50)
    ricci_flow(adj, solver="sinkhorn", iterations=1, relaxation=1.5, cert_tol=None, warm_iter=7)
    assert seen[0] == default and seen[1] == SinkhornOptions(reg=0.05, max_iter=50)
    assert seen[2] == SinkhornOptions(relaxation=1.5, cert_tol=None)
    assert seen[3] == SinkhornOptions(relaxation=1.5, cert_tol=None, max_iter=7, reg_start=default.reg, scaling_iter=0)
    for bad, message in (({"reg": 0.0}, "reg must be positive"), ({"cert_tol": -1.0}, "cert_tol must be None")):
        with pytest.raises(ValueError, match=message):
            ollivier_ricci(torch.ones(1, 4, 4), adj, **bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cpu_log_sum_exp_is_torchs_where_exp_would_be_subnormal(dtype):
    """The Sinkhorn updates' log-sum-exp clamps shifted entries whose exponential would be
    subnormal (slow on CPUs): the result is ``torch.logsumexp``'s within a few ulps, on rows
    spanning hundreds (a small ``reg``), rows with ``-inf`` entries, and rows of one entry."""
    from geograph.transport.solvers import _logsumexp

    g = torch.Generator().manual_seed(0)
    x = -torch.rand(64, 9, 21, generator=g, dtype=torch.float64).to(dtype) * 2000 + 30
    x[:, :, 1::3] = float("-inf")  # masked columns
    x[:, 0, 1:] = float("-inf")  # a row of one finite entry
    want = torch.logsumexp(x, dim=-1)
    got = _logsumexp(x)
    assert torch.isfinite(got).all()
    ulp = torch.finfo(dtype).eps * want.abs().clamp_min(1.0)
    assert ((got - want).abs() <= 4 * ulp).all()
    # differentiable: the gradient is the softmax, as torch's
    y = x.clone().requires_grad_(True)
    _logsumexp(y).sum().backward()
    assert torch.allclose(y.grad, torch.softmax(x, dim=-1), atol=10 * torch.finfo(dtype).eps)
