"""The compiled simplex's own contract: its documented workspace, its statistics, determinism."""

import re

import numpy as np
import pytest
import torch
from ricci_helpers import random_adjacency, real_adjacency

from geograph.transport._numba import ricci as R
from geograph.transport._numba import simplex as S
from geograph.transport.solvers import _MAX_PIVOTS, pot_emd


@pytest.mark.parametrize("n", [2, 7, 21])
def test_workspace_matches_the_documented_layout(n):
    """Every field of the table at the top of the module, with the documented shape and dtype."""
    doc = S.__doc__
    table = doc[doc.index("Workspace layout") : doc.index("Solver statistics")]
    rows = re.findall(r"^(\w+)\s+(\([^)]*\))\s+(f8|i8)\s", table, re.M)
    assert [r[0] for r in rows] == list(S.Workspace._fields)
    ws = S._workspace(n)
    for name, shape, dtype in rows:
        want = eval(shape.replace("2 n", "2 * n"), {"n": n, "n2": (n // 2) * ((n + 1) // 2)})
        got = getattr(ws, name)
        assert got.shape == want and got.dtype == {"f8": np.float64, "i8": np.int64}[dtype], name
    # the matrix-minimum keys hold every cell of the largest problem the workspace takes
    assert max(r * (n - r) for r in range(n + 1)) == ws.sort_keys.shape[0]


def test_emd_batch_stats_and_chunking():
    """Costs equal POT's; the statistics count every non-empty problem and do not depend on the chunking."""
    rng = np.random.default_rng(4)
    a = rng.random((60, 5)) * (rng.random((60, 5)) < 0.7)
    b = rng.random((60, 6)) * (rng.random((60, 6)) < 0.7)
    a[:, 0] += 0.1
    b[:, 0] += 0.1
    a /= a.sum(1, keepdims=True)
    b /= b.sum(1, keepdims=True)
    cost = rng.random((60, 5, 6))
    out = S.emd_batch(a, b, cost, max_pivots=_MAX_PIVOTS)
    np.testing.assert_allclose(out.cost, [pot_emd(a[e], b[e], cost[e]) for e in range(60)], atol=1e-12, rtol=0)
    assert not out.status.any()
    assert out.stats.problems == 60 and out.stats.pivots > 0 and out.stats.warm_started == out.stats.dual_steps == 0
    one = S.emd_batch(a, b, cost, max_pivots=_MAX_PIVOTS, nchunk=1)
    assert np.array_equal(one.cost, out.cost) and one.stats == out.stats
    per_problem = [
        S.emd_batch(a[e : e + 1], b[e : e + 1], cost[e : e + 1], max_pivots=_MAX_PIVOTS).stats.pivots for e in range(60)
    ]
    assert sum(per_problem) == out.stats.pivots


@pytest.mark.slow
def test_curvature_batch_stats_and_the_forced_bland_path():
    """Curvature is the same under Dantzig's rule and with Bland's from the first pivot (max_pivots=0)."""
    rng = np.random.default_rng(8)
    adj = torch.cat([real_adjacency(2), random_adjacency(rng, 2, 21)]).numpy()
    mask = adj.any(2)
    w = rng.uniform(0.5, 1.5, adj.shape)
    w = np.where(adj, (w + w.transpose(0, 2, 1)) / 2, 0.0)
    edges = np.argwhere(np.triu(adj, 1)).astype(np.int64)
    dantzig = R.curvature_batch(w, adj, mask, edges, alpha=0.5, exp_power=2.0, max_pivots=_MAX_PIVOTS)
    bland = R.curvature_batch(w, adj, mask, edges, alpha=0.5, exp_power=2.0, max_pivots=0)
    np.testing.assert_allclose(bland.curvature, dantzig.curvature, atol=1e-12, rtol=0)
    assert not dantzig.status.any() and not bland.status.any()
    assert 0 < dantzig.stats.problems <= len(edges) and dantzig.stats.problems == bland.stats.problems
    assert dantzig.stats.warm_started == 0  # no store: every problem starts cold
