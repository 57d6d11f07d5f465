"""The FAISS path of ``CorpusGraph.from_knn`` against the exact path (the ``faiss`` extra)."""

import numpy as np
import pytest
import torch

from conftest import require
from geograph import CorpusGraph

faiss = require("faiss")


def knn_reference(x: np.ndarray, k: int) -> set[tuple[int, int]]:
    """Undirected k-NN edge set by brute-force cosine in numpy (no duplicate passages: no ties)."""
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = z @ z.T
    np.fill_diagonal(s, -np.inf)
    nn = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return {e for u, row in enumerate(nn.tolist()) for v in row for e in ((u, v), (v, u))}


def edge_set(g: CorpusGraph) -> set[tuple[int, int]]:
    return set(map(tuple, g.edge_index.T.tolist()))


@pytest.mark.parametrize("seed", range(4))
def test_faiss_knn_equals_exact_and_numpy(seed):
    rng = np.random.default_rng(seed)
    v, d, k = int(rng.integers(30, 300)), int(rng.integers(4, 48)), int(rng.integers(1, 12))
    x = rng.standard_normal((v, d)).astype(np.float32) * rng.uniform(0.5, 4.0)
    emb = torch.from_numpy(x)
    fast = CorpusGraph.from_knn(emb, k, faiss=True)
    exact = CorpusGraph.from_knn(emb, k)
    assert edge_set(fast) == edge_set(exact) == knn_reference(x.astype(np.float64), k)
    assert fast.num_edges == exact.num_edges
    assert torch.equal(fast.rowptr, exact.rowptr) and torch.equal(fast.col, exact.col)


def test_faiss_knn_never_links_a_passage_to_itself_with_duplicates():
    # duplicates tie at similarity 1 with the passage itself: FAISS may return either first
    x = torch.from_numpy(np.repeat(np.random.default_rng(7).standard_normal((10, 6)), 3, axis=0).astype(np.float32))
    g = CorpusGraph.from_knn(x, 2, faiss=True)
    ei = g.edge_index
    assert not bool((ei[0] == ei[1]).any())
    # every passage's two nearest others are its two copies (similarity 1)
    copies = {(u, v) for u in range(30) for v in range(30) if u != v and u // 3 == v // 3}
    assert edge_set(g) == copies == edge_set(CorpusGraph.from_knn(x, 2))


def test_faiss_missing_message(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_faiss(name, *a, **kw):
        if name == "faiss":
            raise ImportError("no faiss")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_faiss)
    with pytest.raises(ImportError, match="faiss-cpu"):
        CorpusGraph.from_knn(torch.randn(10, 4), 2, faiss=True)
