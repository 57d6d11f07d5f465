"""The recall target's ``nprobe`` ladder: the least ``nprobe`` whose predicted recall meets the target is
chosen, checked against the recall numpy measures on the join's lists; the refining round runs only
where no prediction was made, so a target delivers about itself."""

import numpy as np
import pytest
import torch

from conftest import require
from geograph.knn import policy
from geograph.knn.allpairs import tiled_topk
from geograph.knn.faiss_ivf import train_centroids
from geograph.knn.ivf_join import ivf_self_topk
from geograph.knn.ivf_recall import choose_nprobe
from geograph.knn.policy import IVFOptions

require("faiss")

N, D, NLIST, K = 10_000, 24, 64, 10


def topics(n, d, seed):
    """Unit vectors around many topics: the default nprobe overshoots a moderate recall target."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((200, d))
    x = c[rng.integers(200, size=n)] + 0.9 * rng.standard_normal((n, d))
    return torch.from_numpy((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))


def np_neighbours(z, rows, k):
    x = z.numpy().astype(np.float64)
    s = x[rows] @ x.T
    s[np.arange(len(rows)), rows] = -np.inf
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def np_recall(indices, rows, ref):
    got = indices.numpy()[rows]
    return float(np.mean([len(set(g) & set(r)) / len(r) for g, r in zip(got, ref)]))


@pytest.fixture(scope="module")
def data():
    z = topics(N, D, seed=21)
    rows = np.sort(np.random.default_rng(22).choice(N, 1500, replace=False))
    ref = np_neighbours(z, rows, K)
    sample = policy.check_ivf(N, NLIST, 32, None)
    centroids = train_centroids(z, NLIST, sample=sample, seed=0)  # the join's own cells (same seed and sample)
    assign = tiled_topk(z, centroids, 1)[1].squeeze(1)
    return z, rows, ref, centroids, assign


def join_recall(z, p, rows, ref):
    """numpy's recall of the join's own lists at ``nprobe=p`` (no refining round: what the prediction models)."""
    return np_recall(ivf_self_topk(z, K, IVFOptions(nlist=NLIST, nprobe=p, refine=False)).indices, rows, ref)


def test_the_default_is_32_here_and_the_ladder_starts_at_one_cell():
    assert policy.default_join_nprobe(N, NLIST) == 32 and policy.LADDER_LOWEST == 1


@pytest.mark.parametrize("target", [0.9, 0.97])
def test_choose_nprobe_is_the_least_nprobe_whose_numpy_recall_meets_the_target(data, target):
    z, rows, ref, centroids, assign = data
    r, e = torch.from_numpy(rows), torch.from_numpy(ref)
    got, predicted = choose_nprobe(z, r, e, centroids, assign, 32, target, lowest=1)
    assert got is not None and 1 < got < 32, got  # the data puts the answer inside the ladder
    assert predicted == pytest.approx(join_recall(z, got, rows, ref), abs=1e-9)  # the prediction is numpy's
    assert predicted >= target > join_recall(z, got - 1, rows, ref)  # one cell fewer misses the target
    # without the descent the ladder starts at the default: 32 cells for any target it meets
    assert choose_nprobe(z, r, e, centroids, assign, 32, target)[0] == 32


def test_the_margin_asks_the_prediction_to_clear_the_target(data):
    z, rows, ref, centroids, assign = data
    r, e = torch.from_numpy(rows), torch.from_numpy(ref)
    plain, at = choose_nprobe(z, r, e, centroids, assign, 32, 0.95, lowest=1)
    se = (0.95 * 0.05 / ref.size) ** 0.5
    wide, at_wide = choose_nprobe(z, r, e, centroids, assign, 32, 0.95, lowest=1, margin=(at - 0.95) / se + 1)
    assert wide > plain and at_wide >= at + se  # the margin lifted the goal above what `plain` reached


def test_a_recall_target_delivers_about_the_target_without_refining(data):
    z, rows, ref, _, _ = data
    target = 0.95
    out = ivf_self_topk(z, K, IVFOptions(nlist=NLIST, recall_target=target))
    delivered = np_recall(out.indices, rows, ref)
    assert out.ivf.nprobe < 32 and not out.ivf.exact  # the default would have been 32
    assert "refine" not in out.seconds  # the join alone was predicted to reach the target
    assert target - 0.005 <= delivered <= target + 0.02, delivered  # about the target, not 0.999
    assert out.ivf.recall >= target - 0.01 and out.flops["join"] > 0
    full = np_recall(ivf_self_topk(z, K, IVFOptions(nlist=NLIST)).indices, rows, ref)
    assert full > delivered + 0.03  # the fixed default (32 cells, refined) pays for far more: the check can fail


def test_the_refining_round_runs_where_nothing_was_predicted(data):
    z = data[0]
    given = ivf_self_topk(z, K, IVFOptions(nlist=NLIST, nprobe=4, recall_target=0.95))
    assert given.ivf.nprobe == 4 and given.ivf.predicted_recall is None and "refine" in given.seconds
    assert "refine" in ivf_self_topk(z, K, IVFOptions(nlist=NLIST, nprobe=4)).seconds
    forced = ivf_self_topk(z, K, IVFOptions(nlist=NLIST, recall_target=0.95, refine=True))
    assert "refine" in forced.seconds and forced.ivf.predicted_recall is not None
