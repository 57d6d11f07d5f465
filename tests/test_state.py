"""State round trip: a module loaded with ``load_state_dict(other.state_dict())`` answers like ``other``.

Every public module is built twice from different data of the same shapes (so the state dicts
fit), the second loads the first's state, and the ANSWERS (indices and scores, bitwise) of the
loaded module are compared with the source module's. Each case also checks that the two
modules answered differently before the load, so a stale derived state cannot pass.
"""

from __future__ import annotations

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
from geograph.projection import IdentityPoincare

V, D, B = 80, 8, 6


def unit(n: int, seed: int, d: int = D) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def queries() -> torch.Tensor:
    return unit(B, 99)


def edges(seed: int) -> torch.Tensor:
    """The same random graph, relabelled by a seed-dependent permutation: same edge count, other structure."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, V, (300,), generator=g)
    dst = torch.randint(0, V, (300,), generator=g)
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    return torch.stack([perm[src], perm[dst]])


def graph(seed: int) -> CorpusGraph:
    return CorpusGraph.from_edge_index(unit(V, seed), edges(seed))


def g3graph(seed: int) -> G3Graph:
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    return G3Graph.build(unit(V, 1)[perm] if seed else unit(V, 1), max_degree=6)


def iso(seed: int, projection: bool = False) -> ISORetriever:
    proj = None
    if projection:
        torch.manual_seed(seed)
        proj = PoincareProjection(D, 4, hidden=16, c=0.5 + seed)
    return ISORetriever(graph(seed), projection=proj, m=3, L=10, max_nodes=20)


def out(o) -> tuple[torch.Tensor, ...]:
    """The answer of any module call as a tuple of tensors."""
    if isinstance(o, torch.Tensor):
        return (o,)
    fields = o.__dataclass_fields__ if hasattr(o, "__dataclass_fields__") else {}
    return tuple(getattr(o, f) for f in fields if isinstance(getattr(o, f), torch.Tensor))


def graph_answers(g: CorpusGraph) -> tuple[torch.Tensor, ...]:
    """What a CorpusGraph answers: its structure and embeddings, and an ISO retriever built on it."""
    r = ISORetriever(g, m=3, L=10, max_nodes=20)(queries(), 5)
    return (g.embeddings, g.degree(), g.col, r.indices, r.scores)


def g3graph_answers(g: G3Graph) -> tuple[torch.Tensor, ...]:
    r = G3Retriever(g, candidates=10, seeds=2)(queries(), 5)
    return (g.transition.to_dense(), g.density, torch.tensor(g.row_width), r.indices, r.scores)


docs_gen = torch.Generator().manual_seed(5)
DOCS = torch.randn(B, 12, D, generator=docs_gen)
QUERY = torch.randn(B, D, generator=docs_gen)

# name -> (build(seed), answers(module))
CASES = {
    "DenseRetriever": (lambda s: DenseRetriever(unit(V, s)), lambda m: out(m(queries(), 5))),
    "CorpusGraph": (graph, graph_answers),
    "ISORetriever": (iso, lambda m: out(m(queries(), 5))),
    "ISORetriever+projection": (lambda s: iso(s, projection=True), lambda m: out(m(queries(), 5))),
    "G3Graph": (g3graph, g3graph_answers),
    "G3Retriever": (lambda s: G3Retriever(g3graph(s), candidates=10, seeds=2), lambda m: out(m(queries(), 5))),
    "PoincareProjection": (
        lambda s: (torch.manual_seed(s), PoincareProjection(D, 4, hidden=16, c=0.5 + s))[1],
        lambda m: out(m(unit(20, 7))),
    ),
    "IdentityPoincare": (
        lambda s: IdentityPoincare(c=0.5 + s),
        lambda m: (*out(m(0.5 * unit(20, 7))), torch.tensor(m.c)),
    ),
}
# no tensor state: a state round trip must not change them (the answers depend on the hyperparameters)
STATELESS = {
    "Maniscope": (lambda: Maniscope(k=3), lambda m: out(m(QUERY, DOCS))),
    "RicciFiltration": (lambda: RicciFiltration(iterations=3), lambda m: out(m(QUERY, DOCS))),
}


def same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", list(CASES))
def test_loaded_module_answers_like_the_source(name):
    build, answers = CASES[name]
    src, dst = build(0), build(1)
    before = answers(dst)
    assert not same(answers(src), before), f"{name}: the two data sets give the same answers; the test checks nothing"
    dst.load_state_dict(src.state_dict())  # strict: the keys and shapes fit
    got, want = answers(dst), answers(src)
    assert same(got, want), f"{name}: answers after load_state_dict differ from the source module's"


@pytest.mark.parametrize("name", list(STATELESS))
def test_stateless_modules_round_trip(name):
    build, answers = STATELESS[name]
    src, dst = build(), build()
    assert src.state_dict() == {}
    dst.load_state_dict(src.state_dict())
    assert same(answers(dst), answers(src))


def test_standalone_dense_state_dict_carries_the_corpus():
    d = DenseRetriever(unit(V, 0))
    assert set(d.state_dict()) == {"embeddings"}
    # inside ISO and G3 the dense index is derived from the graph: saved once, as the graph's
    assert not any(k.startswith("dense.") for k in iso(0).state_dict())
    assert not any(k.startswith("dense.") for k in G3Retriever(g3graph(0)).state_dict())


def test_iso_submodule_load_then_refresh():
    """Loading only the graph is documented to need refresh(); after it the answers match."""
    src, dst = iso(0), iso(1)
    dst.graph.load_state_dict(src.graph.state_dict())
    dst.refresh()
    assert same(out(dst(queries(), 5)), out(src(queries(), 5)))


def test_round_trip_through_a_file(tmp_path):
    """torch.save / torch.load of the state dict (what a checkpoint does) gives the same answers."""
    src, dst = iso(0, projection=True), iso(1, projection=True)
    torch.save(src.state_dict(), tmp_path / "iso.pt")
    dst.load_state_dict(torch.load(tmp_path / "iso.pt", weights_only=True))
    assert same(out(dst(queries(), 5)), out(src(queries(), 5)))
    assert dst.projection.c == src.projection.c == 0.5
