"""Every tensor a module holds moves with ``.to()``; one device per call; half precision.

The state walk looks at every attribute of a module, recursively (submodules, plain
attributes, dicts, lists, tuples, dataclasses), so a tensor kept as a plain attribute, or
inside an object that is not a registered submodule, is found. The "meta" device stands in
for a second device on a CPU-only machine.
"""

import dataclasses

import pytest
import torch

from geograph import (
    CorpusGraph,
    DenseRetriever,
    G3Graph,
    G3Retriever,
    ISORetriever,
    Maniscope,
    PoincareProjection,
    RicciFiltration,
)


def corpus(n=40, d=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=1)


def tensors_in(obj, path="model", seen=None):
    """Every (path, tensor) reachable from ``obj``'s attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += tensors_in(v, f"{path}[{k!r}]", seen)
    elif isinstance(obj, (list, tuple, set)):
        for i, v in enumerate(obj):
            out += tensors_in(v, f"{path}[{i}]", seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out += tensors_in(getattr(obj, f.name), f"{path}.{f.name}", seen)
    elif (
        hasattr(obj, "__dict__")
        and not isinstance(obj, type)
        and type(obj).__module__.split(".")[0] in ("geograph", "geoopt", "torch")
    ):
        for k, v in vars(obj).items():
            out += tensors_in(v, f"{path}.{k}", seen)
    return out


MODULES = {
    "Maniscope": lambda: Maniscope(),
    "RicciFiltration": lambda: RicciFiltration(),
    "DenseRetriever": lambda: DenseRetriever(corpus()),
    "ISORetriever": lambda: ISORetriever(CorpusGraph.from_knn(corpus(), 3), m=2, L=5, max_nodes=10),
    "ISORetriever+PoincareProjection": lambda: ISORetriever(
        CorpusGraph.from_knn(corpus(), 3), m=2, L=5, max_nodes=10, projection=PoincareProjection(8, 3, hidden=4)
    ),
    "G3Retriever": lambda: G3Retriever(corpus(), max_degree=6),
    "CorpusGraph": lambda: CorpusGraph.from_knn(corpus(), 3),
    "G3Graph": lambda: G3Graph.build(corpus(), max_degree=6),
    "PoincareProjection": lambda: PoincareProjection(8, 3, hidden=4),
}


def test_walk_finds_a_plain_tensor_attribute():
    """The walk itself: a tensor hidden in a plain attribute (the old bug) is found and left behind."""
    model = DenseRetriever(corpus())
    model.hidden = {"cache": [torch.zeros(2)]}
    moved = model.to("meta")
    assert [p for p, t in tensors_in(moved) if t.device.type != "meta"] == ["model.hidden['cache'][0]"]


@pytest.mark.parametrize("name", list(MODULES))
def test_every_tensor_moves_to_meta(name):
    model = MODULES[name]().to("meta")
    found = tensors_in(model)
    left = [p for p, t in found if t.device.type != "meta"]
    assert not left, f"{name}: tensors not moved by .to('meta'): {left}"
    if name not in ("Maniscope", "RicciFiltration"):
        assert found  # the walk saw the state


@pytest.mark.parametrize("name", list(MODULES))
def test_every_float_tensor_follows_to_float64(name):
    model = MODULES[name]()
    ints_before = {p: t.dtype for p, t in tensors_in(model) if not t.is_floating_point()}
    model = model.to(torch.float64)
    for p, t in tensors_in(model):
        if p in ints_before:
            assert t.dtype == ints_before[p], f"{name}: integer tensor {p} was cast to {t.dtype}"
        else:
            assert t.dtype == torch.float64, f"{name}: {p} stayed {t.dtype} after .to(torch.float64)"


def test_graphs_keep_index_dtypes_and_state_dict():
    g = CorpusGraph.from_knn(corpus(), 3).to(torch.float64)
    assert g.embeddings.dtype == torch.float64 and g.edge_index.dtype == torch.long and g.rowptr.dtype == torch.long
    assert set(g.state_dict()) == {"embeddings", "edge_index", "rowptr"}
    t = G3Graph.build(corpus(), max_degree=5).to(torch.float64)
    assert t.transition.dtype == torch.float64 and t.crow.dtype == torch.long and t.col.dtype == torch.long
    assert set(t.state_dict()) >= {"embeddings", "density", "crow", "col", "val"}


def test_state_dict_round_trip_carries_the_graph():
    x, y = corpus(seed=1), corpus(seed=2)
    a = ISORetriever(CorpusGraph.from_edge_index(x, torch.tensor([[0, 1, 2], [1, 2, 3]])), m=2, L=5, max_nodes=10)
    b = ISORetriever(CorpusGraph.from_edge_index(y, torch.tensor([[4, 5, 6], [5, 6, 7]])), m=2, L=5, max_nodes=10)
    assert {"graph.embeddings", "graph.edge_index", "graph.rowptr"} <= set(a.state_dict())
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.graph.embeddings, x) and torch.equal(b.graph.edge_index, a.graph.edge_index)
    g3a, g3b = G3Graph.build(x, max_degree=4), G3Graph.build(y, max_degree=4)
    g3b.load_state_dict(g3a.state_dict())
    assert torch.equal(g3b.transition.to_dense(), g3a.transition.to_dense())
    assert g3b.row_width == int(g3a.degree().max())


CALLS = {
    "DenseRetriever": (lambda: DenseRetriever(corpus()), lambda m, q: m(q, 3)),
    "ISORetriever": (
        lambda: ISORetriever(CorpusGraph.from_knn(corpus(), 3), m=2, L=5, max_nodes=10),
        lambda m, q: m(q, 3),
    ),
    "G3Retriever": (lambda: G3Retriever(corpus(), max_degree=6), lambda m, q: m(q, 5)),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_query_on_another_device_names_both(name):
    make, call = CALLS[name]
    model = make()
    with pytest.raises(ValueError, match=r"query is on meta but .* is on cpu"):
        call(model, torch.zeros(2, 8, device="meta"))
    model.to("meta")
    with pytest.raises(ValueError, match=r"query is on cpu but .* is on meta"):
        call(model, corpus(2))


def test_candidates_on_two_devices_name_both():
    q, docs = corpus(2), corpus(12).view(2, 6, 8)
    with pytest.raises(ValueError, match="docs is on meta but query is on cpu"):
        Maniscope()(q, docs.to("meta"))
    with pytest.raises(ValueError, match="mask is on meta but query is on cpu"):
        Maniscope()(q, docs, torch.ones(2, 6, dtype=torch.bool, device="meta"))
    from geograph.functional import personalized_pagerank

    with pytest.raises(ValueError, match="personalization is on meta but weights is on cpu"):
        personalized_pagerank(torch.ones(1, 3, 3), torch.ones(1, 3, device="meta"))


def test_graph_and_projection_on_two_devices():
    graph = CorpusGraph.from_knn(corpus(), 3)
    with pytest.raises(ValueError, match="projection is on meta but the graph is on cpu"):
        ISORetriever(graph, projection=PoincareProjection(8, 3, hidden=4).to("meta"))


def test_moved_modules_still_answer_the_same(device):
    """Built on the CPU, moved with .to(device) (bench gpu's path): same ids as on the CPU."""
    x, q = corpus(60, seed=3), corpus(4, seed=4)
    for make, call in [
        (lambda: DenseRetriever(x), lambda m, qq: m(qq, 5)),
        (lambda: ISORetriever(CorpusGraph.from_knn(x, 4), m=2, L=8), lambda m, qq: m(qq, 5)),
        (lambda: G3Retriever(x, max_degree=8), lambda m, qq: m(qq, 5)),
    ]:
        ref = call(make(), q)
        got = call(make().to(device), q.to(device))
        assert torch.equal(got.indices.cpu(), ref.indices)
        torch.testing.assert_close(got.scores.cpu(), ref.scores)


# -- half precision: each works (results close to float32) or says which op refuses ------------


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_precision(half):
    x, q = corpus(60, seed=5), corpus(3, seed=6)
    atol = 2e-2
    # Maniscope on half candidates: scores in half, close to float32
    docs = x[:18].view(3, 6, 8)
    ref = Maniscope(k=2)(q, docs)
    got = Maniscope(k=2)(q.to(half), docs.to(half))
    assert got.scores.dtype == half
    torch.testing.assert_close(got.scores.float(), ref.scores, atol=atol, rtol=0)
    # DenseRetriever: a half query on a float32 corpus, and a half corpus
    ref = DenseRetriever(x)(q, 5)
    for model, query in [(DenseRetriever(x), q.to(half)), (DenseRetriever(x).to(half), q.to(half))]:
        out = model(query, 5)
        assert out.scores.dtype == half
        torch.testing.assert_close(out.scores.float(), ref.scores, atol=atol, rtol=0)
    # G3: a graph built from half embeddings (in float32 inside) equals the float32 graph up to rounding
    g16, g32 = G3Graph.build(x.to(half), max_degree=8), G3Graph.build(x, max_degree=8)
    assert g16.val.dtype == half and g16.density.dtype == half
    assert torch.equal(g16.crow, g32.crow)
    torch.testing.assert_close(g16.val.float(), g32.val, atol=atol, rtol=0)
    out16 = G3Retriever(g16)(q.to(half), 5)
    out32 = G3Retriever(g32)(q, 5)
    assert out16.scores.dtype == half
    assert torch.equal(out16.indices[:, :2], out32.indices[:, :2])  # the seeds: clear cosine gaps here
    # ISO on a half query: computed in the graph's float32, scores returned in half
    iso = ISORetriever(CorpusGraph.from_knn(x, 4), m=2, L=8)
    a, b = iso(q, 5), iso(q.to(half), 5)
    assert b.scores.dtype == half
    torch.testing.assert_close(b.scores.float(), a.scores, atol=atol, rtol=0)
