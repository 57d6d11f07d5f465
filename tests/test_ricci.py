import numpy as np
import pytest
import torch
from ricci_helpers import load_fixture, scifact_graphs, seed_embeddings

from geograph import CrossEncoderScorer, RerankOutput, RicciFiltration
from geograph.ops.adjacency import masked_percentile, query_graph


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_graphriccicurvature_fixture_end_to_end(seed):
    d = load_fixture(f"grc_0.6.1_seed{seed}.json")
    x = seed_embeddings(seed)
    adj, node_mask, tau = query_graph(x[:1], x[None, 1:])
    assert float(tau[0]) == pytest.approx(d["graph_construction"]["threshold_value"], abs=1e-12)
    edges = sorted(map(tuple, torch.triu(adj[0], 1).nonzero().tolist()))
    assert edges == sorted(map(tuple, d["graph_construction"]["edge_list"]))
    out = RicciFiltration()(x[:1], x[None, 1:])
    assert isinstance(out, RerankOutput)
    kept = (out.keep[0].nonzero().squeeze(1) + 1).tolist()
    assert kept == d["kept_chunks_weight_le_1"]
    ref = torch.tensor([d["flowed_query_edge_weights"][str(j)] for j in range(1, 21)], dtype=torch.float64)
    assert (out.query_edge_length[0] - ref).abs().max() <= 1e-6
    k_ref = torch.tensor([d["flowed_ricci_curvature"][f"0-{j}"] for j in range(1, 21)], dtype=torch.float64)
    assert (out.query_edge_curvature[0] - k_ref).abs().max() <= 1e-6


@pytest.mark.parametrize("q", [0.0, 12.5, 37.3, 50.0, 99.0, 100.0])
def test_percentile_matches_numpy(q):
    rng = np.random.default_rng(int(q * 10))
    values = torch.from_numpy(rng.standard_normal((6, 9, 9)).round(1))  # ties included
    valid = torch.from_numpy(rng.random((6, 9, 9)) < 0.6)
    valid[0] = False
    valid[0, 2, 3] = True  # a single value
    ours = masked_percentile(values, valid, q)
    for b in range(6):
        assert float(ours[b]) == np.percentile(values[b][valid[b]].numpy(), q)


def test_batched_equals_one_by_one_and_padding_is_ignored():
    q, docs = scifact_graphs(6, 20)
    sizes = [20, 12, 17, 5, 2, 20]
    mask = torch.arange(20)[None] < torch.tensor(sizes)[:, None]
    docs = docs.clone()
    docs[~mask] = float("nan")  # padding is never read
    out = RicciFiltration()(q, docs, mask)
    for i, s in enumerate(sizes):
        one = RicciFiltration()(q[i : i + 1], docs[i : i + 1, :s])
        assert torch.equal(out.keep[i, :s], one.keep[0])
        torch.testing.assert_close(out.query_edge_length[i, :s], one.query_edge_length[0], atol=1e-12, rtol=0)
        assert not out.keep[i, s:].any() and torch.isneginf(out.scores[i, s:]).all()
        assert (out.query_edge_length[i, s:] == 0).all()


def test_scores_and_order_follow_cosine_on_kept():
    q, docs = scifact_graphs(4, 20)
    out = RicciFiltration()(q, docs)
    cos = torch.nn.functional.cosine_similarity(q.unsqueeze(1), docs, dim=-1)
    torch.testing.assert_close(out.scores[out.keep], cos[out.keep])
    assert torch.isneginf(out.scores[~out.keep]).all()
    for b in range(4):
        n_kept = int(out.keep[b].sum())
        assert out.keep[b, out.order[b, :n_kept]].all()
        kept_scores = out.scores[b, out.order[b, :n_kept]]
        assert (kept_scores[:-1] >= kept_scores[1:]).all()
    # the paper's n*: most candidates survive, not all
    assert 0 < int(out.keep.sum()) < out.keep.numel()


def test_float32_input_same_keep():
    q, docs = scifact_graphs(4, 20)
    a = RicciFiltration()(q, docs)
    b = RicciFiltration()(q.float(), docs.float())
    assert torch.equal(a.keep, b.keep)
    assert b.scores.dtype == torch.float32


def test_single_candidate_is_kept():
    q = torch.randn(2, 8)
    out = RicciFiltration()(q, torch.randn(2, 1, 8))
    assert out.keep.all() and torch.isfinite(out.query_edge_length).all()
    mask = torch.tensor([[True, False, False], [True, True, True]])
    out = RicciFiltration()(q, torch.randn(2, 3, 8), mask)
    assert out.keep[0].tolist() == [True, False, False]


def test_duplicate_candidates_are_finite():
    q = torch.randn(1, 8, dtype=torch.float64)
    base = torch.randn(1, 3, 8, dtype=torch.float64)
    docs = torch.cat([base, base, base[:, :1].repeat(1, 4, 1)], 1)  # exact duplicates
    out = RicciFiltration()(q, docs)
    assert torch.isfinite(out.query_edge_length).all() and torch.isfinite(out.query_edge_curvature).all()
    # duplicates are the same node of the graph up to relabelling: same fate
    assert out.keep[0, 0] == out.keep[0, 3] and out.keep[0, 1] == out.keep[0, 4]
    same = RicciFiltration()(q, q.unsqueeze(1).repeat(1, 5, 1))  # every candidate equals the query
    assert torch.isfinite(same.query_edge_length).all()


