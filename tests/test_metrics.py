import numpy as np
import pytest
import torch

from conftest import require
from geograph.evaluation import answer_hits, evaluate, normalize_answer, per_query, relevance_tensors
from geograph.functional import hit_all_at_k, hit_answer_at_k, mrr_at_k, ndcg_at_k, precision_at_k, recall_at_k


def random_runs(seed, n_queries=60, n_docs=200, depth=30):
    rng = np.random.default_rng(seed)
    run, qrels = [], []
    for _ in range(n_queries):
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
    pytrec_eval = require("pytrec_eval")
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
    for v in (
        ndcg_at_k(gains, relevant, 3),
        recall_at_k(gains, relevant, 3),
        hit_all_at_k(gains, relevant, 3),
        mrr_at_k(gains, 3),
    ):
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


def test_hit_answer_hand_computed():
    """HitAns@k on a run worked out by hand (aliases, token boundaries, punctuation, articles)."""
    passages = {
        "p1": "Stanley Hall founded the association in 1892.",  # alias of query 0's answer
        "p2": "The store count was 1935 in total.",  # "35" only inside a number
        "p3": "Publix runs 35 stores there.",  # query 1's answer
        "p4": "It is called The Beatles' White Album.",  # "white album" after normalisation
        "p5": "Nothing relevant here.",
    }
    run = [["p5", "p1", "p2"], ["p2", "p5", "p3"], ["p4", "p5", "p1"], ["p1", "p3"], ["p3"]]
    answers = [["G. Stanley Hall", "Stanley Hall"], ["35"], ["the White Album"], [], ["Thirty-five", "35 stores"]]
    contains = answer_hits(run, passages, answers)
    assert contains.tolist() == [
        [False, True, False],
        [False, False, True],
        [True, False, False],
        [False, False, False],
        [True, False, False],
    ]
    # by hand: HitAns@1 = [0, 0, 1, 0, 1], HitAns@2 = [1, 0, 1, 0, 1], HitAns@3 = [1, 1, 1, 0, 1]
    assert hit_answer_at_k(contains, 1).tolist() == [0, 0, 1, 0, 1]
    assert hit_answer_at_k(contains, 2).tolist() == [1, 0, 1, 0, 1]
    assert hit_answer_at_k(contains, 3).tolist() == [1, 1, 1, 0, 1]
    qrels = [{"p1": 1}] * 5
    got = evaluate(run, qrels, ["HitAns@1", "HitAns@2", "HitAns@3", "Recall@1"], passages=passages, answers=answers)
    assert got == {"HitAns@1": 0.4, "HitAns@2": 0.6, "HitAns@3": 0.8, "Recall@1": 0.2}
    assert normalize_answer("An Apple, the PIE!") == "apple pie"


def test_hit_answer_on_musique_supporting_paragraphs():
    """Ranking every query's supporting paragraphs first hits an answer as often as a plain
    substring count says (an independent re-count over the real MuSiQue answers)."""
    import json
    import string

    from geograph.bench.common import DEFAULT_DATA

    root = DEFAULT_DATA / "musique"
    if not (root / "queries.jsonl").is_file():
        pytest.skip(f"MuSiQue not in {DEFAULT_DATA} (set GEOGRAPH_DATA)")
    from geograph.data import load_beir

    ds = load_beir(root, "test")
    fields = {q["_id"]: q for q in map(json.loads, (root / "queries.jsonl").read_text().splitlines())}
    answers = [[fields[q]["answer"], *fields[q]["answer_aliases"]] for q in ds.query_ids]
    run = [sorted(qr, key=lambda d: -qr[d]) for qr in ds.qrels_list()]
    text = dict(zip(ds.doc_ids, ds.passages()))
    ours = per_query(run, ds.qrels_list(), ["HitAns@10"], passages=text, answers=answers)["HitAns@10"]

    def norm(t):  # a second, independent normalisation
        t = "".join(" " if c in string.punctuation else c for c in t.lower())
        return " " + " ".join(w for w in t.split() if w not in {"a", "an", "the"}) + " "

    expect = [
        float(any(f" {norm(a).strip()} " in norm(text[d]) for a in ans if norm(a).strip() for d in r))
        for r, ans in zip(run, answers)
    ]
    assert ours.tolist() == expect
    assert 0.5 < float(ours.mean()) < 1.0  # most, not all, supporting sets state the answer verbatim


def test_hit_answer_errors():
    with pytest.raises(ValueError, match="needs passages and answers"):
        per_query([["a"]], [{"a": 1}], ["HitAns@5"])
    with pytest.raises(ValueError, match="answers has 2"):
        answer_hits([["a"]], {"a": "x"}, [["x"], ["y"]])
    with pytest.raises(ValueError, match="k must be a positive integer"):
        hit_answer_at_k(torch.zeros(1, 3, dtype=torch.bool), 0)
