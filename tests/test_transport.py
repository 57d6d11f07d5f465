import numpy as np
import pytest
import torch

from geograph.functional.transport import sinkhorn

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
