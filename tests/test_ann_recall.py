"""The IVF join's recall target: ``nprobe`` chosen from sampled rows' exact neighbours, the exact
fallback, and the measured recall, against brute-force numpy neighbours of the raw vectors."""

import logging

import numpy as np
import pytest
import torch

from conftest import require
from geograph import CorpusGraph
from geograph.graphs.g3_graph import G3Graph
from geograph.knn import policy
from geograph.knn.allpairs import tiled_topk
from geograph.knn.faiss_ivf import train_centroids
from geograph.knn.ivf_join import ivf_self_topk
from geograph.knn.ivf_recall import choose_nprobe, sample_recall
from geograph.knn.policy import IVFOptions

require("faiss")


def gaussian(n, d, seed=0):
    """Unit vectors of an isotropic Gaussian: no topics, the IVF join's hard case."""
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True))


def np_neighbours(z, rows, k):
    """Exact top-k other rows of ``rows`` by numpy (ties lowest index first)."""
    x = z.numpy().astype(np.float64)
    s = x[rows] @ x.T
    s[np.arange(len(rows)), rows] = -np.inf
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def np_recall(indices, rows, ref):
    got = indices[torch.as_tensor(rows)].numpy()
    return float(np.mean([len(set(g) & set(r)) / len(r) for g, r in zip(got, ref)]))


@pytest.fixture(scope="module")
def hard():
    return gaussian(30_000, 24)


@pytest.mark.slow
def test_recall_target_raises_nprobe_until_the_join_finds_enough(hard):
    rows = np.random.default_rng(5).choice(len(hard), 800, replace=False)
    ref = np_neighbours(hard, rows, 10)
    plain = ivf_self_topk(hard, 10, IVFOptions(recall_target=None)).indices
    out = ivf_self_topk(hard, 10, IVFOptions(recall_target=0.95))
    guarded, report = out.indices, out.ivf
    assert np_recall(plain, rows, ref) < 0.95  # the default nprobe misses on this data: the check can fail
    assert report.nprobe > policy.default_join_nprobe(len(hard), policy.default_join_nlist(len(hard)))
    assert report.predicted_recall >= 0.95 and not report.exact
    assert np_recall(guarded, rows, ref) >= 0.95
    assert abs(report.recall - np_recall(guarded, rows, ref)) < 0.02  # its own measure agrees with numpy's
    assert report.recall_rows == policy.DEFAULT_RECALL_ROWS


@pytest.mark.slow
def test_predicted_recall_is_the_joins_recall_before_refining(hard):
    """The prediction is exact for the join: a neighbour is found iff its cell is met."""
    n, nlist = len(hard), policy.default_join_nlist(len(hard))
    rows = torch.from_numpy(np.sort(np.random.default_rng(6).choice(n, 500, replace=False)))
    ref = torch.from_numpy(np_neighbours(hard, rows.numpy(), 10))
    centroids = train_centroids(hard, nlist, sample=policy.check_ivf(n, nlist, 32, None), seed=0)
    assign = tiled_topk(hard, centroids, 1)[1].squeeze(1)
    for nprobe in (8, 32, 64):
        p, predicted = choose_nprobe(hard, rows, ref, centroids, assign, nprobe, 0.0)
        joined = ivf_self_topk(hard, 10, IVFOptions(nlist=nlist, nprobe=nprobe, refine=False)).indices
        assert p == nprobe
        assert predicted == pytest.approx(sample_recall(joined, rows, ref), abs=1e-12)


def test_recall_out_of_reach_falls_back_to_the_exact_scan(caplog):
    z = gaussian(8_000, 16, seed=1)
    with caplog.at_level(logging.INFO, logger="geograph.ann"):
        out = ivf_self_topk(z, 10, IVFOptions(nlist=64, recall_target=0.9999))
    v, i, report = out.values, out.indices, out.ivf
    assert list(out.seconds) == ["train", "assign", "recall", "exact"]
    assert report.exact and report.nprobe is None and report.recall == 1.0 and 0 < report.predicted_recall < 0.9999
    assert report.as_dict() == {
        "nprobe": None,
        "exact": True,
        "predicted_recall": report.predicted_recall,
        "recall": 1.0,
        "recall_rows": policy.DEFAULT_RECALL_ROWS,
        "recall_target": 0.9999,
    }
    ev, ei = tiled_topk(z, z, 10, exclude_self=True)
    assert torch.equal(i, ei) and torch.equal(v, ev)
    assert "exact tiled scan" in caplog.text


