"""Compiled Ricci drivers (numba, float64, CPU): Ollivier-Ricci curvature per edge and the normalized flow.

The kernels here are private: the exact path of :func:`geograph.functional.ollivier_ricci`
(:func:`curvature_batch`) and of :func:`geograph.functional.ricci_flow` (:func:`flow_batch`: the
whole flow in one call) wrap them with torch tensors at the boundary;
:func:`geograph.functional.exact_flow_stats` reports the work of the simplex.

Per graph, the all-pairs shortest paths and the lazy measures (:func:`_apsp_measures`); per edge
``(x, y)``, the Kantorovich-Rubinstein compaction of ``W1(m_x, m_y)`` (:func:`_kr_compact`) solved
by the transportation simplex of :mod:`geograph.transport._numba.simplex` in one
:class:`~geograph.transport._numba.simplex.Workspace` per chunk of edges (:func:`_edge_kappa`);
per flow step, every graph's update (:func:`_flow_step`, the twin of the torch loop's
``geograph.transport.flow._flow_step``). In the flow, each edge's simplex starts from its
optimal basis of the previous step, kept in a :class:`~geograph.transport._numba.simplex.WarmStore`
(the warm start is described in that module's docstring), and all graphs and then all edges of
a step run in parallel (``prange``); the threads, the GIL and the cache follow the rules of
:mod:`geograph.transport._numba.simplex` and :mod:`geograph.transport._numba.runtime`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import prange

# GraphRicciCurvature's thresholds (one home: transport/_numba/grc.py): d(x, y) below _DIST_EPS gives
# curvature 0; a neighbour weight sum at or below _WEIGHT_SUM_EPS falls back to the uniform measure
from geograph.transport._numba.grc import DIST_EPS as _DIST_EPS
from geograph.transport._numba.grc import WEIGHT_SUM_EPS as _WEIGHT_SUM_EPS
from geograph.transport._numba.runtime import jit, locked
from geograph.transport._numba.simplex import (
    STATUS_OK,
    WarmStore,
    Workspace,
    _load_hint,
    _save_basis,
    _simplex,
    _warm_basis,
    _warm_store,
    _workspace,
    num_chunks,
)
from geograph.transport._numba.simplex_stats import (
    N_STATS,
    STAT_DUAL,
    STAT_PIVOTS,
    STAT_PROBLEMS,
    STAT_WARM,
    SimplexStats,
)

# |m_x(v) - m_y(v)| at or below this puts v in neither support: rounding noise of the lazy
# measures (sums of a few exp terms) is a few ulps, and a spurious tiny support only adds work
_SUPPORT_EPS = 8 * np.finfo(np.float64).eps


# --- results of the entry points -------------------------------------------------------------------------------------
class FlowResult(NamedTuple):
    """:func:`flow_batch`: lengths and curvature ``(B, n, n)``, steps taken ``(B,)``, converged
    ``(B,)`` bool, stuck ``(B,)`` (problems left at the pivot cap) and the simplex's work."""

    lengths: np.ndarray
    curvature: np.ndarray
    steps: np.ndarray
    converged: np.ndarray
    stuck: np.ndarray
    stats: SimplexStats


class CurvatureResult(NamedTuple):
    """:func:`curvature_batch`: curvature and status ``(E,)`` per edge, and the simplex's work."""

    curvature: np.ndarray
    status: np.ndarray
    stats: SimplexStats


