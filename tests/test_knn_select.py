"""The running top-k lists of the k-NN engine (the compiled heap kernel and its torch twin) against
``torch.topk`` / a stable sort on random and adversarial tiles, the IVF join and the G3 gain join
against the exact builds, and the arithmetic of the bench's rate report."""

import math

import numpy as np
import pytest
import torch

from geograph.bench.scale.peers import join_tile
from geograph.bench.scale.peers_compare import rate_report, verdicts
from geograph.geometry.gain import gain_edges, gain_rank
from geograph.knn import select
from geograph.knn.allpairs import sort_topk, tiled_pairs, tiled_topk
from geograph.knn.exact import exact_self_topk
from geograph.knn.ivf_join import _join_cell, ivf_self_topk
from geograph.knn.policy import IVFOptions
from geograph.knn.select import TileOffers, new_lists, offer_cols, offer_lists, offer_rows, offer_tile
from geograph.outputs import topk_stable

NEG = float("-inf")


@pytest.fixture(params=["kernel", "torch"])
def backend(request, monkeypatch):
    """Both ways of keeping the lists: the compiled kernel (CPU) and the torch merge (CUDA's path)."""
    if request.param == "torch":
        monkeypatch.setattr(select, "compiled", lambda t: False)
    return request.param


def reference(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k best finite scores, ties by lowest id, by a float64 stable sort (the rule of
    every geograph ranking); ``-inf`` / ``-1`` where a row has fewer than k finite scores."""
    s, i = scores.double().numpy(), ids.numpy()
    out_v = np.full((s.shape[0], k), NEG)
    out_i = np.full((s.shape[0], k), -1)
    for r in range(s.shape[0]):
        ok = np.isfinite(s[r])
        v, j = s[r][ok], i[r][ok]
        order = np.lexsort((j, -v))[:k]
        out_v[r, : len(order)], out_i[r, : len(order)] = v[order], j[order]
    return torch.from_numpy(out_v).to(scores.dtype), torch.from_numpy(out_i)


def tiled(scores: torch.Tensor, k: int, widths: list[int], exclude: torch.Tensor | None = None):
    """The scores offered to fresh lists tile by tile (column tiles of the given widths), then ordered."""
    n, c = scores.shape
    v, i = new_lists(n, k, scores)
    c0 = 0
    for w in widths:
        cols = torch.arange(c0, min(c, c0 + w))
        offer_rows(v, i, torch.arange(n), scores[:, c0 : c0 + w], cols, exclude=exclude)
        c0 += w
    assert c0 >= c
    return sort_topk(v, i)


def check(scores: torch.Tensor, k: int, widths: list[int], exclude: torch.Tensor | None = None):
    got_v, got_i = tiled(scores, k, widths, exclude)
    ranked = scores.clone()
    if exclude is not None:
        hit = exclude.unsqueeze(1) == torch.arange(scores.shape[1])
        ranked = ranked.masked_fill(hit, NEG)
    ref_v, ref_i = reference(ranked, torch.arange(scores.shape[1]).expand_as(scores), k)
    assert torch.equal(got_i, ref_i), (got_i, ref_i)
    assert torch.equal(got_v, ref_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 3, 10, 40])  # 40: longer than a sorted list, a heap
def test_random_tiles_equal_torch_topk(backend, dtype, k):
    g = torch.Generator().manual_seed(k)
    s = torch.randn(37, 230, generator=g, dtype=dtype)
    check(s, k, [64, 64, 64, 64])
    # no ties here: torch.topk itself gives the same lists
    tv, ti = s.topk(k, dim=1)
    gv, gi = tiled(s, k, [100, 130])
    assert torch.equal(gi, ti) and torch.equal(gv, tv)


def test_ties_keep_the_lowest_ids_whatever_the_tiling(backend):
    g = torch.Generator().manual_seed(1)
    s = torch.randint(0, 4, (50, 300), generator=g).float()  # four values: ties everywhere, also at the cut
    for widths in ([300], [1] * 300, [7] * 43, [150, 150], [299, 1]):
        check(s, 10, widths)
    # the order a tie arrives in does not matter: reversed column tiles, the same lists
    v, i = new_lists(50, 10, s)
    for c0 in reversed(range(0, 300, 30)):
        offer_rows(v, i, torch.arange(50), s[:, c0 : c0 + 30], torch.arange(c0, c0 + 30))
    ref = reference(s, torch.arange(300).expand_as(s), 10)
    assert torch.equal(sort_topk(v, i)[1], ref[1])
    assert torch.equal(topk_stable(s, 10)[1], ref[1])  # the rule of every geograph ranking


def test_minus_inf_nan_and_rows_with_fewer_than_k_candidates(backend):
    g = torch.Generator().manual_seed(2)
    s = torch.randn(20, 40, generator=g)
    s[s < 0.8] = NEG  # most rows keep fewer than 10 finite scores
    s[3] = NEG  # a row with no candidate at all
    s[4, :5] = float("nan") if backend == "kernel" else NEG  # NaN never enters the compiled lists
    check(s, 10, [16, 16, 8])
    v, i = tiled(s, 10, [40])
    assert (i[3] == -1).all() and torch.isinf(v[3]).all()
    assert ((i >= 0) == torch.isfinite(v)).all()  # an empty slot is -inf with id -1
    # k larger than the columns: every finite score is kept
    check(s[:, :6], 10, [3, 3])


def test_excluded_pairs_never_enter(backend):
    g = torch.Generator().manual_seed(3)
    s = torch.randn(30, 30, generator=g)
    s.fill_diagonal_(5.0)  # the row itself would win
    check(s, 4, [10, 10, 10], exclude=torch.arange(30))
    assert not (tiled(s, 4, [30], torch.arange(30))[1] == torch.arange(30).unsqueeze(1)).any()


def test_scaled_columns_round_as_a_torch_product(backend):
    g = torch.Generator().manual_seed(4)
    s, f = torch.rand(25, 60, generator=g), torch.rand(60, generator=g) + 0.5
    v, i = new_lists(25, 5, s)
    offer_rows(v, i, torch.arange(25), s, torch.arange(60), scale=f)
    ref = reference(s * f, torch.arange(60).expand_as(s), 5)
    got = sort_topk(v, i)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[0], ref[0])  # bitwise: one float32 rounding


def test_columns_side_equals_the_rows_side_of_the_transpose(backend):
    g = torch.Generator().manual_seed(5)
    s = torch.randint(0, 5, (40, 70), generator=g).float()
    f = torch.rand(40, generator=g) + 0.5
    pick = torch.tensor([0, 3, 4, 10, 11, 12, 40, 69])
    owners = torch.tensor([7, 2, 0, 1, 5, 6, 3, 4])
    ids = torch.arange(100, 140)
    v, i = new_lists(8, 6, s)
    offer_cols(v, i, s[:, :35], pick[pick < 35], owners[pick < 35], ids, scale=f)  # two tiles of rows' columns
    offer_cols(v, i, s[:, 35:], pick[pick >= 35] - 35, owners[pick >= 35], ids, scale=f)
    got = sort_topk(v, i)
    st = (s.T * f)[pick]
    ref = reference(st, ids.expand(len(pick), -1), 6)
    assert torch.equal(got[1][owners], ref[1]) and torch.equal(got[0][owners], ref[0])


@pytest.mark.parametrize("k", [1, 4, 12, 40])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("scaled", [False, True])
def test_a_join_tile_offers_both_sides(backend, k, threads, scaled):
    """One tile of a symmetric join (rows of a cell against its own and later cells' rows), offered
    in two row tiles through one :class:`TileOffers` and tile by tile through :func:`offer_tile`:
    each row's list is the top-k of its row (itself excluded), each later column's the top-k of its
    column, ties by lowest id, -inf and NaN never kept, whatever the threads' split."""
    g = torch.Generator().manual_seed(7 + k)
    n_rows, n_cols = 30, 80  # tile rows are ids 100..129; columns: the same 30, then 50 others
    rows = torch.arange(100, 100 + n_rows)
    cols = torch.cat([rows, torch.arange(200, 250)])
    s = torch.randint(0, 6, (n_rows, n_cols), generator=g).float()  # ties everywhere
    s[:, :n_rows] = torch.maximum(s[:, :n_rows], s[:, :n_rows].T)  # the own cell's block is symmetric
    s[2, 40:70] = NEG
    s[:, 45] = NEG  # a column with no candidate
    s[5, 50] = float("nan") if backend == "kernel" else NEG
    row_scale = torch.rand(n_rows, generator=g) + 0.5 if scaled else None
    col_scale = torch.rand(n_cols, generator=g) + 0.5 if scaled else None
    ranked_rows = s if col_scale is None else s * col_scale
    ranked_rows = ranked_rows.masked_fill(rows.unsqueeze(1) == cols, NEG)
    ranked_cols = (s.T if row_scale is None else s.T * row_scale)[n_rows:]
    want_rows = reference(ranked_rows, cols.expand(n_rows, -1), k)
    want_cols = reference(ranked_cols, rows.expand(n_cols - n_rows, -1), k)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for batched in (True, False):
            v, i = new_lists(260, k, s)
            with TileOffers(v, i) as offers:
                for r0, r1 in ((0, 13), (13, n_rows)):
                    kw = dict(
                        exclude_self=True,
                        row_scale=None if row_scale is None else row_scale[r0:r1],
                        col_scale=col_scale,
                    )
                    if batched:
                        offers.tile(s[r0:r1], rows[r0:r1], cols, n_rows, **kw)
                    else:
                        offer_tile(v, i, s[r0:r1], rows[r0:r1], cols, n_rows, **kw)
            got_v, got_i = sort_topk(v, i)
            assert torch.equal(got_i[rows], want_rows[1]) and torch.equal(got_v[rows], want_rows[0])
            others = cols[n_rows:]
            assert torch.equal(got_i[others], want_cols[1]) and torch.equal(got_v[others], want_cols[0])
            untouched = torch.ones(260, dtype=torch.bool)
            untouched[cols] = False
            assert (got_i[untouched] == -1).all()
    finally:
        torch.set_num_threads(before)


def test_a_join_tile_refuses_a_first_column_outside_it():
    v, i = new_lists(4, 2, torch.zeros(1))
    with pytest.raises(ValueError, match="first_col=5"):
        offer_tile(v, i, torch.zeros(2, 4), torch.arange(2), torch.arange(4), 5)
    with TileOffers(v, i) as offers, pytest.raises(ValueError, match="first_col=-1"):
        offers.tile(torch.zeros(2, 4), torch.arange(2), torch.arange(4), -1)


def test_partial_lists_merge_into_the_running_ones(backend):
    g = torch.Generator().manual_seed(6)
    s = torch.randint(0, 3, (12, 90), generator=g).float()
    a_v, a_i = new_lists(12, 5, s)
    offer_rows(a_v, a_i, torch.arange(12), s[:, :45], torch.arange(45))
    b_v, b_i = new_lists(12, 5, s)
    offer_rows(b_v, b_i, torch.arange(12), s[:, 45:], torch.arange(45, 90))
    offer_lists(a_v, a_i, torch.arange(12), b_v, b_i)
    ref = reference(s, torch.arange(90).expand_as(s), 5)
    assert torch.equal(sort_topk(a_v, a_i)[1], ref[1])


def test_the_kernel_keeps_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        v, i = new_lists(4, 2, torch.zeros(1))
        offer_rows(v, i, torch.arange(4), torch.rand(4, 9), torch.arange(9))
        assert torch.get_num_threads() == 1 and select.kernel_threads() == 1
    finally:
        torch.set_num_threads(before)


def clustered(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(12, d, generator=g)
    x = c[torch.randint(0, 12, (n,), generator=g)] + 0.5 * torch.randn(n, d, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


def test_every_cell_meeting_every_cell_is_the_exact_build_even_with_k_above_a_cell():
    z = clustered(600, 12, 7)
    z[10] = z[20]  # equal rows: exact ties across cells
    z[30] = z[20]
    ev, ei = tiled_topk(z, z, 20, exclude_self=True)
    out = ivf_self_topk(z, 20, IVFOptions(nlist=64, nprobe=64, refine=False))  # cells of ~9 rows, k = 20
    # the same pairs by products of other shapes: equal up to the last bits of a float32 sum
    assert torch.equal(out.indices, ei) and torch.allclose(out.values, ev, atol=1e-6)


def test_a_cell_join_over_hand_made_cells_with_one_row_and_empty_cells(backend):
    """The join of every cell with every later cell (one-row cells, an empty one) is the exact top-k."""
    z = clustered(40, 6, 8)
    z[5] = z[6]
    ptr = [0, 1, 1, 12, 13, 40]  # cells of 1, 0, 11, 1 and 27 rows
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0))
    pairs = [torch.arange(a, 5) for a in range(5)]  # every cell meets every later cell (and itself)
    zs = z[order]
    for k in (3, 12):
        shared = dict(zs=zs, order=order, ptr=ptr, pairs=pairs, k=k, block=8, transform=None, target=None)
        v, i = new_lists(40, k, z)
        with TileOffers(v, i) as offers:
            for a in range(5):
                _join_cell(shared, a, offers)
        ev, ei = tiled_topk(z, z, k, exclude_self=True)
        got = sort_topk(v, i)
        assert torch.equal(got[1], ei) and torch.allclose(got[0], ev, atol=1e-6)


def test_the_g3_join_equals_the_exact_build():
    z = clustered(700, 16, 9)
    target = torch.exp(-0.4 * torch.rand(700, generator=torch.Generator().manual_seed(1)))
    rank = gain_rank((0.1, 0.7))
    ref = exact_self_topk(z, 24, transform=rank, target=target)
    out = ivf_self_topk(z, 24, IVFOptions(nlist=16, nprobe=16, refine=False), transform=rank, target=target)
    assert torch.equal(out.indices, ref.indices) and torch.equal(out.values, ref.values)
    # the exact gain join runs on the kernel (several query tiles) and equals the one-tile torch build
    pen = torch.exp(-0.4 * torch.rand(700, generator=torch.Generator().manual_seed(2)))
    tiles = gain_edges(z, pen, band=(0.1, 0.7), max_degree=12, block=128)
    whole = gain_edges(z, pen, band=(0.1, 0.7), max_degree=12, block=1024)  # one query tile: topk_stable
    for a, b in ((tiles.crow, whole.crow), (tiles.cols, whole.cols), (tiles.vals, whole.vals)):
        assert torch.equal(a, b)


def test_the_exact_scan_on_the_kernel_equals_the_one_tile_scan():
    z = clustered(900, 10, 10)
    z[100] = z[200]
    v, i, sums = tiled_pairs(z, z, 7, block=200, exclude=True, row_sum=lambda s: s.clamp_min(0))
    v1, i1, sums1 = tiled_pairs(z, z, 7, block=900, exclude=True, row_sum=lambda s: s.clamp_min(0))
    assert torch.equal(i, i1) and torch.equal(v, v1) and torch.allclose(sums, sums1)


def test_rate_report_arithmetic():
    cfg = {
        "build_seconds": 20.0,
        "stages": {"train": 3.0, "assign": 1.0, "recall": 2.0, "join": 8.0, "own_probes": 2.0, "merge": 0.5},
        "flops": {"join": 4.0e11, "own_probes": 5.0e10},
        "matmul_gflops": 80.0,
    }
    r = rate_report(cfg)
    assert r["join GF/s"] == pytest.approx(50.0) and r["own GF/s"] == pytest.approx(25.0)
    assert r["join % matmul"] == pytest.approx(62.5)
    assert r["k-means"] == 3.0 and r["refine"] == 0.0 and r["other"] == pytest.approx(3.5)
    assert math.isnan(rate_report({"build_seconds": 1.0, "stages": {"exact": 1.0}})["join GF/s"])
    # the join's flops are 2 D per pair its cell pairs score: the mean tile recovers the pairs
    assert join_tile(200_000, 384, 1024, 2.0 * 384 * 200_000 * 6000) == (195, 6000)


def test_the_join_flops_count_the_pairs_it_scores(monkeypatch):
    from geograph.knn import ivf_join

    seen = []
    real = TileOffers.tile

    def counting(self, s, rows, cols, first_col, **kw):
        seen.append(s.numel())
        real(self, s, rows, cols, first_col, **kw)

    z = clustered(2000, 8, 11)
    monkeypatch.setattr(TileOffers, "tile", counting)
    monkeypatch.setattr(ivf_join, "_own_probes", lambda *a, **kw: 0)
    out = ivf_self_topk(z, 5, IVFOptions(nlist=32, nprobe=4, refine=False))
    assert out.flops["join"] == 2.0 * 8 * sum(seen)


def test_verdicts_need_the_target_reached_and_every_reaching_peer_slower():
    def cfg(builder, seconds, recall):
        return {"builder": builder, "threads": 2, "seconds": seconds, "recall": recall}

    res = {
        "threads": 2,
        "configs": {
            "geograph recall_target=0.95": cfg("geograph", 4.0, 0.951),
            "geograph recall_target=0.99": cfg("geograph", 7.0, 0.989),
            "faiss-ivf nprobe=8": cfg("faiss-ivf", 3.0, 0.94),
            "faiss-ivf nprobe=16": cfg("faiss-ivf", 5.0, 0.99),
            "faiss-hnsw efSearch=64": cfg("faiss-hnsw", 6.0, 0.996),
        },
    }
    v95, v99 = verdicts(res, [0.95, 0.99])
    assert v95["ahead"] and v95["fastest_peer"] == "faiss-ivf nprobe=16" and v95["peers_reaching"] == 2
    assert v99["ahead"] is False and not v99["reached"]  # 0.989 misses 0.99 although faster than one peer
    res["configs"]["faiss-ivf nprobe=12"] = cfg("faiss-ivf", 3.9, 0.96)
    assert verdicts(res, [0.95])[0]["ahead"] is False  # a faster peer reaching the target


@pytest.mark.parametrize("block", [4096, 150])
def test_sampled_exact_rows_on_the_kernel_equal_the_tiled_scan(block):
    """The reference lists of the recall estimate (sampled rows, also one query tile) are kept by the
    kernel and equal the tiled scan's, ties, a transform with ``-inf`` and a target factor included."""
    from geograph.knn import exact
    from geograph.knn.exact import exact_rows, pair_score

    z = (clustered(800, 12, 11) * 4).round() / 4  # coarse values: many equal scores
    z[300] = z[30]
    rows = torch.tensor([0, 30, 31, 300, 512, 799])
    rank = gain_rank((0.1, 0.9))
    target = torch.exp(-0.3 * torch.rand(800, generator=torch.Generator().manual_seed(3)))
    for transform, tgt in ((None, None), (rank, target)):
        v, i, _ = tiled_pairs(z[rows], z, 9, block=block, exclude=rows, score=pair_score(transform, tgt))
        want = torch.where(torch.isfinite(v), i, torch.full_like(i, -1))
        assert torch.equal(exact_rows(z, rows, 9, block, transform, tgt), want)
    assert exact.compiled(z)  # the kernel path ran (CPU float32)


@pytest.mark.parametrize(
    "options", [IVFOptions(nlist=32, nprobe=3, refine=False), IVFOptions(nlist=32, recall_target=0.9)]
)
def test_own_probes_kept_by_the_assignment_equal_the_recomputed_ones(monkeypatch, options):
    """The rows' own probes come from the assignment's kept nearest centroids (nprobe at most
    KEPT_PROBES) and give the lists the probes computed again in the own-probes stage give."""
    from geograph.knn import ivf_join

    z = clustered(3000, 16, 12)
    kept = ivf_self_topk(z, 8, options)
    assert kept.ivf.nprobe is not None and kept.ivf.nprobe <= ivf_join.KEPT_PROBES
    calls = []
    real = ivf_join.tiled_topk
    monkeypatch.setattr(ivf_join, "tiled_topk", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    monkeypatch.setattr(ivf_join, "KEPT_PROBES", 1)  # keep only the cell: the probes are computed again
    again = ivf_self_topk(z, 8, options)
    assert again.ivf.nprobe == kept.ivf.nprobe and kept.flops == again.flops
    assert calls[0] == 1 and kept.ivf.nprobe in calls[2:]  # assignment top-1, then the probes again
    assert torch.equal(kept.indices, again.indices) and torch.equal(kept.values, again.values)
