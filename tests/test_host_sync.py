"""No host read per iteration: the number of device-to-host reads of a call does not grow with
the number of solver iterations (PPR, Maniscope with ``early_stop=False``, ISO's hops and PPR
steps, G3).

On the CPU a host read is a Python-level conversion of a tensor (``item``, ``tolist``,
``bool``, ``int``, ``float``, ``index``, ``numpy``, ``torch.equal``): each is patched to
count its calls. A second, stronger check runs the modules on the "meta" device with the value
checks off (as under ``torch.compile``): a meta tensor has no data, so any host read raises.
"""

import collections
import contextlib

import pytest
import torch

import geograph._checks
import geograph.methods.iso.pagerank
import geograph.methods.maniscope.functional
from geograph import CorpusGraph, DenseRetriever, G3Retriever, ISORetriever, Maniscope
from geograph.functional import personalized_pagerank

READS = ["item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"]


@contextlib.contextmanager
def count_host_reads():
    counts = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in READS}
    saved_equal = torch.equal

    def wrap(name, fn):
        def counted(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    try:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, wrap(name, fn))
        torch.equal = wrap("torch.equal", saved_equal)
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.equal = saved_equal


def reads(fn):
    with count_host_reads() as counts:
        fn()
    return sum(counts.values())


def unit(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)


def ppr_inputs(b=3, n=12):
    g = torch.Generator().manual_seed(0)
    w = torch.rand(b, n, n, generator=g) * (torch.rand(b, n, n, generator=g) < 0.3)
    return w, torch.rand(b, n, generator=g)


def test_counter_sees_reads_in_a_loop():
    """The counter works: PPR with a tolerance checks it every 2 iterations (a read each)."""
    w, r = (t.double() for t in ppr_inputs())  # float64: not converged to the last bit in 40 steps
    few = reads(lambda: personalized_pagerank(w, r, max_iter=4, tol=1e-300, check_every=2))
    many = reads(lambda: personalized_pagerank(w, r, max_iter=40, tol=1e-300, check_every=2))
    assert many == few + 18


def test_pagerank_reads_do_not_grow_with_iterations():
    w, r = ppr_inputs()
    counts = [reads(lambda it=it: personalized_pagerank(w, r, max_iter=it)) for it in (1, 10, 200)]
    assert counts[0] == counts[1] == counts[2] and counts[0] <= 6, counts


def test_maniscope_reads_do_not_grow_with_relaxation_steps():
    """early_stop=False runs N - 1 relaxation steps: the reads are the input checks only."""
    counts = []
    for n in (5, 20, 80):
        q, docs = unit(2, 16, seed=1), unit(2, n, 16, seed=2)
        counts.append(reads(lambda q=q, docs=docs: Maniscope(k=3, early_stop=False)(q, docs)))
    assert counts[0] == counts[1] == counts[2] and counts[0] <= 6, counts
    # the default early stop does read (one comparison every 4 steps), and the counter sees it
    q, docs = unit(2, 16, seed=1), unit(2, 80, 16, seed=2)
    assert reads(lambda: Maniscope(k=3)(q, docs)) > counts[0]


def test_iso_reads_do_not_grow_with_hops_or_pagerank_steps():
    x = unit(120, 8, seed=3)
    graph = CorpusGraph.from_knn(x, 4)
    q = unit(4, 8, seed=4)
    counts = []
    for hops, it in [(1, 5), (1, 200), (3, 5)]:
        model = ISORetriever(graph, m=3, L=10, hops=hops, max_nodes=200, max_iter=it)
        counts.append(reads(lambda model=model: model(q, 5)))
    assert counts[0] == counts[1] == counts[2] and counts[0] <= 6, counts


def test_g3_reads_are_a_constant():
    x = unit(150, 8, seed=5)
    model = G3Retriever(x, max_degree=16)
    counts = [reads(lambda b=b, k=k: model(unit(b, 8, seed=6), k)) for b, k in [(1, 3), (16, 10)]]
    assert counts[0] == counts[1] and counts[0] <= 6, counts


@pytest.fixture
def value_checks_off(monkeypatch):
    """As under torch.compile: the NaN checks (host reads by nature) are skipped."""
    for module in (geograph._checks, geograph.methods.maniscope.functional, geograph.methods.iso.pagerank):
        monkeypatch.setattr(module, "tracing", lambda: True)


def test_forward_passes_run_on_meta_without_any_host_read(value_checks_off):
    meta = torch.device("meta")
    w, r = ppr_inputs()
    assert personalized_pagerank(w.to(meta), r.to(meta), max_iter=50).device == meta
    q, docs = unit(2, 16, seed=1).to(meta), unit(2, 30, 16, seed=2).to(meta)
    out = Maniscope(k=3, early_stop=False)(q, docs, torch.ones(2, 30, dtype=torch.bool, device=meta))
    assert out.scores.shape == (2, 30) and out.scores.device == meta
    x = unit(120, 8, seed=3)
    query = unit(4, 8, seed=4).to(meta)
    for model, k in [
        (DenseRetriever(x), 5),
        (ISORetriever(CorpusGraph.from_knn(x, 4), m=3, L=10, hops=2), 5),
        (G3Retriever(x, max_degree=16), 5),
    ]:
        res = model.to(meta)(query, k)
        assert res.indices.shape == (4, k) and res.indices.device == meta
