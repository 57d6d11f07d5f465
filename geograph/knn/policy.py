"""How a corpus-wide top-``k`` build is chosen and sized, and what it reports.

A build's candidate lists come from the exact tiled scan (:mod:`geograph.knn.exact`)
or from the IVF self-join (:mod:`geograph.knn.ivf_join`); :func:`resolve_index` picks
one (``"auto"``: exact up to :data:`AUTO_EXACT_MAX` passages), and
:func:`~geograph.knn.build.self_topk` runs it. The IVF sizes follow the corpus size
(:func:`default_join_nlist`, :func:`default_join_nprobe` for the self-join, :func:`default_nlist`
for the query index of :class:`geograph.DenseRetriever`) and are checked by :func:`check_ivf`.
:class:`IVFOptions` holds a join's settings, :class:`SelfTopk` and :class:`IVFReport` what it
returns.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from geograph._checks import check_positive_int

__all__ = [
    "INDEXES",
    "AUTO_EXACT_MAX",
    "DEFAULT_RECALL_TARGET",
    "DEFAULT_RECALL_ROWS",
    "MIN_POINTS_PER_CELL",
    "DEFAULT_POINTS_PER_CELL",
    "QUERY_POINTS_PER_CELL",
    "DEFAULT_JOIN_NPROBE",
    "LADDER_LOWEST",
    "RECALL_MARGIN_SE",
    "JOIN_KMEANS_NITER",
    "KEPT_PROBES",
    "MIN_JOIN_ROWS",
    "Transform",
    "resolve_index",
    "default_nlist",
    "default_join_nlist",
    "default_join_nprobe",
    "check_ivf",
    "IVFOptions",
    "IVFReport",
    "SelfTopk",
]

#: the candidate sources a corpus-wide build accepts
INDEXES = ("exact", "ivf", "auto")

#: the share of each row's exact top-``k`` an IVF build must find (estimated on sampled rows)
#: unless told otherwise (:attr:`IVFOptions.recall_target`)
DEFAULT_RECALL_TARGET = 0.98

#: rows sampled to choose ``nprobe`` for a recall target, and as many others to measure the result
DEFAULT_RECALL_ROWS = 1000

#: ``index="auto"`` builds exactly up to this many passages and with the IVF join above
#: (measured by ``geograph bench scale``: below it the exact tiled scan is about as fast)
AUTO_EXACT_MAX = 50_000

#: the logger of every corpus-wide top-``k`` build (choice, sizes, recall)
log = logging.getLogger("geograph.ann")

#: training points needed per centroid (faiss warns below 39)
MIN_POINTS_PER_CELL = 39

#: training points per cell of the self-join unless ``sample`` is given; the k-means time is
#: ``O(sample x nlist x D)``, so this bounds it at ``O(nlist^2 D)``
DEFAULT_POINTS_PER_CELL = 64

#: k-means iterations of the self-join's quantizer (faiss's ``Kmeans`` default is 25, geograph's
#: :func:`~geograph.knn.faiss_ivf.train_centroids` 20): measured at 50k rows of both ``bench
#: scale`` generators, the join's recall at every ``nprobe`` from 1 to 32 after 10 iterations is
#: within the spread between two k-means seeds of that after 20, at half the training time
JOIN_KMEANS_NITER = 10

#: training points per list of a query index (:class:`geograph.DenseRetriever`; faiss's own
#: cap): trained once, searched by every query, so the better quantizer pays
QUERY_POINTS_PER_CELL = 256

#: cells each cell of the self-join meets at least (the default ``nprobe``)
DEFAULT_JOIN_NPROBE = 32
#: with a recall target, the ``nprobe`` ladder is every count of cells from this one up to
#: ``max(default, nlist / 4)``: the least that is predicted to reach the target is chosen
LADDER_LOWEST = 1
#: the predicted recall must clear the target by this many standard errors of its estimate
#: (:func:`~geograph.knn.ivf_recall.recall_stderr`, over the sampled rows), so that the recall
#: measured on other rows is about the target and not below it by the luck of either sample
#: (the two estimates differ by about ``sqrt(2)`` standard errors; one binomial standard error
#: over the neighbours delivered 0.9495 for a 0.95 target on 200k Gaussian rows)
RECALL_MARGIN_SE = 2.0
#: the self-join's assignment keeps each row's this many nearest centroids (its cell first) when
#: ``nprobe`` is not given (or at most this): the rows' own probes reuse them when the chosen
#: ``nprobe`` is at most this, instead of scoring every row against every centroid again (a
#: longer list costs the assignment more: at 50k rows and 512 cells, keeping 8 added 0.05 CPU
#: seconds to its 0.25 and 16 added 0.14, while scoring again costs about the assignment)
KEPT_PROBES = 8
#: rows each row of the self-join meets at least by default (:func:`default_join_nprobe`)
MIN_JOIN_ROWS = 2560

#: an elementwise map of inner products that ranks a pair (``-inf`` = never ranked)
Transform = Callable[[Tensor], Tensor]


def resolve_index(index: str, n: int, what: str = "build") -> str:
    """``"exact"`` or ``"ivf"`` for ``index`` on ``n`` passages (``"auto"``: exact up to
    :data:`AUTO_EXACT_MAX`), logged.

    Example:
        >>> resolve_index("auto", 1000), resolve_index("auto", 10**6)
        ('exact', 'ivf')
    """
    if index not in INDEXES:
        raise ValueError(f"index must be one of {', '.join(map(repr, INDEXES))}, got {index!r}")
    if index == "auto":
        index = "exact" if n <= AUTO_EXACT_MAX else "ivf"
        log.info("%s: index='auto' chose %r for %d passages (exact up to %d)", what, index, n, AUTO_EXACT_MAX)
    return index


def default_nlist(n: int) -> int:
    """``nlist`` of a query index (:class:`geograph.DenseRetriever`) unless given: about
    ``4 sqrt(N)`` lists (a power of two), e.g. 4096 at 1M passages.

    Example:
        >>> default_nlist(1_000_000)
        4096
    """
    return _pow2(4.0 * math.sqrt(n))


def default_join_nlist(n: int) -> int:
    """``nlist`` of the self-join (:func:`~geograph.knn.ivf_join.ivf_self_topk`) unless given:
    about ``2 sqrt(N)`` cells (a power of two), e.g. 1024 at 200k and 2048 at 1M passages.

    Half the query index's: the join trains the quantizer on ``64 x nlist`` rows (time
    ``O(nlist^2 D)``) and joins cells of about ``N / nlist`` rows (time ``O(N^2 nprobe D / nlist)``);
    at 200k MiniLM-like vectors, 2048 cells spent 54 of 96 s training (``geograph bench scale``,
    ``docs/bench/scale.json``), and bigger cells probe a larger share of the corpus at the same
    ``nprobe`` (higher recall).

    Example:
        >>> default_join_nlist(200_000), default_join_nlist(1_000_000)
        (1024, 2048)
    """
    return _pow2(2.0 * math.sqrt(n))


def default_join_nprobe(n: int, nlist: int) -> int:
    """``nprobe`` of the self-join unless given: :data:`DEFAULT_JOIN_NPROBE` cells, or as many as
    hold :data:`MIN_JOIN_ROWS` rows where cells are small, at most ``nlist``.

    Why: a cell holds about ``N / nlist`` rows (``sqrt(N) / 2`` at the default ``nlist``), so 32
    cells are 15,600 rows at 1M passages but 1,300 on SciFact's 5,183, where G3's 128 kept
    edges a row are 2.5% of the corpus and reach far cells. Measured with MiniLM embeddings
    (``geograph bench scale``; SciFact test, 128 cells): at 32 cells k-NN edge recall 0.9973,
    G3 edge recall 0.977, same top-k as the exact graphs for 95.3% (ISO-RAG) / 94.3% (G3RAG)
    of the queries; at 64 cells (2,600 rows a row) 0.99984, 0.9976, 100% / 100%. From about
    80k passages on, the default is 32 (1M: 2,048 cells of ~490 rows).

    Example:
        >>> default_join_nprobe(1_000_000, 2048), default_join_nprobe(5183, 128), default_join_nprobe(1890, 64)
        (32, 64, 64)
    """
    return min(nlist, max(DEFAULT_JOIN_NPROBE, math.ceil(MIN_JOIN_ROWS * nlist / max(1, n))))


def _pow2(x: float) -> int:
    return max(1, 1 << int(round(math.log2(max(1.0, x)))))


def check_ivf(n: int, nlist: int, nprobe: int, sample: int | None, per_cell: int = DEFAULT_POINTS_PER_CELL) -> int:
    """Validate IVF options for ``n`` passages; returns the training sample size (default
    ``per_cell x nlist``, at most ``n``).

    Example:
        >>> check_ivf(10_000, 64, 8, None)
        4096
    """
    nlist = check_positive_int(nlist, "nlist")
    nprobe = check_positive_int(nprobe, "nprobe")
    if nlist > n:
        raise ValueError(f"nlist={nlist} exceeds the number of passages ({n}): use at most {n} cells")
    if nprobe > nlist:
        raise ValueError(f"nprobe={nprobe} exceeds nlist={nlist}: a cell cannot probe more cells than exist")
    need = MIN_POINTS_PER_CELL * nlist
    if sample is None:
        sample = min(n, per_cell * nlist)
    sample = check_positive_int(sample, "sample")
    if sample > n:
        raise ValueError(f"sample={sample} exceeds the number of passages ({n})")
    if sample < need and sample < n:
        raise ValueError(
            f"sample={sample} is too small to train nlist={nlist} cells (need at least "
            f"{MIN_POINTS_PER_CELL} x nlist = {need}): lower nlist or raise sample"
        )
    return sample


@dataclass(frozen=True)
class IVFOptions:
    """The settings of an IVF self-join (:func:`~geograph.knn.ivf_join.ivf_self_topk`);
    checked when the join runs, against the corpus size.

    Attributes:
        nlist: cells (default :func:`default_join_nlist`); ``nlist <= N``.
        nprobe: cells each cell is joined with (its own included), ``<= nlist`` (default
            :func:`default_join_nprobe`; with ``recall_target``, the least count of cells that
            is predicted to reach it, :data:`LADDER_LOWEST` up).
        sample: k-means training rows (default ``64 x nlist``, at most N; at least ``39 x nlist``).
        seed: the sample and the k-means seed.
        refine: one neighbours-of-neighbours round
            (:func:`~geograph.knn.nn_descent.refine_neighbours`); ``None`` (default): only where
            it pays, i.e. without a prediction (no ``recall_target``, or ``nprobe`` given), and
            never after the join alone is predicted to reach the target (the round would buy recall
            nobody asked for, at about a quarter of the build's time).
        recall_target: with ``nprobe`` left to its default, the share of each row's exact
            top-``k`` the join must find, in ``(0, 1]``; ``None``: ``nprobe`` as given or by
            default, nothing measured (see :func:`~geograph.knn.ivf_join.ivf_self_topk`).
        recall_rows: rows sampled for the choice of ``nprobe`` and as many for the measure
            (at most ``N``).

    Example:
        >>> IVFOptions(nlist=64, recall_target=0.95)
        IVFOptions(nlist=64, nprobe=None, sample=None, seed=0, refine=None, recall_target=0.95, recall_rows=1000)
    """

    nlist: int | None = None
    nprobe: int | None = None
    sample: int | None = None
    seed: int = 0
    refine: bool | None = None
    recall_target: float | None = None
    recall_rows: int = DEFAULT_RECALL_ROWS


@dataclass(frozen=True)
class IVFReport:
    """What an IVF self-join chose and measured.

    Attributes:
        nprobe: the cells each cell was joined with; ``None`` after a fall-back to the exact scan.
        exact: the lists came from the exact scan (no ``nprobe`` up to ``nlist / 4`` cells was
            predicted to reach ``recall_target``).
        predicted_recall: the recall the sampled rows predicted for the chosen ``nprobe``
            (``None`` when ``nprobe`` was given or no ``recall_target`` was asked).
        recall: the recall measured on other sampled rows (1.0 by construction after the
            fall-back; ``None`` without ``recall_target``).
        recall_rows: the rows that measured it (``None`` without ``recall_target``).
        recall_target: the target asked for (``None``: none).

    Example:
        >>> IVFReport(nprobe=32, exact=False).as_dict()
        {'nprobe': 32, 'exact': False}
    """

    nprobe: int | None
    exact: bool
    predicted_recall: float | None = None
    recall: float | None = None
    recall_rows: int | None = None
    recall_target: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The keys a build records (``build_info``): ``nprobe`` and ``exact``, then
        ``predicted_recall`` when it was predicted and ``recall``, ``recall_rows``,
        ``recall_target`` when the recall was measured."""
        out: dict[str, Any] = {"nprobe": self.nprobe, "exact": self.exact}
        if self.predicted_recall is not None:
            out["predicted_recall"] = self.predicted_recall
        if self.recall is not None:
            out.update(recall=self.recall, recall_rows=self.recall_rows, recall_target=self.recall_target)
        return out


@dataclass(frozen=True)
class SelfTopk:
    """Every row's top-``k`` other rows (:func:`~geograph.knn.build.self_topk`).

    Attributes:
        values: ``(N, k)`` scores, best first (ties: lowest index); ``-inf`` where a row has
            fewer than ``k`` candidates.
        indices: ``(N, k)`` long row ids, ``-1`` in those slots.
        seconds: wall-clock seconds of each stage, in the order they first ran (the exact scan:
            ``exact``; the IVF join: ``train``, ``assign``, ``recall``, ``join``,
            ``own_probes``, ``merge``, ``refine``, or ``exact`` after its fall-back).
        ivf: what the IVF join chose and measured; ``None`` for the exact scan.
        flops: floating-point operations of the pair scores of each IVF stage (``join``:
            ``2 D`` per pair of rows its cell pairs score; ``own_probes``: the same for the rows'
            own probes), to set against the stage's seconds; empty for the exact scan.
        cells: the IVF join's ``(centroids (nlist, D), assign (N,))``, every row's cell, kept so
            that a graph's updates scan the same cells without training them again; ``None``
            for the exact scan (and after the join's fall-back to it).
    """

    values: Tensor
    indices: Tensor
    seconds: dict[str, float]
    ivf: IVFReport | None = None
    flops: dict[str, float] = field(default_factory=dict)
    cells: tuple[Tensor, Tensor] | None = None


class StageClock:
    """Seconds since the last call, added up per stage name in :attr:`seconds` (first-run order)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.last = time.perf_counter()

    def reset(self) -> None:
        """Start the next stage now (the time since the last call was recorded elsewhere)."""
        self.last = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now
