"""The recall of IVF lists on sampled rows: predicted for any ``nprobe`` before the join, measured after.

Both compare with the exact lists of sampled rows
(:func:`~geograph.knn.exact.exact_rows`). Before the join, the cells of those exact
neighbours say which of them a join with ``nprobe`` cells would meet, so :func:`choose_nprobe`
picks the least ``nprobe`` whose predicted recall reaches a target; after it,
:func:`measure_recall` counts what the built lists found on other sampled rows
(:func:`sample_recall`). :class:`geograph.DenseRetriever` calibrates its query index's
``nprobe`` with the same two functions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from geograph.knn.allpairs import DEFAULT_BLOCK
from geograph.knn.exact import exact_rows
from geograph.knn.policy import IVFReport, Transform, log

__all__ = ["sample_recall", "choose_nprobe", "recall_stderr", "measure_recall"]


def sample_recall(indices: Tensor, rows: Tensor, exact: Tensor) -> float:
    """Share of the exact lists ``exact`` ``(R, k)`` of ``rows`` (``-1`` = none) found in ``indices[rows]``.

    Example:
        >>> sample_recall(torch.tensor([[1, 2], [0, 2], [0, 1]]), torch.tensor([0, 2]), torch.tensor([[2, 1], [1, -1]]))
        1.0
    """
    got = indices[rows]
    found = (exact.unsqueeze(2) == got.unsqueeze(1)).any(2) & (exact >= 0)
    return float(found.sum()) / max(1, int((exact >= 0).sum()))


def _ranks(sim: Tensor) -> Tensor:
    """Per row, the rank of each column by descending ``sim`` (ties: lowest column first)."""
    order = torch.sort(sim, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(sim.shape[1], device=sim.device).expand_as(order).contiguous())
    return ranks


def choose_nprobe(
    z: Tensor,
    rows: Tensor,
    exact: Tensor,
    centroids: Tensor,
    assign: Tensor,
    start: int,
    target: float,
    *,
    lowest: int | None = None,
    margin: float = 0.0,
) -> tuple[int | None, float]:
    """The least ``nprobe`` from ``lowest`` (default ``start``) up to ``max(start, nlist // 4)``
    whose join would meet at least ``target + margin`` of the sampled rows' exact neighbours
    (``margin`` in standard errors of that share, :func:`recall_stderr`: over the sampled rows,
    not the neighbours, since a row's neighbours are missed together); ``None`` if none would.

    A row in cell ``a`` meets a neighbour in cell ``c`` when ``c`` is among ``a``'s ``nprobe``
    nearest cells or ``a`` among ``c``'s (the join's cell pairs), or ``c`` among the row's own
    ``nprobe`` nearest centroids (its own probes): the smallest of those three ranks is the
    least ``nprobe`` that finds it, so the join's recall at every ``nprobe`` is one cumulative
    count (the join is exact on the pairs it scores: the prediction is its recall on these rows).

    Args:
        z: ``(N, D)`` rows.
        rows: ``(R,)`` the sampled rows.
        exact: ``(R, k)`` their exact neighbours (``-1`` = none).
        centroids: ``(nlist, D)`` the cells' centroids.
        assign: ``(N,)`` each row's cell.
        start: the default ``nprobe``; the ladder reaches at least it.
        target: the recall to reach.
        lowest: the least ``nprobe`` tried (default ``start``: the ladder only climbs).
        margin: standard errors the predicted recall must clear the target by.

    Returns:
        ``(nprobe, predicted recall at it)``; ``(None, the recall at the largest tried)`` when
        none reaches the target.

    Example:
        >>> z = torch.eye(4)
        >>> choose_nprobe(z, torch.tensor([0]), torch.tensor([[3]]), z, torch.arange(4), 1, 1.0)
        (None, 0.0)
    """
    nlist = centroids.shape[0]
    cell_rank = _ranks(centroids @ centroids.T)
    own_rank = _ranks(z[rows] @ centroids.T)
    ok = exact >= 0
    a = assign[rows].unsqueeze(1).expand_as(exact)
    c = assign[exact.clamp_min(0)]
    need = torch.minimum(torch.minimum(cell_rank[a, c], cell_rank[c, a]), own_rank.gather(1, c))
    need = need.masked_fill(a == c, 0).masked_fill(~ok, nlist + 1).cpu()
    valid = ok.sum(1).cpu()
    total = max(1, int(valid.sum()))
    floor = start if lowest is None else max(1, min(int(lowest), start))
    limit = min(nlist, max(start, nlist // 4))
    # found[p - 1]: the neighbours an nprobe of p meets (need < p), for p = 1 .. limit
    found = torch.bincount(need[ok.cpu()].clamp_max(limit), minlength=limit + 1)[:limit].cumsum(0)
    predicted = 1.0
    for p in range(floor, limit + 1):  # ascending; the predicted recall only grows with p
        predicted = float(found[p - 1]) / total
        if predicted >= min(1.0, target + margin * recall_stderr((need < p).sum(1), valid)):
            return p, predicted
    return None, predicted


def recall_stderr(found: Tensor, valid: Tensor) -> float:
    """The standard error of the recall ``sum(found) / sum(valid)`` of sampled rows, ``found[i]`` of
    row ``i``'s ``valid[i]`` exact neighbours found: the ratio estimator's
    ``sqrt(sum_i (found_i - r valid_i)^2 / (R (R - 1))) R / sum(valid)`` over the ``R`` rows.

    Why over rows: a row's neighbours are found or missed together (a row near a cell border
    misses several), so the binomial ``sqrt(r (1 - r) / m)`` over the ``m`` neighbours
    understates the spread of the estimate (measured at 200k Gaussian rows, a 0.95 target
    predicted one binomial standard error above it measured 0.9495 on other rows).

    Example:
        >>> round(recall_stderr(torch.tensor([10, 10, 0, 10]), torch.tensor([10, 10, 10, 10])), 4)
        0.25
    """
    rows = int(found.numel())
    m = float(valid.sum())
    if rows < 2 or m == 0.0:
        return 0.0
    r = float(found.sum()) / m
    dev = found.double() - r * valid.double()
    return math.sqrt(float((dev * dev).sum()) / (rows * (rows - 1))) * rows / m


def measure_recall(
    z: Tensor,
    indices: Tensor,
    rows: Tensor,
    k: int,
    *,
    nprobe: int | None,
    exact: bool,
    predicted: float | None,
    recall_target: float,
    block: int = DEFAULT_BLOCK,
    transform: Transform | None = None,
    target: Tensor | None = None,
    reference: Tensor | None = None,
) -> IVFReport:
    """The report of a join asked for ``recall_target``: the recall of its lists ``indices`` ``(N, k)``
    measured on the sampled ``rows`` (not those that chose ``nprobe``) against
    :func:`~geograph.knn.exact.exact_rows`, logged (a warning below the target); 1.0
    when the lists are ``exact`` (the fall-back: not measured). ``nprobe`` and ``predicted`` are
    what the join chose and predicted; ``reference``: the exact lists of ``rows`` when already
    computed (with those that chose ``nprobe``, in one pass over the rows).

    Example:
        >>> z = torch.eye(3)
        >>> measure_recall(z, torch.tensor([[1], [0], [0]]), torch.tensor([2]), 1, nprobe=1, exact=False,
        ...                predicted=None, recall_target=0.5).recall
        1.0
    """
    rows = rows.to(z.device)
    if not exact and reference is None:
        reference = exact_rows(z, rows, k, block, transform, target)
    recall = 1.0 if exact or reference is None else sample_recall(indices, rows, reference)
    if recall < recall_target:
        log.warning(
            "ivf join: measured recall %.4f on %d sampled rows is below recall_target %.3f (nprobe=%s)",
            recall,
            len(rows),
            recall_target,
            nprobe,
        )
    else:
        log.info("ivf join: recall %.4f on %d sampled rows (nprobe=%s)", recall, len(rows), nprobe)
    return IVFReport(
        nprobe=nprobe,
        exact=exact,
        predicted_recall=predicted,
        recall=recall,
        recall_rows=len(rows),
        recall_target=recall_target,
    )
