import numpy as np
import pytest
import torch

from geograph import DenseRetriever, RetrievalOutput


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 100000])
def test_matches_full_topk(chunk_size, device, dtype):
    g = torch.Generator().manual_seed(0)
    corpus = torch.randn(200, 16, generator=g, dtype=dtype)
    query = torch.randn(9, 16, generator=g, dtype=dtype)
    out = DenseRetriever(corpus, chunk_size=chunk_size).to(device)(query.to(device), k=10)
    full = torch.nn.functional.normalize(query, dim=1) @ torch.nn.functional.normalize(corpus, dim=1).T
    ref = full.topk(10, dim=1)
    assert isinstance(out, RetrievalOutput)
    assert torch.equal(out.indices.cpu(), ref.indices)
    torch.testing.assert_close(out.scores.cpu(), ref.values)


def test_k_equals_corpus():
    corpus = torch.randn(5, 3)
    out = DenseRetriever(corpus, chunk_size=2)(torch.randn(2, 3), k=5)
    assert sorted(out.indices[0].tolist()) == list(range(5))


def test_exception():
    r = DenseRetriever(torch.randn(5, 3))
    with pytest.raises(ValueError, match="k=6 exceeds the corpus size 5"):
        r(torch.randn(1, 3), 6)
    with pytest.raises(ValueError, match="query must have D=3"):
        r(torch.randn(1, 4), 2)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        r(torch.randn(1, 3), 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        DenseRetriever(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="empty"):
        DenseRetriever(torch.zeros(0, 3))


@pytest.mark.parametrize("chunk_size", [1, 3, 8, 1000])
def test_ties_lowest_index_first_across_chunks(chunk_size, device, dtype):
    """Exact ties (passages drawn from +-basis vectors, so every score is a query coordinate,
    computed exactly): ids equal numpy's stable argsort of the negated scores, any chunking."""
    g = torch.Generator().manual_seed(1)
    basis = torch.cat([torch.eye(4), -torch.eye(4)]).to(dtype)
    corpus = basis[torch.randint(8, (40,), generator=g)]  # each direction ~5 times
    query = torch.tensor(
        [[1.0, 1.0, 0.0, 0.0], [3.0, -4.0, 0.0, 1.0], [0.0, 0.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]], dtype=dtype
    )
    model = DenseRetriever(corpus, chunk_size=chunk_size).to(device)
    qn = query.numpy().astype(np.float64)
    qn = qn / np.linalg.norm(qn, axis=1, keepdims=True)
    cos = qn @ corpus.numpy().astype(np.float64).T
    for k in (1, 5, 13, 40):
        out = model(query.to(device), k)
        ref = np.argsort(-cos, axis=1, kind="stable")[:, :k]
        assert out.indices.cpu().numpy().tolist() == ref.tolist()