# --- Python entry points (under the process-wide kernel lock) --------------------------------------------------------
def flow_batch(
    lengths: np.ndarray,
    adj: np.ndarray,
    node_mask: np.ndarray,
    *,
    alpha: float,
    exp_power: float,
    iterations: int,
    step: float,
    delta: float,
    max_pivots: int,
    warm_start: bool = True,
    nchunk: int | None = None,
) -> FlowResult:
    """The whole normalized Ricci flow of a batch of graphs in one compiled call.

    Args: ``lengths (B, n, n)`` float64, ``adj (B, n, n)`` bool, ``node_mask (B, n)`` bool, all
    C-contiguous; ``warm_start=False`` solves every problem cold (for comparisons); ``nchunk``
    defaults to :func:`num_chunks`. See :func:`_flow_batch`.
    """
    nchunk = num_chunks() if nchunk is None else nchunk
    out = _run_flow(lengths, adj, node_mask, alpha, exp_power, iterations, step, delta, max_pivots, warm_start, nchunk)
    return FlowResult(*out[:5], stats=SimplexStats.from_counts(out[5]))


def curvature_batch(
    lengths: np.ndarray,
    adj: np.ndarray,
    node_mask: np.ndarray,
    edges: np.ndarray,
    *,
    alpha: float,
    exp_power: float,
    max_pivots: int,
    nchunk: int | None = None,
) -> CurvatureResult:
    """Ollivier-Ricci curvature of the edges ``(E, 3)`` int64 ``(graph, x, y)`` (see :func:`_curvature_batch`)."""
    kappa, status, counts = _run_curvature(
        lengths, adj, node_mask, edges, alpha, exp_power, max_pivots, num_chunks() if nchunk is None else nchunk
    )
    return CurvatureResult(kappa, status, SimplexStats.from_counts(counts))


