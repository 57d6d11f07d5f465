import numpy as np
import pytest
import torch

from geograph.functional import hit_all_at_k, mrr_at_k, ndcg_at_k, precision_at_k, recall_at_k
from geograph.metrics import evaluate, relevance_tensors

pytrec_eval = pytest.importorskip("pytrec_eval")


def random_runs(seed, n_queries=60, n_docs=200, depth=30):
    rng = np.random.default_rng(seed)
    run, qrels = [], []
    for q in range(n_queries):
        n_rel = int(rng.integers(1, 6))
        rel = rng.choice(n_docs, n_rel, replace=False)
        qrels.append({f"d{d}": int(rng.integers(1, 3)) for d in rel})
        # runs that often contain relevant docs
        pool = np.concatenate([rel, rng.choice(n_docs, depth, replace=False)])
        ranked = list(dict.fromkeys(rng.permutation(pool).tolist()))[: int(rng.integers(1, depth + 1))]
        run.append([f"d{d}" for d in ranked])
    return run, qrels


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [1, 5, 10, 20])
def test_matches_trec_eval(seed, k):
    run, qrels = random_runs(seed)
    q_run = {str(i): {d: float(len(r) - j) for j, d in enumerate(r)} for i, r in enumerate(run)}
    q_run_k = {str(i): {d: float(len(r) - j) for j, d in enumerate(r[:k])} for i, r in enumerate(run)}
    q_rel = {str(i): q for i, q in enumerate(qrels)}
    ref = pytrec_eval.RelevanceEvaluator(q_rel, {f"ndcg_cut_{k}", f"recall_{k}", f"P_{k}"}).evaluate(q_run)
    ref_rr = pytrec_eval.RelevanceEvaluator(q_rel, {"recip_rank"}).evaluate(q_run_k)
    gains, relevant = relevance_tensors(run, qrels)
    checks = {
        f"ndcg_cut_{k}": ndcg_at_k(gains, relevant, k),
        f"recall_{k}": recall_at_k(gains, relevant, k),
        f"P_{k}": precision_at_k(gains, k),
    }
    for name, ours in checks.items():
        expected = np.array([ref[str(i)][name] for i in range(len(run))])
        np.testing.assert_allclose(ours.numpy(), expected, atol=1e-9, err_msg=name)
    rr = np.array([ref_rr[str(i)]["recip_rank"] for i in range(len(run))])
    np.testing.assert_allclose(mrr_at_k(gains, k).numpy(), rr, atol=1e-9)
    hit_all = np.array([ref[str(i)][f"recall_{k}"] == 1.0 for i in range(len(run))], dtype=float)
    np.testing.assert_array_equal(hit_all_at_k(gains, relevant, k).numpy(), hit_all)


def test_evaluate_means():
    run, qrels = random_runs(9)
    out = evaluate(run, qrels, ["nDCG@10", "Recall@5", "HitAll@5", "MRR@10", "P@3"])
    gains, relevant = relevance_tensors(run, qrels)
    assert out["nDCG@10"] == pytest.approx(float(ndcg_at_k(gains, relevant, 10).mean()))
    assert set(out) == {"nDCG@10", "Recall@5", "HitAll@5", "MRR@10", "P@3"}


def test_no_relevant_scores_zero():
    gains = torch.zeros(1, 3, dtype=torch.float64)
    relevant = torch.zeros(1, 1, dtype=torch.float64)
    for v in (ndcg_at_k(gains, relevant, 3), recall_at_k(gains, relevant, 3), hit_all_at_k(gains, relevant, 3), mrr_at_k(gains, 3)):
        assert v.item() == 0.0


def test_exception():
    with pytest.raises(ValueError, match="k must be a positive integer"):
        ndcg_at_k(torch.zeros(1, 3), torch.zeros(1, 1), 0)
    with pytest.raises(ValueError, match="unknown metric"):
        evaluate([["a"]], [{"a": 1}], ["MAP@10"])
    with pytest.raises(ValueError, match="run has 1 queries"):
        evaluate([["a"]], [{"a": 1}, {"b": 1}])
    with pytest.raises(ValueError, match="gains must be"):
        precision_at_k(torch.zeros(3), 1)