def test_a_given_nprobe_is_kept_and_its_recall_measured_with_a_warning(hard, caplog):
    with caplog.at_level(logging.WARNING, logger="geograph.ann"):
        report = ivf_self_topk(hard, 10, IVFOptions(nprobe=4, recall_target=0.99)).ivf
    assert report.nprobe == 4 and report.predicted_recall is None and "predicted_recall" not in report.as_dict()
    assert report.recall < 0.99 and "below recall_target" in caplog.text


@pytest.mark.parametrize("value", [0, 1.5, -0.1])
def test_bad_recall_target_names_it(value):
    with pytest.raises(ValueError, match="recall_target must be in"):
        ivf_self_topk(gaussian(500, 8), 5, IVFOptions(recall_target=value))


@pytest.mark.slow
def test_builders_record_the_chosen_nprobe_and_the_measured_recall(hard):
    g = CorpusGraph.from_knn(hard, 10, index="ivf")
    info = g.build_info
    assert info["recall"] >= policy.DEFAULT_RECALL_TARGET and info["recall_target"] == policy.DEFAULT_RECALL_TARGET
    rows = np.random.default_rng(7).choice(len(hard), 300, replace=False)
    ref = np_neighbours(hard, rows, 10)
    src, dst = g.edge_index.numpy()
    hits = sum(len(set(dst[src == r]) & set(want)) for r, want in zip(rows, ref))
    assert hits / ref.size >= policy.DEFAULT_RECALL_TARGET - 0.01
    g3 = G3Graph.build(hard[:12_000], index="ivf", max_degree=16, candidates=20)
    assert g3.build_info["recall"] >= policy.DEFAULT_RECALL_TARGET
    assert "nprobe" in g3.build_info and "recall_rows" in g3.build_info


def held_out_recall(retriever, z, queries, k=20):
    x = z.numpy().astype(np.float64)
    ref = np.argsort(-(queries.numpy().astype(np.float64) @ x.T), axis=1, kind="stable")[:, :k]
    got = retriever(queries, k).indices.numpy()
    return float(np.mean([len(set(g) & set(r)) / k for g, r in zip(got, ref)]))


def test_dense_auto_nprobe_reaches_the_target_on_held_out_queries():
    from geograph import DenseRetriever

    z, queries = gaussian(20_000, 24, seed=3), gaussian(300, 24, seed=4)
    fixed = DenseRetriever(z, index="ivf", nlist=256, nprobe=4)
    auto = DenseRetriever(z, index="ivf", nlist=256)
    assert "nprobe='auto'" in repr(auto)
    assert held_out_recall(fixed, z, queries) < 0.9  # too few lists on this data: the check can fail
    rec = held_out_recall(auto, z, queries)
    cal = auto.calibration
    assert cal["nprobe"] == auto.nprobe > 4 and cal["recall"] >= 0.99 and cal["recall_k"] == 20
    assert rec >= 0.98, rec  # queries the calibration never saw, against numpy's exact lists
    auto.load_state_dict(auto.state_dict())  # a new corpus may need other lists: chosen again
    assert auto.nprobe is None and auto.calibration is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nprobe": "many"}, "nprobe must be a positive integer or 'auto'"),
        ({"recall_target": 0.0}, "recall_target must be in"),
        ({"recall_k": 0}, "recall_k"),
    ],
)
def test_dense_bad_calibration_options_name_them(kwargs, match):
    from geograph import DenseRetriever

    with pytest.raises(ValueError, match=match):
        DenseRetriever(gaussian(2000, 8), index="ivf", nlist=16, **kwargs)


def test_train_centroids_default_sample_is_the_documented_one():
    """``sample=None`` trains on ``64 x nlist`` rows (at most N), as the docstring says (it used to raise)."""
    z = gaussian(3000, 8, seed=2)
    got = train_centroids(z, 8)
    want = train_centroids(z, 8, sample=min(3000, policy.DEFAULT_POINTS_PER_CELL * 8))
    assert torch.equal(got, want) and got.shape == (8, 8)
    np.testing.assert_allclose(got.norm(dim=1).numpy(), 1.0, atol=1e-5)  # spherical k-means: unit centroids
    assert not torch.equal(got, train_centroids(z, 8, sample=400))  # the sample matters: the check can fail
