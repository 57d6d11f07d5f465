"""The recall target's ``nprobe`` ladder also descends: the smallest ``nprobe`` whose recall meets the
target is chosen, checked against the recall numpy measures on the join's lists at each ``nprobe``."""

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
LADDER = (8, 16, 32)  # a quarter, a half and the default (32 of 64 cells at this size)


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
    # numpy's recall of the join's own lists (no refining round: what the prediction models) at each nprobe
    recall = {
        p: np_recall(ivf_self_topk(z, K, IVFOptions(nlist=NLIST, nprobe=p, refine=False)).indices, rows, ref)
        for p in LADDER
    }
    return z, rows, ref, recall


def test_the_default_starts_the_ladder_at_32_here():
    assert policy.default_join_nprobe(N, NLIST) == 32 and 32 // policy.LADDER_DESCENT == 8


def test_choose_nprobe_is_the_smallest_nprobe_whose_numpy_recall_meets_the_target(data):
    z, rows, ref, recall = data
    assert recall[8] < recall[16] < recall[32]  # the data separates the rungs: the check can fail
    sample = policy.check_ivf(N, NLIST, 32, None)
    centroids = train_centroids(z, NLIST, sample=sample, seed=0)  # the join's own cells (same seed and sample)
    assign = tiled_topk(z, centroids, 1)[1].squeeze(1)
    r, e = torch.from_numpy(rows), torch.from_numpy(ref)
    targets = [recall[8], (recall[8] + recall[16]) / 2, recall[16], (recall[16] + recall[32]) / 2]
    for target in targets:
        want = min(p for p in LADDER if recall[p] >= target)
        got, predicted = choose_nprobe(z, r, e, centroids, assign, 32, target, lowest=8)
        assert got == want, (target, recall)
        assert predicted == pytest.approx(recall[want], abs=1e-9)  # the prediction is numpy's recall
    # without the descent the ladder starts at the default: 32 cells for any target it meets
    assert choose_nprobe(z, r, e, centroids, assign, 32, targets[0])[0] == 32


def test_a_recall_target_descends_below_the_default_and_still_meets_it(data):
    z, rows, ref, recall = data
    target = round((recall[8] + recall[16]) / 2, 4)
    assert recall[8] < target - 0.01 and recall[16] > target + 0.01  # clear of the sampling error
    out = ivf_self_topk(z, K, IVFOptions(nlist=NLIST, recall_target=target))
    assert out.ivf.nprobe == 16 and not out.ivf.exact  # the default would have been 32
    assert np_recall(out.indices, rows, ref) >= target
    assert out.ivf.recall >= target and out.flops["join"] > 0
    given = ivf_self_topk(z, K, IVFOptions(nlist=NLIST, nprobe=32, recall_target=target))
    assert given.ivf.nprobe == 32 and given.ivf.predicted_recall is None  # a given nprobe is kept
