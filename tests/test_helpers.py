"""The shared helpers (one home each), against independent numpy/scipy code, and the
layering contract itself."""

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from geograph._checks import check_candidates
from geograph.geometry.isoperimetric import compatible_edges
from geograph.knn.allpairs import tiled_topk
from geograph.methods.maniscope.functional import maniscope_scores
from geograph.ops.adjacency import clean_edge_index, csr_rowptr, query_graph
from geograph.outputs import true_first

ROOT = Path(__file__).resolve().parents[1]


def np_topk(q, x, k, exclude_self=False):
    s = q @ x.T
    if exclude_self:
        np.fill_diagonal(s, -np.inf)
    idx = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, idx, 1), idx


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_chunked_topk_equals_a_stable_full_sort(chunk, exclude_self):
    rng = np.random.default_rng(chunk)
    x = rng.integers(-2, 3, size=(23, 4)).astype(np.float64)  # small integers: many exact ties
    q = x if exclude_self else rng.integers(-2, 3, size=(9, 4)).astype(np.float64)
    ref_s, ref_i = np_topk(q, x, 5, exclude_self)
    s, i = tiled_topk(torch.from_numpy(q), torch.from_numpy(x), 5, block=chunk, exclude_self=exclude_self)
    assert np.array_equal(i.numpy(), ref_i)
    assert np.array_equal(s.numpy(), ref_s)


def test_chunked_topk_of_no_query():
    s, i = tiled_topk(torch.zeros(0, 3), torch.randn(5, 3), 2, block=2)
    assert s.shape == (0, 2) and i.shape == (0, 2)


def test_true_first_and_csr_rowptr_against_numpy():
    rng = np.random.default_rng(0)
    m = rng.random((6, 11)) < 0.4
    ref = np.argsort(~m, axis=1, kind="stable")[:, :4]
    assert np.array_equal(true_first(torch.from_numpy(m), 4).numpy(), ref)
    rows = np.sort(rng.integers(0, 7, size=30))
    ptr = csr_rowptr(torch.from_numpy(rows), 9).numpy()
    assert np.array_equal(ptr, np.searchsorted(rows, np.arange(10), side="left"))


def test_clean_edge_index_against_a_python_set():
    ei = torch.tensor([[0, 1, 1, 2, 3, 3, 0], [1, 0, 1, 0, 2, 2, 3]])
    ref = set()
    for u, v in ei.T.tolist():
        if u != v:
            ref |= {(u, v), (v, u)}
    out = clean_edge_index(ei, 5)
    assert [tuple(e) for e in out.T.tolist()] == sorted(ref)
    with pytest.raises(ValueError, match="edge_index holds node ids outside"):
        clean_edge_index(torch.tensor([[0], [5]]), 5)


def test_one_candidate_validation_for_every_caller():
    q, docs = torch.randn(2, 4), torch.randn(2, 3, 4)
    for bad, msg in [
        ((q[:1], docs), "docs must have shape"),
        ((q, docs.double()), "docs must have the dtype of query"),
        ((q, docs, torch.ones(2, 2, dtype=torch.bool)), "mask must have shape"),
        ((torch.full_like(q, float("nan")), docs), "query .* NaN"),
    ]:
        for fn in (check_candidates, query_graph, maniscope_scores):
            with pytest.raises(ValueError, match=msg):
                fn(*bad) if len(bad) == 3 else fn(*bad, None)


def test_names():
    from geograph.functional import ricci_flow
    from geograph.methods.iso.module import LocalSubgraph

    with pytest.raises(TypeError):
        compatible_edges(torch.tensor([[0], [1]]), torch.ones(2), 0.4)  # beta is keyword-only
    sub = LocalSubgraph(*(torch.zeros(1, 1),) * 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.mask = None
    import inspect

    assert "early_stop" in inspect.signature(ricci_flow).parameters


def test_layering_contract_is_kept():
    """The [tool.importlinter] contract of pyproject.toml (make test also runs lint-imports)."""
    pytest.importorskip("importlinter", reason="the dev extra")
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