# --- the compiled kernels --------------------------------------------------------------------------------------------
@jit(parallel=True, nogil=True)
def _flow_batch(
    w0: np.ndarray,
    adj: np.ndarray,
    node_mask: np.ndarray,
    alpha: float,
    exp_power: float,
    iterations: int,
    step: float,
    delta: float,
    max_pivots: int,
    warm_start: bool,
    nchunk: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The whole normalized Ricci flow of every graph (see ``flow.ricci_flow``) in one call.

    Per graph: ``kappa(w)``; then up to ``iterations`` times ``w <- w - step * kappa * w``,
    ``w <- w * |E| / sum(w)``, ``kappa <- kappa(w)``, stopping after the step whose curvature
    spread is below ``delta``. Each step runs the graphs' distances and measures in parallel,
    then every edge of every graph still flowing in parallel (so one graph uses every thread
    too); with ``warm_start`` each edge's simplex starts from its previous optimal basis.
    Returns lengths ``(B, n, n)``, curvature ``(B, n, n)``, steps ``(B,)``, converged ``(B,)``,
    stuck ``(B,)`` (problems left at the pivot cap) and the per-chunk statistics ``(chunks, 4)``.
    """
    nb: int
    n: int
    nb, n, _ = w0.shape
    # the edges of every graph: graph g owns edges first[g] .. first[g + 1]
    first = _edge_offsets(adj, node_mask)
    ne = first[nb]
    graph_of = np.empty(ne, dtype=np.int64)
    ex = np.empty(ne, dtype=np.int64)
    ey = np.empty(ne, dtype=np.int64)
    w = np.zeros((nb, n, n))
    for g in prange(nb):
        _list_edges(g, adj[g], node_mask[g], first[g], graph_of, ex, ey)
        for e in range(first[g], first[g + 1]):
            w[g, ex[e], ey[e]] = w0[g, ex[e], ey[e]]
            w[g, ey[e], ex[e]] = w0[g, ex[e], ey[e]]
    ke = np.zeros(ne)
    stuck_e = np.zeros(ne, dtype=np.int64)
    # (a namedtuple made outside a prange loop cannot be used inside it: numba's parfor lowering
    # fails to name its type; its arrays can, and the loop body rebuilds it)
    st_rows, st_cols, st_row_nodes, st_col_nodes, st_pot = _warm_store(ne if warm_start else 0, n)
    dist = np.empty((nb, n, n))
    meas = np.empty((nb, n, n))
    active = np.empty(nb, dtype=np.bool_)
    for g in range(nb):
        active[g] = first[g + 1] > first[g]  # a graph without edges does not flow
    converged = np.zeros(nb, dtype=np.bool_)
    steps = np.zeros(nb, dtype=np.int64)
    stats = np.zeros((max(1, min(ne, nchunk)), N_STATS), dtype=np.int64)
    nch = stats.shape[0]
    for it in range(iterations + 1):
        # (1) per graph: the flow step (after the first solve) and the distances and measures
        for g in prange(nb):
            if not active[g]:
                continue
            if it > 0:
                # stop after the step whose curvature spread is below delta (the curvature of
                # step it - 1 >= 1; the initial curvature is not tested, as in GraphRicciCurvature)
                if it > 1 and _spread(ke, first[g], first[g + 1]) < delta:
                    converged[g] = True
                    active[g] = False
                    continue
                _flow_step(w[g], ke, first[g], first[g + 1], ex, ey, step)
                steps[g] += 1
            _apsp_measures(w[g], adj[g], node_mask[g], alpha, exp_power, dist[g], meas[g])
        # (2) every edge of every active graph
        for ch in prange(nch):
            ws = _workspace(n)
            store = WarmStore(st_rows, st_cols, st_row_nodes, st_col_nodes, st_pot)
            for e in range(ch * ne // nch, (ch + 1) * ne // nch):
                g = graph_of[e]
                if active[g]:
                    ke[e], st = _edge_kappa(ws, store, stats[ch], dist[g], meas[g], ex[e], ey[e], e, max_pivots)
                    stuck_e[e] += st
    lengths = np.zeros((nb, n, n))
    kappa = np.zeros((nb, n, n))
    stuck = np.zeros(nb, dtype=np.int64)
    for g in prange(nb):
        if active[g] and steps[g] > 0:  # the last step's spread
            converged[g] = _spread(ke, first[g], first[g + 1]) < delta
        for e in range(first[g], first[g + 1]):
            stuck[g] += stuck_e[e]
            lengths[g, ex[e], ey[e]] = w[g, ex[e], ey[e]]
            lengths[g, ey[e], ex[e]] = w[g, ex[e], ey[e]]
            kappa[g, ex[e], ey[e]] = ke[e]
            kappa[g, ey[e], ex[e]] = ke[e]
    return lengths, kappa, steps, converged, stuck, stats


@jit(parallel=True, nogil=True)
def _curvature_batch(
    w: np.ndarray,
    adj: np.ndarray,
    node_mask: np.ndarray,
    edges: np.ndarray,
    alpha: float,
    exp_power: float,
    max_pivots: int,
    nchunk: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ollivier-Ricci curvature of every edge ``(g, x, y)`` of a batch of graphs.

    Kantorovich-Rubinstein: ``W1(m_x, m_y)`` is the transport of the positive part of
    ``m_x - m_y`` onto its negative part; ``kappa = 1 - W1 / d(x, y)``, 0 where
    ``d(x, y) < 1e-7``. Returns ``(E,)`` curvatures, ``(E,)`` statuses and the per-chunk
    statistics ``(chunks, 4)``.
    """
    nb, n, _ = w.shape
    ne = edges.shape[0]
    dist = np.empty((nb, n, n))
    meas = np.empty((nb, n, n))
    for g in prange(nb):
        _apsp_measures(w[g], adj[g], node_mask[g], alpha, exp_power, dist[g], meas[g])
    kappa = np.zeros(ne)
    status = np.zeros(ne, dtype=np.int64)
    nchunk = max(1, min(ne, nchunk))
    stats = np.zeros((nchunk, N_STATS), dtype=np.int64)
    for ch in prange(nchunk):
        ws = _workspace(n)
        no_store = _warm_store(0, n)
        for e in range(ch * ne // nchunk, (ch + 1) * ne // nchunk):
            g = edges[e, 0]
            kappa[e], status[e] = _edge_kappa(
                ws, no_store, stats[ch], dist[g], meas[g], edges[e, 1], edges[e, 2], e, max_pivots
            )
    return kappa, status, stats


_run_flow = locked(_flow_batch)
_run_curvature = locked(_curvature_batch)
# the compiled kernel behind each entry point (its signatures and compile options, for tests)
flow_batch.kernel = _flow_batch  # type: ignore[attr-defined]  # attributes set on the functions, for tests
curvature_batch.kernel = _curvature_batch  # type: ignore[attr-defined]


# --- per graph: edge lists, flow updates, distances and measures -----------------------------------------------------
@jit(nogil=True)
def _edge_offsets(adj: np.ndarray, node_mask: np.ndarray) -> np.ndarray:
    """``(B + 1,)`` offsets of each graph's edges ``i < j`` between real nodes in one edge list."""
    nb, n, _ = adj.shape
    first = np.zeros(nb + 1, dtype=np.int64)
    for g in range(nb):
        cnt = 0
        for i in range(n):
            if node_mask[g, i]:
                for j in range(i + 1, n):
                    if adj[g, i, j] and node_mask[g, j]:
                        cnt += 1
        first[g + 1] = first[g] + cnt
    return first


@jit(nogil=True)
def _list_edges(
    g: int, adj: np.ndarray, node_mask: np.ndarray, e: int, graph_of: np.ndarray, ex: np.ndarray, ey: np.ndarray
) -> None:
    """Graph ``g``'s edges ``(x, y)``, ``x < y``, into the edge list from position ``e``."""
    n = adj.shape[0]
    for i in range(n):
        if node_mask[i]:
            for j in range(i + 1, n):
                if adj[i, j] and node_mask[j]:
                    graph_of[e] = g
                    ex[e] = i
                    ey[e] = j
                    e += 1


@jit(nogil=True)
def _spread(ke: np.ndarray, e0: int, e1: int) -> float:
    """``max - min`` of the curvatures ``ke[e0:e1]`` of one graph."""
    lo = np.inf
    hi = -np.inf
    for e in range(e0, e1):
        lo = min(lo, ke[e])
        hi = max(hi, ke[e])
    return hi - lo


@jit(nogil=True)
def _flow_step(w: np.ndarray, ke: np.ndarray, e0: int, e1: int, ex: np.ndarray, ey: np.ndarray, step: float) -> None:
    """One graph's update ``w <- w - step * kappa * w``, then ``w <- w * |E| / sum(w)``; the torch
    loop's twin is ``geograph.transport.flow._flow_step`` (tested equal in ``tests/test_flow.py``)."""
    total = 0.0
    for e in range(e0, e1):
        v = w[ex[e], ey[e]] - step * ke[e] * w[ex[e], ey[e]]
        w[ex[e], ey[e]] = v
        total += v
    scale = (e1 - e0) / max(total, np.finfo(np.float64).tiny)
    for e in range(e0, e1):
        v = w[ex[e], ey[e]] * scale
        w[ex[e], ey[e]] = v
        w[ey[e], ex[e]] = v


@jit(nogil=True)
def _apsp_measures(
    w: np.ndarray,
    adj: np.ndarray,
    node_mask: np.ndarray,
    alpha: float,
    exp_power: float,
    dist: np.ndarray,
    meas: np.ndarray,
) -> None:
    """Floyd-Warshall distances and lazy measures of one graph (see ``curvature._measures``)."""
    n = w.shape[0]
    for i in range(n):
        for j in range(n):
            dist[i, j] = w[i, j] if adj[i, j] else np.inf
            meas[i, j] = 0.0
        if node_mask[i]:
            dist[i, i] = 0.0
    for k in range(n):
        for i in range(n):
            dik = dist[i, k]
            if dik == np.inf:
                continue
            for j in range(n):
                v = dik + dist[k, j]
                if v < dist[i, j]:
                    dist[i, j] = v
    for x in range(n):
        if not node_mask[x]:
            continue
        total = 0.0
        deg = 0
        for v in range(n):
            if adj[x, v]:
                deg += 1
                total += np.exp(-(w[x, v] ** exp_power))
        if deg == 0:
            meas[x, x] = 1.0
            continue
        for v in range(n):
            if adj[x, v]:
                if total > _WEIGHT_SUM_EPS:
                    meas[x, v] = (1.0 - alpha) * (np.exp(-(w[x, v] ** exp_power)) / total)
                else:
                    meas[x, v] = (1.0 - alpha) * (1.0 / deg)
        meas[x, x] = alpha


# --- per edge: compaction, warm start from the store, solve, store ---------------------------------------------------
@jit(nogil=True)
def _edge_kappa(
    ws: Workspace,
    store: WarmStore,
    stats: np.ndarray,
    dist: np.ndarray,
    meas: np.ndarray,
    x: int,
    y: int,
    e: int,
    max_pivots: int,
) -> tuple[float, int]:
    """Curvature ``1 - W1(m_x, m_y) / d(x, y)`` of edge ``e = (x, y)`` of one graph, and its status.

    With a non-empty ``store``, the simplex starts from the edge's basis of the previous call
    (when it has one) and the new optimal basis replaces it. ``stats`` (a chunk's row) counts
    the problem.
    """
    dxy = dist[x, y]
    if dxy < _DIST_EPS:
        return 0.0, STATUS_OK
    nr, nc, mp, mn = _kr_compact(ws, dist, meas, x, y, dxy)
    if nr == 0 or nc == 0:
        return 1.0, STATUS_OK
    keep = store.rows.shape[0] > 0
    warm = False
    if keep and store.rows[e] >= 0:
        _load_hint(ws, store, e, nr, nc)
        warm = _warm_basis(ws, store, e, nr, nc)
    w1, status, pivots, used, dual = _simplex(ws, nr, nc, max_pivots, warm)
    if keep:
        _save_basis(ws, store, e, nr, nc)
    stats[STAT_PROBLEMS] += 1
    stats[STAT_WARM] += used
    stats[STAT_PIVOTS] += pivots
    stats[STAT_DUAL] += dual
    # the costs were divided by d(x, y), so w1 is W1 / d(x, y) of the normalised parts; the
    # parts' masses mp = mn (up to rounding: their mean) scale it back to m_x - m_y
    return 1.0 - 0.5 * (mp + mn) * w1, status


@jit(nogil=True)
def _kr_compact(
    ws: Workspace, dist: np.ndarray, meas: np.ndarray, x: int, y: int, dxy: float
) -> tuple[int, int, float, float]:
    """Kantorovich-Rubinstein compaction of ``W1(m_x, m_y)`` into a problem in ``ws``.

    Rows: the nodes where ``m_x - m_y > 0`` (supplies normalised to 1), columns: where it is
    ``< 0``; costs ``d(r, c) / d(x, y)`` (0 between components: no mass crosses them).
    Returns ``(nr, nc, mp, mn)`` with ``mp``, ``mn`` the positive and negative masses.
    """
    supply, demand, row_node, col_node, cost = ws.supply, ws.demand, ws.row_node, ws.col_node, ws.cost
    n = dist.shape[0]
    nr = 0
    nc = 0
    mp = 0.0
    mn = 0.0
    for v in range(n):
        diff = meas[x, v] - meas[y, v]
        if diff > _SUPPORT_EPS:
            row_node[nr] = v
            supply[nr] = diff
            mp += diff
            nr += 1
        elif diff < -_SUPPORT_EPS:
            col_node[nc] = v
            demand[nc] = -diff
            mn -= diff
            nc += 1
    if nr == 0 or nc == 0:
        return nr, nc, mp, mn
    for i in range(nr):
        supply[i] /= mp
    for j in range(nc):
        demand[j] /= mn
    inv = 1.0 / max(dxy, _DIST_EPS)
    for i in range(nr):
        for j in range(nc):
            c = dist[row_node[i], col_node[j]]
            cost[i, j] = c * inv if c < np.inf else 0.0
    return nr, nc, mp, mn
