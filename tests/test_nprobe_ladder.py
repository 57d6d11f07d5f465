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
from geograph.knn.ivf_recall import choose_nprobe, recall_stderr
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


def row_found(z, p, rows, ref):
    """Per sampled row, the exact neighbours numpy finds in the join's lists at ``nprobe=p``."""
    got = ivf_self_topk(z, K, IVFOptions(nlist=NLIST, nprobe=p, refine=False)).indices.numpy()[rows]
    return torch.tensor([len(set(g) & set(r)) for g, r in zip(got, ref)])


def test_the_margin_asks_the_prediction_to_clear_the_target_by_row_standard_errors(data):
    z, rows, ref, centroids, assign = data
    r, e = torch.from_numpy(rows), torch.from_numpy(ref)
    plain, at = choose_nprobe(z, r, e, centroids, assign, 32, 0.95, lowest=1)
    margin = 2.0
    wide, at_wide = choose_nprobe(z, r, e, centroids, assign, 32, 0.95, lowest=1, margin=margin)
    valid = torch.full((len(rows),), K)
    # the goal is the target plus `margin` standard errors over the rows of numpy's counts at that nprobe
    se = recall_stderr(row_found(z, wide, rows, ref), valid)
    assert at_wide >= 0.95 + margin * se
    below = wide - 1
    assert below >= plain and join_recall(z, below, rows, ref) < 0.95 + margin * recall_stderr(
        row_found(z, below, rows, ref), valid
    )  # one cell fewer would not clear it
    binomial = (at_wide * (1 - at_wide) / ref.size) ** 0.5
    assert se > 1.2 * binomial  # a row's neighbours are missed together: wider than the binomial
    assert wide > plain  # the margin costs cells here: the check can fail


def test_recall_stderr_is_the_ratio_estimators_over_rows():
    g = torch.Generator().manual_seed(5)
    valid = torch.randint(3, 11, (300,), generator=g)
    found = (valid.double() * torch.rand(300, generator=g).pow(0.2)).floor().long()
    f, v = found.double().numpy(), valid.double().numpy()
    ratio = f.sum() / v.sum()
    want = np.sqrt(np.sum((f - ratio * v) ** 2) / (300 * 299)) * 300 / v.sum()
    assert recall_stderr(found, valid) == pytest.approx(want, rel=1e-12)
    same = torch.full((300,), 10)
    assert recall_stderr(torch.full((300,), 7), same) == 0.0  # every row alike: no spread
    assert recall_stderr(torch.tensor([3]), torch.tensor([10])) == 0.0  # one row: no estimate of spread


def test_the_default_margin_is_two_standard_errors():
    """The estimate that chose nprobe and the one that measures the result differ by about
    sqrt(2) standard errors: one standard error left a 0.95 target measured at 0.9495."""
    assert policy.RECALL_MARGIN_SE == 2.0


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


def test_the_joins_fewer_kmeans_iterations_keep_its_recall_at_every_nprobe(data):
    """The join's k-means stops after ``JOIN_KMEANS_NITER`` iterations (half the former 20): its
    predicted recall at each ``nprobe`` stays within the spread between k-means seeds (about 0.01
    here) of the 20-iteration cells'; 3 iterations lose 0.06-0.1 at one cell and fail this."""
    z, rows, ref, centroids, assign = data
    r, e = torch.from_numpy(rows), torch.from_numpy(ref)
    sample = policy.check_ivf(N, NLIST, 32, None)
    assert torch.equal(centroids, train_centroids(z, NLIST, sample=sample, seed=0, niter=policy.JOIN_KMEANS_NITER))
    full = train_centroids(z, NLIST, sample=sample, seed=0, niter=20)
    full_assign = tiled_topk(z, full, 1)[1].squeeze(1)
    for p in (1, 2, 4, 8):
        got = choose_nprobe(z, r, e, centroids, assign, p, 0.0, lowest=p)[1]
        want = choose_nprobe(z, r, e, full, full_assign, p, 0.0, lowest=p)[1]
        assert got >= want - 0.015, (p, got, want)
