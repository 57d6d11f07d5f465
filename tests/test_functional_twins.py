"""Each method's Module equals its functional twin bit for bit, the shared helpers keep their
callers' results, and the server's parameters are the constructors'."""

import dataclasses
import inspect

import pytest
import torch

from geograph import CorpusGraph, G3Retriever, ISORetriever, Maniscope, RicciFiltration
from geograph import functional as F
from geograph.projection import PoincareProjection


def assert_same(a, b):
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None) == (y is None), f.name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), f.name


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(7)
    q, docs = torch.randn(3, 12, generator=g), torch.randn(3, 8, 12, generator=g)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[1, 5:] = False
    return q, docs, mask


@pytest.fixture(scope="module")
def corpus():
    g = torch.Generator().manual_seed(3)
    return torch.nn.functional.normalize(torch.randn(80, 12, generator=g), dim=1), torch.randn(4, 12, generator=g)


def test_maniscope_module_is_its_function(batch):
    q, docs, mask = batch
    model = Maniscope(k=3, alpha=0.4)
    scores, geo = F.maniscope_scores(q, docs, mask, k=3, alpha=0.4)
    out = model(q, docs, mask)
    assert torch.equal(out.scores, scores) and torch.equal(out.geodesic, geo)


@pytest.mark.parametrize(
    "kw",
    [{"iterations": 6}, {"iterations": 6, "eta": 0.95, "percentile": 40.0}, {"iterations": 3, "solver": "sinkhorn"}],
)
def test_ricci_module_is_its_function(batch, kw):
    q, docs, mask = batch
    assert_same(RicciFiltration(**kw)(q, docs, mask), F.ricci_filtration(q, docs, mask, **kw))


def test_ricci_surgery_is_the_keep_rule(batch):
    q, docs, mask = batch
    out = RicciFiltration(iterations=6, eta=1.0)(q.double(), docs.double(), mask)
    assert torch.equal(out.keep, F.ricci_surgery(out.query_edge_length, mask, 1.0))


def test_ricci_function_checks_like_the_module(batch):
    q, docs, mask = batch
    for bad in ({"eta": -1}, {"solver": "nope"}, {"reg": 0}, {"cert_tol": -1.0}, {"step": 2.0}):
        with pytest.raises(ValueError) as e_mod:
            RicciFiltration(**bad)
        with pytest.raises(ValueError) as e_fn:
            F.ricci_filtration(q, docs, mask, **bad)
        assert str(e_mod.value) == str(e_fn.value)


@pytest.mark.parametrize(
    "kw",
    [
        {"m": 3, "L": 10, "max_nodes": 30},
        {"m": 2, "L": 5, "hops": 2, "max_nodes": 40},
        {"m": 4, "L": 8, "hops": 0, "max_nodes": 8, "tau": 3.0, "lambda_g": 0.7},
    ],
)
def test_iso_module_is_its_function(corpus, kw):
    emb, queries = corpus
    model = ISORetriever(CorpusGraph.from_knn(emb, 5), **kw)
    g = model.graph
    args = (queries, model.dense.embeddings, g.rowptr, g.col, model.kept_keys)
    deg = int(g.degree().max())
    assert_same(model(queries, k=4), F.iso_retrieve(*args, 4, max_degree=deg, **kw))
    local_kw = {k: v for k, v in kw.items() if k in ("m", "L", "hops", "max_nodes", "tau")}
    assert_same(model.local(queries), F.iso_local_subgraph(*args, max_degree=deg, **local_kw))


def test_iso_with_a_projection_is_its_function(corpus):
    emb, queries = corpus
    torch.manual_seed(0)
    model = ISORetriever(CorpusGraph.from_knn(emb, 5), projection=PoincareProjection(12, 6, hidden=8), m=3, L=9)
    g = model.graph
    out = F.iso_retrieve(
        queries, model.dense.embeddings, g.rowptr, g.col, model.kept_keys, 5, max_degree=int(g.degree().max()), m=3, L=9
    )
    assert_same(model(queries, k=5), out)


def test_iso_function_rejects_k_above_the_local_set(corpus):
    emb, queries = corpus
    model = ISORetriever(CorpusGraph.from_knn(emb, 5), m=2, L=4, max_nodes=10)
    g = model.graph
    with pytest.raises(ValueError, match="exceeds the guaranteed local set size"):
        F.iso_retrieve(
            queries, model.dense.embeddings, g.rowptr, g.col, model.kept_keys, 5, max_degree=5, m=2, L=4, max_nodes=10
        )


