from pathlib import Path

import numpy as np
import pytest
import torch

from geograph import Maniscope, RerankOutput
from geograph.functional import maniscope_scores
from geograph.methods.maniscope.bench import maniscope_reference

FIXTURE = Path(__file__).parent / "data" / "scifact_candidates.npz"


def check_against_reference(query, docs, mask, out, k, alpha):
    for b in range(query.shape[0]):
        n = int(mask[b].sum())
        scores, geo, order = maniscope_reference(query[b], docs[b, :n], k=k, alpha=alpha)
        ours = out.scores[b].double().cpu().numpy()
        assert np.abs(ours[:n] - scores).max() <= 1e-6
        assert np.isneginf(ours[n:]).all()
        assert np.array_equal(out.order[b, :n].cpu().numpy(), order)
        assert np.array_equal(out.order[b, n:].cpu().numpy(), np.arange(n, docs.shape[1]))
        g = out.geodesic[b, :n].cpu().numpy()
        assert np.array_equal(np.isinf(g), np.isinf(geo))
        assert np.abs(g[np.isfinite(geo)] - geo[np.isfinite(geo)]).max(initial=0) <= 1e-6


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k,alpha", [(5, 0.3), (3, 0.5), (10, 0.0)])
def test_matches_reference_random(seed, k, alpha, device):
    rng = np.random.default_rng(seed)
    b, n, d = 12, 40, 16
    query = rng.standard_normal((b, d))
    # clustered candidates, so the k-NN graph is often disconnected
    centers = rng.standard_normal((b, 4, d)) * 3
    docs = centers[np.arange(b)[:, None], rng.integers(0, 4, (b, n))] + rng.standard_normal((b, n, d))
    sizes = rng.integers(1, n + 1, size=b)
    mask = np.arange(n)[None] < sizes[:, None]
    out = Maniscope(k=k, alpha=alpha)(
        torch.from_numpy(query).to(device), torch.from_numpy(docs).to(device), torch.from_numpy(mask).to(device)
    )
    check_against_reference(query, docs, mask, out, k, alpha)


@pytest.mark.skipif(not FIXTURE.exists(), reason="real-embedding fixture missing")
def test_matches_reference_real_embeddings():
    """SciFact test queries with their dense top-100 MiniLM candidates (see tests/data/README.md)."""
    z = np.load(FIXTURE)
    query, docs = z["query"].astype(np.float64), z["docs"].astype(np.float64)
    mask = np.ones(docs.shape[:2], dtype=bool)
    mask[::3, 60:] = False  # some short candidate lists too
    out = Maniscope()(torch.from_numpy(query), torch.from_numpy(docs), torch.from_numpy(mask))
    check_against_reference(query, docs, mask, out, 5, 0.3)


def test_float32_close_to_float64():
    g = torch.Generator().manual_seed(0)
    q, docs = torch.randn(8, 32, generator=g), torch.randn(8, 50, 32, generator=g)
    a = Maniscope()(q, docs)
    b = Maniscope()(q.double(), docs.double())
    torch.testing.assert_close(a.scores.double(), b.scores, atol=1e-5, rtol=0)


def test_batched_equals_loop_and_padding_invariance():
    g = torch.Generator().manual_seed(2)
    q, docs = (
        torch.randn(5, 16, generator=g, dtype=torch.float64),
        torch.randn(5, 30, 16, generator=g, dtype=torch.float64),
    )
    sizes = [30, 7, 1, 18, 2]
    mask = torch.arange(30)[None] < torch.tensor(sizes)[:, None]
    junk = docs.clone()
    junk[~mask] = 1e3  # garbage in padding does not matter
    out = Maniscope()(q, junk, mask)
    for b, n in enumerate(sizes):
        one = Maniscope()(q[b : b + 1], docs[b : b + 1, :n])
        torch.testing.assert_close(out.scores[b, :n], one.scores[0])
        assert torch.equal(out.order[b, :n], one.order[0])
    assert torch.equal(out.keep, mask)


def test_module_equals_functional_and_early_stop():
    g = torch.Generator().manual_seed(3)
    q, docs = torch.randn(4, 8, generator=g), torch.randn(4, 25, 8, generator=g)
    out = Maniscope(k=4, alpha=0.6)(q, docs)
    scores, geo = maniscope_scores(q, docs, k=4, alpha=0.6, early_stop=False)
    assert isinstance(out, RerankOutput)
    torch.testing.assert_close(out.scores, scores)
    torch.testing.assert_close(out.geodesic, geo)


def test_single_candidate_and_all_padding():
    q = torch.randn(2, 4)
    docs = torch.randn(2, 1, 4)
    out = Maniscope()(q, docs, torch.tensor([[True], [False]]))
    cos = torch.nn.functional.cosine_similarity(q[0], docs[0, 0], dim=0)
    torch.testing.assert_close(out.scores[0, 0], 0.3 * cos + 0.7)
    assert torch.isneginf(out.scores[1]).all() and not out.keep[1].any()
    assert not torch.isnan(out.scores).any()


def test_duplicate_candidates_keep_their_edge():
    q = torch.tensor([[1.0, 0.0]])
    docs = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    out = Maniscope(k=1)(q, docs)
    assert out.geodesic[0, 1] < 1e-6


def test_exception():
    q, docs = torch.randn(2, 4), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        Maniscope(k=0)
    with pytest.raises(ValueError, match="alpha must lie in"):
        Maniscope(alpha=1.5)
    with pytest.raises(ValueError, match="query must have 2 dimensions"):
        Maniscope()(docs, docs)
    with pytest.raises(ValueError, match="docs must have shape"):
        Maniscope()(q, torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="docs must have shape"):
        Maniscope()(q, torch.randn(3, 5, 4))
    bad = docs.clone()
    bad[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="docs .* NaN or inf"):
        Maniscope()(q, bad)
    with pytest.raises(ValueError, match="query .* NaN or inf"):
        Maniscope()(torch.full((2, 4), float("inf")), docs)
    with pytest.raises(ValueError, match="mask must have shape"):
        Maniscope()(q, docs, torch.ones(2, 4, dtype=torch.bool))


def test_dynamo():
    q, docs = torch.randn(3, 8), torch.randn(3, 12, 8)
    model = Maniscope(early_stop=False)
    compiled = torch.compile(model, backend="eager", fullgraph=False)
    torch.testing.assert_close(compiled(q, docs).scores, model(q, docs).scores)


def test_no_candidates():
    """N = 0: empty (B, 0) results, no error."""
    out = Maniscope()(torch.randn(3, 4), torch.zeros(3, 0, 4), torch.zeros(3, 0, dtype=torch.bool))
    assert out.scores.shape == out.order.shape == out.keep.shape == out.geodesic.shape == (3, 0)
    assert out.scores.dtype == torch.float32