def test_bad_input():
    model = RicciFiltration()
    q, docs = torch.randn(2, 8), torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="docs must have shape"):
        model(q[:1], docs)
    with pytest.raises(ValueError, match="at least one candidate"):
        model(q, docs[:, :0])
    bad = docs.clone()
    bad[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model(q, bad)
    with pytest.raises(ValueError, match="mask must have shape"):
        model(q, docs, torch.ones(2, 4, dtype=torch.bool))
    for kwargs, msg in [
        ({"percentile": 120}, "percentile"),
        ({"solver": "lp"}, "solver"),
        ({"eta": -1}, "eta"),
        ({"iterations": 0}, "iterations"),
        ({"alpha": 2}, "alpha"),
    ]:
        with pytest.raises(ValueError, match=msg):
            RicciFiltration(**kwargs)


def test_auto_solver_resolution():
    model = RicciFiltration()
    assert model.resolved_solver(torch.device("cpu")) == "exact"
    assert model.resolved_solver(torch.device("cuda")) == "sinkhorn"
    assert RicciFiltration(solver="sinkhorn").resolved_solver(torch.device("cpu")) == "sinkhorn"


def test_cross_encoder_scorer_orders_kept(tiny_cross_encoder):
    scorer = CrossEncoderScorer(tiny_cross_encoder)
    q, docs = scifact_graphs(2, 6)
    q_texts = ["first query", "second query about cells"]
    d_texts = [[f"passage {i} of query {b}" for i in range(6)] for b in range(2)]
    out = RicciFiltration(scorer=scorer)(q, docs, query_texts=q_texts, doc_texts=d_texts)
    for b in range(2):
        for j in range(6):
            if out.keep[b, j]:
                expect = float(scorer.model.predict([(q_texts[b], d_texts[b][j])])[0])
                assert float(out.scores[b, j]) == pytest.approx(expect, abs=1e-5)
            else:
                assert float(out.scores[b, j]) == float("-inf")
    with pytest.raises(ValueError, match="query_texts"):
        RicciFiltration(scorer=scorer)(q, docs)


def test_cross_encoder_scorer_checks(tiny_cross_encoder, tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        CrossEncoderScorer(tmp_path / "missing")
    scorer = CrossEncoderScorer(tiny_cross_encoder)
    with pytest.raises(ValueError, match="passage lists"):
        scorer(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="beyond the end"):
        scorer(["a", "b"], [["x", "y"], ["z"]], torch.ones(2, 2, dtype=torch.bool))
    s = scorer(["a", "b"], [["x", "y"], ["z"]])
    assert s.shape == (2, 2) and torch.isneginf(s[1, 1]) and torch.isfinite(s[0]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_outputs_keep_the_input_dtype(dtype):
    q, docs = scifact_graphs(3, 20)
    for solver in ("exact", "sinkhorn"):
        out = RicciFiltration(solver=solver, iterations=3)(q.to(dtype), docs.to(dtype))
        assert out.query_edge_length.dtype == dtype and out.query_edge_curvature.dtype == dtype
        assert out.scores.dtype == dtype


@pytest.mark.slow
def test_certified_sinkhorn_keeps_the_exact_set_on_real_graphs():
    """The entropic path's parity target: >= 99.5% of candidates kept/dropped as by the exact flow,
    and as by the independent numpy + POT reference (tests/ricci_reference.py) at the documented
    parameters, for the first 8 graphs (~1.5 s of POT each)."""
    pytest.importorskip("ot")
    from ricci_reference import ref_ricci_filtration

    q, docs = scifact_graphs(24, 20)  # the whole shipped fixture (the benchmark: 256 SciFact + MuSiQue)
    exact = RicciFiltration(solver="exact")(q, docs)
    approx = RicciFiltration(solver="sinkhorn")(q.float(), docs.float())
    assert (exact.keep == approx.keep).double().mean() >= 0.995  # measured: 478 / 480
    ref = torch.from_numpy(np.stack([ref_ricci_filtration(q[b].numpy(), docs[b].numpy())[0] for b in range(8)]))
    assert torch.equal(exact.keep[:8], ref)
    assert (approx.keep[:8] == ref).double().mean() >= 0.98  # 160 candidates: at most 3 differ


def test_hyperparameters_and_dtypes_are_validated():
    nan, inf = float("nan"), float("inf")
    for kwargs, msg in [
        ({"step": 0.0}, "step"),
        ({"step": -1.0}, "step"),
        ({"step": 1.5}, "step"),
        ({"step": nan}, "step"),
        ({"alpha": nan}, "alpha"),
        ({"percentile": nan}, "percentile"),
        ({"eta": nan}, "eta"),
        ({"eta": inf}, "eta"),
        ({"delta": nan}, "delta"),
        ({"delta": -1.0}, "delta"),
        ({"reg": nan}, "reg"),
        ({"reg": 0.0}, "reg"),
        ({"exp_power": inf}, "exp_power"),
        ({"cert_tol": nan}, "cert_tol"),
    ]:
        with pytest.raises(ValueError, match=msg):
            RicciFiltration(**kwargs)
    q, docs = torch.randn(2, 8), torch.randn(2, 5, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="docs must have the dtype of query"):
        RicciFiltration()(q, docs)


def test_nan_embeddings_and_zero_length_edges_are_handled():
    q = torch.randn(1, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="query .* NaN"):
        RicciFiltration()(torch.full_like(q, float("nan")), torch.randn(1, 4, 8, dtype=torch.float64))
    # two candidates only: the flow shrinks edges towards 0 without NaN
    out = RicciFiltration()(q, torch.randn(1, 2, 8, dtype=torch.float64))
    assert torch.isfinite(out.query_edge_length).all() and torch.isfinite(out.query_edge_curvature).all()
