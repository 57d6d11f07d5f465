"""torch.compile (inductor, the CPU backend) and torch.export of the public modules vs eager.

Compiling is slow on a 2-core CPU (inductor: 10-60 s per module), so shapes are tiny and
each module compiles once. Maniscope, DenseRetriever, ISORetriever and G3Retriever compile
with ``fullgraph=True`` (no graph break, hence no host synchronisation in the forward);
Maniscope and DenseRetriever also export; RicciFiltration runs compiled with graph breaks
where its docstring says why.
"""

import functools

import pytest
import torch

from geograph import CorpusGraph, DenseRetriever, G3Retriever, ISORetriever, Maniscope, RicciFiltration


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    corpus = torch.nn.functional.normalize(torch.randn(60, 8, generator=g), dim=1)
    q = torch.nn.functional.normalize(torch.randn(3, 8, generator=g), dim=1)
    docs = corpus[torch.randperm(60, generator=g)[:18]].view(3, 6, 8).clone()
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False  # a padded row
    docs[1, 4:] = float("nan")  # padding content is ignored, also when compiled
    return corpus, q, docs, mask


def same(out, ref, atol=1e-6):
    for name in ref.__dataclass_fields__:
        a, b = getattr(out, name), getattr(ref, name)
        if b is None:
            assert a is None
        elif b.is_floating_point():
            torch.testing.assert_close(a, b, atol=atol, rtol=1e-5, equal_nan=True)
        else:
            assert torch.equal(a, b), name


@pytest.mark.slow
def test_maniscope_compiles_fullgraph_and_exports(data):
    _, q, docs, mask = data
    model = Maniscope(k=2)
    ref = model(q, docs, mask)
    torch._dynamo.reset()
    same(torch.compile(model, fullgraph=True)(q, docs, mask), ref)
    exported = torch.export.export(model, (q, docs, mask))
    same(exported.module()(q, docs, mask), ref)


@pytest.mark.slow
def test_dense_compiles_fullgraph_and_exports(data):
    corpus, q, _, _ = data
    model = DenseRetriever(corpus, chunk_size=16)  # several chunks: the merge loop unrolls
    ref = model(q, 5)
    torch._dynamo.reset()
    same(torch.compile(model, fullgraph=True)(q, 5), ref)
    exported = torch.export.export(model, (q,), {"k": 5})
    same(exported.module()(q, k=5), ref)


@pytest.mark.slow
def test_iso_compiles_fullgraph(data):
    """The local set's padded widths are bounded a priori (no data-dependent shape): one graph."""
    corpus, q, _, _ = data
    model = ISORetriever(CorpusGraph.from_knn(corpus, 4), L=10)
    ref = model(q, 5)
    torch._dynamo.reset()
    same(torch.compile(model, fullgraph=True)(q, 5), ref)


@pytest.mark.slow
def test_g3_compiles_fullgraph(data):
    """The diffusion gathers the seeds' CSR rows (no sparse tensor in the forward): one graph."""
    corpus, q, _, _ = data
    model = G3Retriever(corpus, max_degree=8)
    ref = model(q, 5)
    torch._dynamo.reset()
    same(torch.compile(model, fullgraph=True)(q, 5), ref)


@pytest.mark.parametrize("solver", ["exact", pytest.param("sinkhorn", marks=pytest.mark.slow)])
def test_ricci_compiles_with_graph_breaks(data, solver, monkeypatch):
    """aot_eager: the flow's fixed loop unrolls into many graphs, too slow for inductor on 2 cores.

    Sinkhorn: dynamo unrolls every iteration of the fixed-length loop (1,000 cold + 300 warm by
    default: two minutes of tracing here); 24 + 8 iterations trace the same code (the annealed
    and the fixed-epsilon steps, cold and warm), in eager and compiled alike."""
    import geograph.methods.ricci.functional as ricci_module

    if solver == "sinkhorn":
        monkeypatch.setattr(
            ricci_module, "ricci_flow", functools.partial(ricci_module.ricci_flow, max_iter=24, warm_iter=8)
        )
    _, q, docs, mask = data
    model = RicciFiltration(solver=solver, iterations=3)
    ref = model(q, docs, mask)
    torch._dynamo.reset()
    same(torch.compile(model, backend="aot_eager")(q, docs, mask), ref)


def test_value_checks_still_run_in_eager(data):
    _, q, docs, mask = data
    with pytest.raises(ValueError, match="NaN"):
        Maniscope()(q, docs)  # NaN at real (unmasked) positions
