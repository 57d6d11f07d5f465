"""Adding and removing passages of an ISORetriever: phi, kept edges and answers equal a fresh retriever's."""

import numpy as np
import torch

from geograph import CorpusGraph, ISORetriever
from geograph.functional import isoperimetric_ratio


def test_updates_equal_fresh_retriever():
    gen = torch.Generator().manual_seed(0)
    pool = torch.nn.functional.normalize(torch.randn(1000, 12, generator=gen), dim=1)
    pool = pool * torch.rand(1000, 1, generator=gen)  # volumes differ from passage to passage
    model = ISORetriever(CorpusGraph.from_knn(pool[:980], 4), beta=0.6)
    model.add(pool[980:990], list(range(980, 990)))
    model.remove([5, 77, 985, 12])
    model.add(pool[990:], list(range(990, 1000)))
    model.remove(list(range(100, 103)))
    gone = {5, 77, 985, 12, *range(100, 103)}
    rows = pool[[i for i in range(1000) if i not in gone]]
    fresh = ISORetriever(CorpusGraph.from_knn(rows, 4), beta=0.6)
    assert torch.equal(model.graph.edge_index, fresh.graph.edge_index)
    assert torch.allclose(model.phi, fresh.phi, rtol=1e-6, atol=0)
    assert torch.equal(model.kept_keys, fresh.kept_keys)
    q = torch.randn(5, 12, generator=gen)
    out, want = model(q, k=5), fresh(q, k=5)
    assert torch.equal(out.indices, want.indices) and torch.allclose(out.scores, want.scores)
    # phi against a direct count: ball and 2-hop shell volumes from a dense adjacency in numpy
    a = np.zeros((len(rows), len(rows)), dtype=bool)
    ei = fresh.graph.edge_index.numpy()
    a[ei[0], ei[1]] = True
    vol = model._volume.numpy()
    closed = a | np.eye(len(rows), dtype=bool)
    two = ((closed.astype(int) @ closed.astype(int)) > 0) & ~closed
    want_phi = (two * vol).sum(1) / ((closed * vol).sum(1) + np.finfo(np.float64).eps)
    assert np.allclose(model.phi.double().numpy(), want_phi, rtol=1e-5)
    assert torch.allclose(
        isoperimetric_ratio(model.graph.edge_index, model._volume, len(rows)).to(model.phi), model.phi
    )
