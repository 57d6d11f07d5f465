"""Adding and removing passages of a G3Graph: T and the density equal the exact rebuild and numpy."""

import random

import numpy as np
import pytest
import torch
from test_updates import scifact_rows

from geograph import G3Graph
from geograph.graphs.g3_updates import g3_state


def numpy_transition(x: np.ndarray, band, beta: float, max_degree: int) -> np.ndarray:
    """G3's T by the formulas in numpy float64: density min-max, weights in the band, top max_degree."""
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = z @ z.T
    np.fill_diagonal(s, 0.0)
    raw = np.clip(s, 0, None).sum(1)
    rho = (raw - raw.min()) / (raw.max() - raw.min())
    inside = (s >= band[0]) & (s <= band[1])
    w = np.where(inside, s * np.sqrt(np.clip(1 - s * s, 0, None)), 0.0) * np.exp(-beta * rho)[None]
    t = np.zeros_like(w)
    for i in range(len(w)):
        order = np.lexsort((np.arange(len(w)), -w[i]))[:max_degree]
        keep = order[w[i, order] > 0]
        if keep.size:
            t[i, keep] = w[i, keep] / w[i, keep].sum()
    return t


def run(pool: torch.Tensor, start: int, steps: int, seed: int, width: int, **build):
    rnd = random.Random(seed)
    graph = G3Graph.build(pool[:start], **build)
    graph.set_ids([f"p{i}" for i in range(start)])
    g3_state(graph, width=width)
    current = {f"p{i}": i for i in range(start)}
    nxt, reports = start, []
    for step in range(steps):
        if step % 2 == 0:
            m = min(rnd.randint(1, 30), len(pool) - nxt)
            reports.append(graph.add(pool[nxt : nxt + m], [f"p{i}" for i in range(nxt, nxt + m)]))
            current.update({f"p{i}": i for i in range(nxt, nxt + m)})
            nxt += m
        else:
            gone = rnd.sample(sorted(current), rnd.randint(1, 30))
            reports.append(graph.remove(gone))
            for x in gone:
                del current[x]
    rows = torch.stack([pool[current[x]] for x in graph.passage_ids.ids])
    return graph, rows, reports


def check_equal(graph: G3Graph, rows: torch.Tensor, band, beta, max_degree):
    ref = G3Graph.build(rows, band=band, beta=beta, max_degree=max_degree)
    assert torch.allclose(graph.density, ref.density, atol=1e-5)
    assert torch.equal(graph.crow, ref.crow) and torch.equal(graph.col, ref.col)
    assert torch.allclose(graph.val, ref.val, atol=1e-5)
    want = numpy_transition(rows.double().numpy(), band, beta, max_degree)
    assert np.allclose(graph.transition.to_dense().double().numpy(), want, atol=1e-5)


@pytest.mark.parametrize("max_degree", [4, 12])
def test_random_updates_equal_rebuild(max_degree):
    gen = torch.Generator().manual_seed(max_degree)
    pool = torch.nn.functional.normalize(torch.randn(460, 16, generator=gen) + 0.4, dim=1)
    graph, rows, reports = run(pool, 300, 8, seed=1, width=3 * max_degree, max_degree=max_degree)
    check_equal(graph, rows, (0.1, 0.7), 0.4, max_degree)
    assert sum(r.certified for r in reports) > 0  # rows proven from their lists, not all recomputed


def test_scifact_updates_equal_rebuild():
    pool = scifact_rows()[:700]
    graph, rows, reports = run(pool, 500, 6, seed=2, width=32, max_degree=8, band=(0.1, 0.7), beta=0.7)
    check_equal(graph, rows, (0.1, 0.7), 0.7, 8)
    assert sum(r.redone for r in reports) < sum(r.num_nodes for r in reports)


def test_full_t_and_default_width():
    pool = torch.nn.functional.normalize(torch.randn(60, 6, generator=torch.Generator().manual_seed(3)), dim=1)
    graph = G3Graph.build(pool[:50], max_degree=None, band=None)
    graph.add(pool[50:], list(range(50, 60)))
    graph.remove([0, 55])
    rows = pool[[i for i in range(60) if i not in (0, 55)]]
    ref = G3Graph.build(rows, max_degree=None, band=None)
    assert torch.equal(graph.col, ref.col) and torch.allclose(graph.val, ref.val, atol=1e-6)
    graph = G3Graph.build(pool[:50])  # every default: lists of DEFAULT_UPDATE_CANDIDATES
    graph.add(pool[50:], list(range(50, 60)))
    assert torch.equal(graph.col, G3Graph.build(pool).col)


def test_bad_input_is_one_line():
    pool = torch.nn.functional.normalize(torch.randn(20, 6), dim=1)
    graph = G3Graph.build(pool, max_degree=4)
    cases = [
        (lambda: graph.add(pool[:1], [3]), "already in the corpus"),
        (lambda: graph.add(pool[:1, :5], ["x"]), "D=6"),
        (lambda: graph.add(pool[:1].double(), ["x"]), "float64"),
        (lambda: graph.remove(["x"]), "not in the corpus"),
        (lambda: graph.remove(range(19)), "fewer than 2"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words) as err:
            call()
        assert "\n" not in str(err.value)
    assert graph.num_nodes == 20


def test_retriever_updates_answer_like_a_fresh_one():
    from geograph import G3Retriever

    pool = torch.nn.functional.normalize(torch.randn(90, 8, generator=torch.Generator().manual_seed(4)), dim=1)
    model = G3Retriever(G3Graph.build(pool[:80], max_degree=6))
    model.add(pool[80:], list(range(80, 90)))
    model.remove([2, 85])
    rows = pool[[i for i in range(90) if i not in (2, 85)]]
    fresh = G3Retriever(G3Graph.build(rows, max_degree=6))
    q = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    out, want = model(q, k=6), fresh(q, k=6)
    assert torch.equal(out.indices, want.indices) and torch.allclose(out.scores, want.scores, atol=1e-6)
    with pytest.raises(ValueError, match="fewer than candidates=10"):
        model.remove(list(range(3, 83)))
    assert model.graph.num_nodes == 88


def test_update_state_follows_to():
    pool = torch.nn.functional.normalize(torch.randn(70, 6, generator=torch.Generator().manual_seed(6)), dim=1)
    graph = G3Graph.build(pool[:60], max_degree=4)
    graph.add(pool[60:65], [60, 61, 62, 63, 64])
    graph = graph.to(torch.float64)
    assert graph.update_state.fvals.dtype == torch.float64
    graph.add(pool[65:].double(), [65, 66, 67, 68, 69])
    ref = G3Graph.build(pool.double(), max_degree=4)
    assert torch.equal(graph.col, ref.col) and torch.allclose(graph.val, ref.val, atol=1e-6)