@pytest.mark.parametrize("kw", [{}, {"candidates": 6, "seeds": 3}, {"candidates": 4, "seeds": 1, "max_degree": 3}])
@pytest.mark.parametrize("k", [1, 3, 9])
def test_g3_module_is_its_function(corpus, kw, k):
    emb, queries = corpus
    model = G3Retriever(emb, **kw)
    k = max(k, model.seeds)
    g = model.graph
    opts = {"candidates": model.candidates, "seeds": model.seeds}
    out = F.g3_retrieve(queries, model.dense.embeddings, g.crow, g.col, g.val, k, **opts)
    assert_same(model(queries, k=k), out)
    scorer = lambda q, ids, texts: -ids.float()  # noqa: E731
    out = F.g3_retrieve(
        queries, model.dense.embeddings, g.crow, g.col, g.val, k, seed_scorer=scorer, row_width=g.row_width, **opts
    )
    assert_same(model(queries, k=k, seed_scorer=scorer), out)


def test_g3_diffuse_equals_the_sparse_product(corpus):
    emb, _ = corpus
    g = G3Retriever(emb).graph
    seeds = torch.tensor([[0, 5], [7, 7], [3, 60]])
    p = torch.zeros(3, g.num_nodes).scatter_add_(1, seeds, torch.full(seeds.shape, 0.5))
    y = F.g3_diffuse(g.crow, g.col, g.val, seeds, g.row_width)
    torch.testing.assert_close(y, (g.transition.to_dense().T @ p.T).T)


def test_minmax_normalize_masked_and_given_bounds():
    x = torch.tensor([[2.0, 4.0, 3.0, 100.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    assert torch.equal(F.minmax_normalize(x, mask), torch.tensor([[0.0, 1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    out = F.minmax_normalize(torch.tensor([0.0, 5.0, 10.0]), lo=torch.tensor(2.0), hi=torch.tensor(6.0), clip=True)
    assert torch.equal(out, torch.tensor([0.0, 0.75, 1.0]))


def test_csr_row_slots_pads_rows():
    rowptr = torch.tensor([0, 3, 3, 4])
    at, ok = F.csr_row_slots(rowptr, torch.tensor([[2, 0], [1, -1]]), 3, torch.tensor([[True, True], [True, False]]))
    assert ok.tolist() == [[[True, False, False], [True, True, True]], [[False] * 3, [False] * 3]]
    assert at[ok].tolist() == [3, 0, 1, 2]


def test_conformal_volume_has_one_home():
    from geograph import projection
    from geograph.geometry import isoperimetric

    assert projection.conformal_volume is isoperimetric.conformal_volume is F.conformal_volume


def test_solver_resolution_has_one_home():
    from geograph.transport.curvature import resolve_solver

    model = RicciFiltration()
    for dev in ("cpu", "meta"):
        assert model.resolved_solver(torch.device(dev)) == resolve_solver("auto", torch.device(dev))


def test_server_params_are_the_constructor_arguments():
    from geograph.serve.models import check_params, method_class, method_params

    for method, skip in (("maniscope", ()), ("ricci", ("scorer",)), ("iso", ("projection",)), ("g3", ())):
        sig = inspect.signature(method_class(method).__init__)
        kw = [n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY and n not in skip]
        assert kw and set(kw) <= set(method_params(method))
        check_params(method, {n: sig.parameters[n].default for n in kw})  # every one is accepted
    assert method_params("iso")[0] == "knn"
    assert "cert_tol" in method_params("ricci")


def test_server_config_sets_cert_tol(tmp_path):
    pytest.importorskip("yaml")
    pytest.importorskip("litserve")
    from geograph.data import DEMO_PATH
    from geograph.serve.config import load_config
    from geograph.serve.models import build_model

    cfg = load_config(
        ["--method", "ricci", "--corpus", str(DEMO_PATH), "--param", "cert_tol=0.01", "--param", "solver=sinkhorn"]
    )
    assert cfg.params == {"cert_tol": 0.01, "solver": "sinkhorn"}
    assert build_model(cfg.method, torch.zeros(3, 4), cfg.params).cert_tol == 0.01
    cfg = load_config(["--method", "ricci", "--corpus", str(DEMO_PATH), "--param", "cert_tol=null"])
    assert build_model(cfg.method, torch.zeros(3, 4), cfg.params).cert_tol is None
