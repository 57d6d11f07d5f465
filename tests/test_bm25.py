"""BM25Retriever against bm25s' own per-query scoring and a from-scratch numpy BM25."""

import math
import re
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import require

bm25s = require("bm25s")

from geograph.retrievers.bm25 import BM25Retriever  # noqa: E402

WORDS = "graph ricci curvature flow passage query dense sparse retrieval cat dog bark the a of and".split()


def corpus(seed, n=60):
    rng = np.random.default_rng(seed)
    # each passage has a content word (bm25s gives a passage of stop words only length 1)
    return [
        " ".join([str(rng.choice(WORDS[:12]))] + list(rng.choice(WORDS, int(rng.integers(0, 25))))) for _ in range(n)
    ]


def bm25_numpy(passages, queries, k1, b, stop):
    """Lucene BM25 from its formula: idf = ln(1 + (N - n_t + 0.5) / (n_t + 0.5)), tf / (tf + k1 (...)) ."""
    tok = lambda t: [w for w in re.findall(r"(?u)\b\w\w+\b", t.lower()) if w not in stop]  # noqa: E731
    docs = [Counter(tok(p)) for p in passages]
    lens = np.array([sum(d.values()) for d in docs], dtype=np.float64)
    avgdl, n = lens.mean(), len(docs)
    df = Counter(w for d in docs for w in d)
    out = np.zeros((len(queries), n))
    for i, q in enumerate(queries):
        for w in tok(q):
            if w not in df:
                continue
            idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
            for j, d in enumerate(docs):
                f = d.get(w, 0)
                out[i, j] += idf * f / (f + k1 * (1 - b + b * lens[j] / avgdl))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_scores_match_numpy_formula_and_bm25s(seed):
    rng = np.random.default_rng(100 + seed)
    passages = corpus(seed)
    queries = [" ".join(rng.choice(WORDS + ["zebra"], int(rng.integers(1, 6)))) for _ in range(12)]
    k1, b = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.0, 1.0))
    model = BM25Retriever(passages, k1=k1, b=b, stopwords=["the", "a", "of", "and"])
    ours = model.scores(queries).double().numpy()
    np.testing.assert_allclose(
        ours, bm25_numpy(passages, queries, k1, b, {"the", "a", "of", "and"}), rtol=1e-5, atol=1e-5
    )
    q_ids = model._tokenizer.tokenize(
        queries, show_progress=False, update_vocab=False, allow_empty=False, return_as="ids"
    )
    for i, ids in enumerate(q_ids):  # bm25s' own one-query scorer
        want = model._bm25.get_scores(ids) if ids else np.zeros(len(passages))  # no known word: all 0
        np.testing.assert_allclose(ours[i], want, rtol=1e-6, atol=1e-6)


def test_retrieve_top_k_and_ties():
    passages = ["cat dog", "cat dog", "dog", "bird", "cat"]
    model = BM25Retriever(passages)
    out = model.retrieve(["cat dog", "zebra", "bird"], k=3)
    assert out.indices[0].tolist() == [0, 1, 4] or out.indices[0].tolist() == [0, 1, 2]
    s = model.scores(["cat dog"])[0]
    ref = np.argsort(-s.numpy(), kind="stable")[:3].tolist()  # equal scores: lowest index first
    assert out.indices[0].tolist() == ref
    assert out.indices[1].tolist() == [0, 1, 2] and (out.scores[1] == 0).all()  # unknown words: all zero
    assert out.indices[2, 0].item() == 3
    assert out.scores.dtype == torch.float32 and out.indices.dtype == torch.long


def test_bad_input():
    with pytest.raises(ValueError, match="passages"):
        BM25Retriever([])
    with pytest.raises(ValueError, match="b must"):
        BM25Retriever(["a b"], b=1.5)
    with pytest.raises(ValueError, match="k1"):
        BM25Retriever(["a b"], k1=float("nan"))
    model = BM25Retriever(["cat", "dog"])
    with pytest.raises(ValueError, match="exceeds the corpus"):
        model.retrieve(["cat"], k=3)
    with pytest.raises(ValueError, match="queries"):
        model.retrieve("cat", k=1)
