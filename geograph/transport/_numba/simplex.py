"""Compiled exact optimal transport for many small problems (numba, float64, CPU): the transportation simplex.

The kernels here are private: :func:`geograph.functional.emd` wraps :func:`emd_batch` with torch
tensors at the boundary, and the Ricci drivers (:mod:`geograph.transport._numba.ricci`: the
exact path of :func:`geograph.functional.ollivier_ricci` / :func:`geograph.functional.ricci_flow`)
solve each edge's transport problem with :func:`_simplex` in a :class:`Workspace`, warm-started
from a :class:`WarmStore`; :func:`geograph.functional.exact_flow_stats` reports the work of the
simplex (:class:`SimplexStats`).

Algorithm
---------
The transportation simplex (MODI / network simplex on the complete bipartite graph) for
supplies ``s`` on ``nr`` rows, demands ``d`` on ``nc`` columns and costs ``C (nr, nc)``. A basic
feasible solution is a spanning tree of ``nr + nc - 1`` cells over the row and column nodes.

* Cold start (:func:`_cold_start`): the matrix-minimum rule (cells in order of increasing cost;
  each allocation retires one row or column, so the cells always form a spanning tree).
* Primal simplex (:func:`_primal_simplex`): each pivot roots the tree at row 0
  (:func:`_root_tree`: potentials ``u_i + v_j = C_ij``, parent cells, depths), prices every cell
  (:func:`_entering_cell`, Dantzig's rule: the most negative reduced cost enters), traces the
  cycle that cell closes (:func:`_trace_cycle`), takes the largest feasible mass
  (:func:`_ratio_test`) and moves it (:func:`_augment`). Degenerate pivots (zero mass moved)
  are allowed; after ``max_pivots`` pivots Bland's rule takes over (it cannot cycle) and a
  further cap (:data:`_BLAND_PIVOTS_PER_CELL`, :data:`_BLAND_PIVOTS_BASE`) marks the problem
  that did not reach optimality (``STATUS_PIVOT_CAP``: the caller re-solves it with POT).

Warm starts (the flow)
----------------------
The problems of one edge change little from one flow step to the next, so each edge keeps its
optimal basis (in graph node ids) and potentials from the previous step in a
:class:`WarmStore`. The new problem starts from the cells of that basis whose row and column
are still a row and a column (a forest), completed into a spanning tree by the cells of least
reduced cost under the previous potentials (:func:`_load_hint`, :func:`_warm_basis`). Its flows
are solved on the tree (leaf peeling, :func:`_tree_flows`); negative ones are removed by dual
simplex steps (:func:`_dual_repair`), and the primal simplex finishes from there (usually at
once). Should the repair fail, the start is the matrix-minimum rule ordered by the previous
reduced costs. The optimum does not depend on the start, only the pivot count does (SciFact
query graphs: 1.25 primal pivots and 0.90 dual steps per problem, against 9.7 pivots cold).

Glossary
--------
=================  ==========================================================================
``nr``, ``nc``     rows (supply nodes) and columns (demand nodes) of the current problem
``nn``             tree nodes ``nr + nc``: node ``i < nr`` is row ``i``, node ``nr + j`` column ``j``
``kb``             basic cells ``nn - 1`` (the edges of the spanning tree)
cell ``k``         basic cell ``k``: row ``cell_row[k]``, column ``cell_col[k]``, mass ``cell_flow[k]``
``ie``, ``je``     row and column of the entering cell
``leave``          the basic cell that leaves the basis
``theta``          mass moved around the entering cell's cycle
``u``, ``v``       potentials (``pot``: rows then columns), ``u_i + v_j = C_ij`` on basic cells
reduced cost       ``C_ij - u_i - v_j``; the basis is optimal when none is below ``-tol``
hint               the potentials of the previous problem of the same edge (``hint_u``, ``hint_v``)
``g``, ``x``, ``y``  graph of a batch, the two end nodes of an edge (graph node ids)
``e``              edge (transport problem) index in the batch
``mp``, ``mn``     total positive and negative mass of ``m_x - m_y`` (equal up to rounding)
chunk              a contiguous run of problems solved by one ``prange`` iteration with one
                   :class:`Workspace`
=================  ==========================================================================

Workspace layout
----------------
A :class:`Workspace` (one per chunk, :func:`_workspace`) holds every array the solver writes
for one problem, each under the one name of its one use. ``n`` is its size: the most nodes a
problem can have, ``nr + nc <= n`` (a graph's Kantorovich-Rubinstein supports are disjoint
subsets of its ``n`` nodes; for :func:`emd_batch` ``n = R + C``).

=============  ============  ======  =========================================================
field          shape         dtype   holds (written by)
=============  ============  ======  =========================================================
supply         (n,)          f8      ``s[:nr]``, row masses (compaction)
demand         (n,)          f8      ``d[:nc]``, column masses (compaction)
row_node       (n,)          i8      ``[:nr]`` graph node (or index into ``a``) of each row
col_node       (n,)          i8      ``[:nc]`` graph node (or index into ``b``) of each column
cost           (n, n)        f8      ``[:nr, :nc]`` the problem's costs (compaction)
node_pos       (n,)          i8      graph node -> tree node, -1 if in neither support
                                     (:func:`_warm_basis`)
cell_row       (n,)          i8      ``[:kb]`` row of each basic cell
cell_col       (n,)          i8      ``[:kb]`` column of each basic cell
cell_flow      (n,)          f8      ``[:kb]`` mass on each basic cell
pot            (n,)          f8      ``[:nn]`` potentials of the current basis, rows then
                                     columns; after :func:`_simplex` those of the optimum
hint_u         (n,)          f8      ``[:nr]`` row potentials of the previous problem
hint_v         (n,)          f8      ``[:nc]`` column potentials of the previous problem
degree         (n + 1,)      i8      ``[:nn + 1]`` cells per tree node, then the CSR fill
                                     cursor (:func:`_build_tree`)
start          (n + 1,)      i8      ``[:nn + 1]`` CSR offsets into ``incident``
incident       (2 n,)        i8      ``[:2 kb]`` the cells at each node (each cell twice)
bfs_order      (n,)          i8      ``[:nn]`` tree nodes in BFS order from row 0
                                     (:func:`_root_tree`; parents come first)
parent         (n,)          i8      ``[:nn]`` the cell to each node's parent (-1 at the root)
depth          (n,)          i8      ``[:nn]`` BFS depth of each node (-1 before the walk)
side           (n,)          i8      ``[:nn]`` 1 below the split cell, 0 above
                                     (:func:`_split_sides`)
cycle          (n,)          i8      the cells of the entering cell's cycle (:func:`_trace_cycle`)
cycle_minus    (n,)          i8      1 where that cell loses ``theta``, 0 where it gains it
leaf_queue     (n,)          i8      ``[:nn]`` nodes with one open cell (:func:`_tree_flows`)
open_cells     (n,)          i8      ``[:nn]`` cells at each node whose flow is not yet set
cell_set       (n,)          i8      ``[:kb]`` 1 once a cell's flow is set
residual       (n,)          f8      ``[:nn]`` mass each node still has to send or receive
sort_keys      (n2,)         f8      ``[:nr nc]`` matrix-minimum order keys; ``n2`` =
                                     ``(n // 2) * ((n + 1) // 2)``, the most cells a problem
                                     with ``nr + nc <= n`` has (:func:`_cold_start`)
line_mass      (n,)          f8      ``[:nn]`` mass left on each row and column
retired        (n,)          i8      ``[:nn]`` 1 once a row or column is retired
union_root     (n,)          i8      ``[:nn]`` union-find parents (:func:`_warm_basis`)
=============  ============  ======  =========================================================

Solver statistics: each chunk adds into one row of an ``(chunks, 4)`` int64 array whose columns
are named in :mod:`geograph.transport._numba.simplex_stats`; the entry points sum it into a
:class:`~geograph.functional.SimplexStats`. A problem is counted when the simplex runs on it (an edge with
``d(x, y) <`` ``grc.DIST_EPS`` (1e-7) or an empty support has no problem).

Threads and the GIL
-------------------
All problems of a batch run in parallel (``prange`` over numba's thread pool). The kernels
are compiled with ``parallel=True`` and ``nogil=True``: the calling thread holds the GIL at no
point inside a kernel, so a server's other Python threads keep running during a solve. (numba
releases the GIL around each parallel region even without ``nogil``; ``nogil`` also releases
it for the serial code between them: the edge counting, allocations, the flow's step loop.
``tests/test_numba_runtime.py`` checks the flags and that another thread runs during a
solve.) The Python entry points :func:`emd_batch` here and
:func:`~geograph.transport._numba.ricci.curvature_batch`,
:func:`~geograph.transport._numba.ricci.flow_batch` run one kernel at a time per process (a lock,
:func:`geograph.transport._numba.runtime.locked`): each already uses every numba thread, and numba's
``workqueue`` threading layer cannot run parallel kernels launched from several threads at
once. Everything is compiled once and cached on disk where a writable directory exists (the
choice is in :func:`geograph.transport._numba.runtime.cache_info`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import prange

from geograph.transport._numba.runtime import jit, locked, numba_threads
from geograph.transport._numba.simplex_stats import N_STATS, STAT_PIVOTS, STAT_PROBLEMS, SimplexStats

# a problem's status: solved, or still open after the Bland phase's pivot cap
STATUS_OK = 0
STATUS_PIVOT_CAP = 1

_FLOW_TOL = 1e-12  # a warm tree's flow above -this counts as feasible (clamped to 0)
# a cell enters when its reduced cost is below -_PRICE_TOL * (1 + max |C|): potentials are sums
# of up to nr + nc costs, so round-off of that relative size must not look like an improvement
# (it would pivot forever at zero gain)
_PRICE_TOL = 1e-12
# Bland's rule cannot cycle, but its pivot count has no useful closed bound; after max_pivots
# Dantzig pivots it gets this many more before the problem is reported stuck (never reached on
# real or random problems; the count only guards against non-finite input)
_BLAND_PIVOTS_PER_CELL = 50
_BLAND_PIVOTS_BASE = 1000
# dual simplex steps a warm start may take per tree node before it is abandoned for a cold
# start (typical: 0.9 steps a problem in all); bounds the time a poor warm start can waste
_DUAL_STEPS_PER_NODE = 2
# chunks of problems per numba thread per kernel call: problems differ in size and pivots, so
# a few chunks a thread balance the load; a chunk allocates one workspace
_CHUNKS_PER_THREAD = 8


# --- the result of the entry point -----------------------------------------------------------------------------------
class EmdResult(NamedTuple):
    """:func:`emd_batch`: optimal cost and status ``(E,)`` per problem, and the simplex's work."""

    cost: np.ndarray
    status: np.ndarray
    stats: SimplexStats


# --- Python entry points (under the process-wide kernel lock) --------------------------------------------------------
def num_chunks() -> int:
    """Chunks of problems per kernel call: :data:`_CHUNKS_PER_THREAD` per numba thread."""
    return _CHUNKS_PER_THREAD * numba_threads()


def emd_batch(
    a: np.ndarray, b: np.ndarray, cost: np.ndarray, *, max_pivots: int, nchunk: int | None = None
) -> EmdResult:
    """Exact OT cost of every problem ``(a (E, R), b (E, C), cost (E, R, C))`` (see :func:`_emd_batch`)."""
    out, status, counts = _run_emd(a, b, cost, max_pivots, num_chunks() if nchunk is None else nchunk)
    return EmdResult(out, status, SimplexStats.from_counts(counts))


# --- the workspace types ---------------------------------------------------------------------------------------------
class Workspace(NamedTuple):
    """Every array the solver writes for one problem; layout in the module docstring."""

    supply: np.ndarray
    demand: np.ndarray
    row_node: np.ndarray
    col_node: np.ndarray
    cost: np.ndarray
    node_pos: np.ndarray
    cell_row: np.ndarray
    cell_col: np.ndarray
    cell_flow: np.ndarray
    pot: np.ndarray
    hint_u: np.ndarray
    hint_v: np.ndarray
    degree: np.ndarray
    start: np.ndarray
    incident: np.ndarray
    bfs_order: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    side: np.ndarray
    cycle: np.ndarray
    cycle_minus: np.ndarray
    leaf_queue: np.ndarray
    open_cells: np.ndarray
    cell_set: np.ndarray
    residual: np.ndarray
    sort_keys: np.ndarray
    line_mass: np.ndarray
    retired: np.ndarray
    union_root: np.ndarray


class WarmStore(NamedTuple):
    """Each edge's optimal basis and potentials from the previous flow step (``E`` edges of
    graphs of ``n`` nodes; zero-row arrays: nothing is kept).

    ``rows[e]``, ``cols[e]``: ``nr``, ``nc`` of edge ``e``'s last problem (-1: none yet);
    ``cell_row_node[e, :nr + nc - 1]`` / ``cell_col_node[e, ...]``: the graph nodes of the
    row and column of each of its optimal basic cells; ``pot[e]``: its optimal potential per
    graph node (NaN off the supports).
    """

    rows: np.ndarray
    cols: np.ndarray
    cell_row_node: np.ndarray
    cell_col_node: np.ndarray
    pot: np.ndarray


@jit(nogil=True)
def _workspace(n: int) -> Workspace:
    """A :class:`Workspace` for problems with ``nr + nc <= n`` (layout in the module docstring)."""
    i8 = np.int64
    return Workspace(
        supply=np.empty(n),
        demand=np.empty(n),
        row_node=np.empty(n, dtype=i8),
        col_node=np.empty(n, dtype=i8),
        cost=np.empty((n, n)),
        node_pos=np.empty(n, dtype=i8),
        cell_row=np.empty(n, dtype=i8),
        cell_col=np.empty(n, dtype=i8),
        cell_flow=np.empty(n),
        pot=np.empty(n),
        hint_u=np.empty(n),
        hint_v=np.empty(n),
        degree=np.empty(n + 1, dtype=i8),
        start=np.empty(n + 1, dtype=i8),
        incident=np.empty(2 * n, dtype=i8),
        bfs_order=np.empty(n, dtype=i8),
        parent=np.empty(n, dtype=i8),
        depth=np.empty(n, dtype=i8),
        side=np.empty(n, dtype=i8),
        cycle=np.empty(n, dtype=i8),
        cycle_minus=np.empty(n, dtype=i8),
        leaf_queue=np.empty(n, dtype=i8),
        open_cells=np.empty(n, dtype=i8),
        cell_set=np.empty(n, dtype=i8),
        residual=np.empty(n),
        sort_keys=np.empty((n // 2) * ((n + 1) // 2)),
        line_mass=np.empty(n),
        retired=np.empty(n, dtype=i8),
        union_root=np.empty(n, dtype=i8),
    )


@jit(nogil=True)
def _warm_store(ne: int, n: int) -> WarmStore:
    """A :class:`WarmStore` for ``ne`` edges of graphs of ``n`` nodes, every edge without a basis."""
    return WarmStore(
        np.full(ne, -1, dtype=np.int64),
        np.full(ne, -1, dtype=np.int64),
        np.full((ne, n), -1, dtype=np.int64),
        np.full((ne, n), -1, dtype=np.int64),
        np.full((ne, n), np.nan),
    )


# --- the compiled kernel ---------------------------------------------------------------------------------------------
@jit(parallel=True, nogil=True)
def _emd_batch(
    a: np.ndarray, b: np.ndarray, cost: np.ndarray, max_pivots: int, nchunk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact OT cost of every problem ``(a[e], b[e], cost[e])``; zero-mass entries are skipped.

    Args: ``a (E, R)``, ``b (E, C)``, ``cost (E, R, C)`` float64, C-contiguous.
    Returns: ``(E,)`` costs, ``(E,)`` int64 statuses and the per-chunk statistics ``(chunks, 4)``.
    """
    ne, rr, cc = cost.shape
    out = np.zeros(ne)
    status = np.zeros(ne, dtype=np.int64)
    nchunk = max(1, min(ne, nchunk))
    stats = np.zeros((nchunk, N_STATS), dtype=np.int64)
    if ne == 0:
        return out, status, stats
    for ch in prange(nchunk):
        ws = _workspace(rr + cc)  # a's and b's entries are separate nodes (rows and columns may share an index)
        for e in range(ch * ne // nchunk, (ch + 1) * ne // nchunk):
            nr, nc = _compact_dense(ws, a, b, cost, e)
            out[e], status[e], pivots, _, _ = _simplex(ws, nr, nc, max_pivots, False)
            if nr > 0 and nc > 0:
                stats[ch, STAT_PROBLEMS] += 1
                stats[ch, STAT_PIVOTS] += pivots
    return out, status, stats


_run_emd = locked(_emd_batch)
# the compiled kernel behind the entry point (its signatures and compile options, for tests)
emd_batch.kernel = _emd_batch  # type: ignore[attr-defined]  # an attribute set on the function, for tests


# --- per problem: dense compaction; a warm start from the store, and the store's update ------------------------------
@jit(nogil=True)
def _compact_dense(ws: Workspace, a: np.ndarray, b: np.ndarray, cost: np.ndarray, e: int) -> tuple[int, int]:
    """The positive entries of ``a[e] (R,)`` and ``b[e] (C,)`` as rows and columns of a problem
    in ``ws``, with their block of ``cost[e] (R, C)``. Returns ``(nr, nc)``."""
    supply, demand, row_node, col_node, sub = ws.supply, ws.demand, ws.row_node, ws.col_node, ws.cost
    nr = 0
    for i in range(a.shape[1]):
        if a[e, i] > 0:
            row_node[nr] = i
            supply[nr] = a[e, i]
            nr += 1
    nc = 0
    for j in range(b.shape[1]):
        if b[e, j] > 0:
            col_node[nc] = j
            demand[nc] = b[e, j]
            nc += 1
    for i in range(nr):
        for j in range(nc):
            sub[i, j] = cost[e, row_node[i], col_node[j]]
    return nr, nc


@jit(nogil=True)
def _load_hint(ws: Workspace, store: WarmStore, e: int, nr: int, nc: int) -> None:
    """``hint_u``, ``hint_v``: edge ``e``'s previous potentials on this problem's nodes.

    A node new to the supports gets the tightest dual-feasible value against the nodes that
    have one (``min_j C_ij - v_j`` for a row, ``min_i C_ij - u_i`` for a column).
    """
    cost, hint_u, hint_v, row_node, col_node = ws.cost, ws.hint_u, ws.hint_v, ws.row_node, ws.col_node
    pot = store.pot
    for i in range(nr):
        hint_u[i] = pot[e, row_node[i]]
    for j in range(nc):
        hint_v[j] = pot[e, col_node[j]]
    for i in range(nr):
        if np.isnan(hint_u[i]):
            u = np.inf
            for j in range(nc):
                if not np.isnan(hint_v[j]):
                    u = min(u, cost[i, j] - hint_v[j])
            hint_u[i] = u if u < np.inf else 0.0
    for j in range(nc):
        if np.isnan(hint_v[j]):
            v = np.inf
            for i in range(nr):
                v = min(v, cost[i, j] - hint_u[i])
            hint_v[j] = v


@jit(nogil=True)
def _warm_basis(ws: Workspace, store: WarmStore, e: int, nr: int, nc: int) -> bool:
    """A spanning tree of this problem in ``cell_row``, ``cell_col`` from edge ``e``'s stored basis.

    The stored cells whose row and column are still a row and a column here are kept (a
    forest); the tree is completed by the cells of least reduced cost ``C - hint_u - hint_v``
    that join two of its parts (Kruskal with a union-find). False if no finite cell completes
    it (non-finite hints; the caller then starts cold).
    """
    cost, hint_u, hint_v, cell_row, cell_col = ws.cost, ws.hint_u, ws.hint_v, ws.cell_row, ws.cell_col
    pos = ws.node_pos
    root = ws.union_root
    nn = nr + nc
    for v in range(pos.shape[0]):
        pos[v] = -1
    for i in range(nr):
        pos[ws.row_node[i]] = i
    for j in range(nc):
        pos[ws.col_node[j]] = nr + j
    for x in range(nn):
        root[x] = x
    k = 0
    for q in range(store.rows[e] + store.cols[e] - 1):
        a = pos[store.cell_row_node[e, q]]
        b = pos[store.cell_col_node[e, q]]
        if a < 0 or a >= nr or b < nr:
            continue
        ra = _find(root, a)
        rb = _find(root, b)
        if ra != rb:
            root[ra] = rb
            cell_row[k] = a
            cell_col[k] = b - nr
            k += 1
    while k < nn - 1:
        best = np.inf
        ie = -1
        je = -1
        for i in range(nr):
            ra = _find(root, i)
            for j in range(nc):
                if ra != _find(root, nr + j):
                    red = cost[i, j] - hint_u[i] - hint_v[j]
                    if red < best:
                        best = red
                        ie = i
                        je = j
        if ie < 0:
            return False
        root[_find(root, ie)] = _find(root, nr + je)
        cell_row[k] = ie
        cell_col[k] = je
        k += 1
    return True


@jit(nogil=True, inline="always")
def _find(root: np.ndarray, x: int) -> int:
    """Union-find root of ``x`` (path halving)."""
    while root[x] != x:
        root[x] = root[root[x]]
        x = root[x]
    return x


@jit(nogil=True)
def _save_basis(ws: Workspace, store: WarmStore, e: int, nr: int, nc: int) -> None:
    """Edge ``e``'s optimal basis (in graph node ids) and potentials into the store."""
    row_node, col_node, cell_row, cell_col, pot = ws.row_node, ws.col_node, ws.cell_row, ws.cell_col, ws.pot
    kb = nr + nc - 1
    store.rows[e] = nr
    store.cols[e] = nc
    for k in range(kb):
        store.cell_row_node[e, k] = row_node[cell_row[k]]
        store.cell_col_node[e, k] = col_node[cell_col[k]]
    for v in range(store.pot.shape[1]):
        store.pot[e, v] = np.nan
    for i in range(nr):
        store.pot[e, row_node[i]] = pot[i]
    for j in range(nc):
        store.pot[e, col_node[j]] = pot[nr + j]


# ---------------------------------------------------------------------------------------------
# the transportation simplex on one problem in a workspace
#
# Two kinds of function, for speed: those run once per problem (:func:`_simplex` and the five
# below it) take the workspace and name the fields they use once, at the top; those run once
# per pivot or per tree node (from :func:`_entering_cell` down) take only the plain arrays they
# read or write and are inlined into their callers (``inline="always"``). Handing the per-pivot
# calls the whole 29-array workspace, as real calls, made the batched EMD up to 1.5x slower than
# the loops written out in place; plain arrays alone still left it ~1.1x slower on one thread,
# inlined 0.95-0.97x (A/B against the original, same process and inputs; two threads on a
# loaded machine: 0.93-1.13x, the flows and curvature 0.93-1.05x).
# ---------------------------------------------------------------------------------------------
@jit(nogil=True)
def _simplex(ws: Workspace, nr: int, nc: int, max_pivots: int, warm_start: bool) -> tuple[float, int, int, bool, int]:
    """Exact min-cost transport of ``supply[:nr]`` to ``demand[:nc]`` at ``cost[:nr, :nc]``.

    With ``warm_start``, ``cell_row``, ``cell_col`` hold a spanning tree to start from and
    ``hint_u``, ``hint_v`` the potentials of a nearby problem: the tree's flows are solved and
    made feasible by :func:`_dual_repair`; failing that the start is :func:`_cold_start`
    ordered by the hint's reduced costs. Without it the start is :func:`_cold_start` by cost.
    Returns ``(total cost, status, pivots, warm start used, dual steps)``; the optimal basis is
    left in ``cell_row``, ``cell_col``, ``cell_flow`` and its potentials in ``pot[:nr + nc]``.
    """
    if nr == 0 or nc == 0:
        return 0.0, STATUS_OK, 0, False, 0
    if nr == 1 or nc == 1:
        return _single_line(ws, nr, nc), STATUS_OK, 0, False, 0
    dual = -1
    if warm_start and _tree_flows(ws, nr, nc):
        dual = _dual_repair(ws, nr, nc, _DUAL_STEPS_PER_NODE * (nr + nc))
    used = dual >= 0
    if not used:
        _cold_start(ws, nr, nc, warm_start)
    total, status, pivots = _primal_simplex(ws, nr, nc, max_pivots)
    return total, status, pivots, used, max(dual, 0)


@jit(nogil=True)
def _single_line(ws: Workspace, nr: int, nc: int) -> float:
    """A problem with one row or one column: every cell is basic and its flow forced; the
    potentials are 0 on the single line. Returns the total cost."""
    supply, demand, cost, pot = ws.supply, ws.demand, ws.cost, ws.pot
    cell_row, cell_col, cell_flow = ws.cell_row, ws.cell_col, ws.cell_flow
    tot = 0.0
    k = 0
    for i in range(nr):
        for j in range(nc):
            f = demand[j] if nr == 1 else supply[i]
            cell_row[k] = i
            cell_col[k] = j
            cell_flow[k] = f
            k += 1
            tot += f * cost[i, j]
    for i in range(nr):
        pot[i] = 0.0 if nr == 1 else cost[i, 0]
    for j in range(nc):
        pot[nr + j] = cost[0, j] if nr == 1 else 0.0
    return tot


@jit(nogil=True)
def _cold_start(ws: Workspace, nr: int, nc: int, hinted: bool) -> None:
    """Matrix-minimum rule: a spanning-tree basic feasible solution in ``cell_*``.

    With ``hinted``, cells are taken in order of their reduced cost ``C_ij - hint_u_i - hint_v_j``
    under the potentials of a nearby problem (its optimal basis has reduced cost 0, so the
    start rebuilds a feasible basis close to it) instead of ``C_ij``.
    """
    cost, hint_u, hint_v = ws.cost, ws.hint_u, ws.hint_v
    cell_row, cell_col, cell_flow = ws.cell_row, ws.cell_col, ws.cell_flow
    rem = ws.line_mass
    done = ws.retired
    nn = nr + nc
    ncell = nr * nc
    keys = ws.sort_keys[:ncell]
    for i in range(nr):
        for j in range(nc):
            keys[i * nc + j] = cost[i, j] - hint_u[i] - hint_v[j] if hinted else cost[i, j]
    order = np.argsort(keys, kind="quicksort")
    for i in range(nr):
        rem[i] = ws.supply[i]
    for j in range(nc):
        rem[nr + j] = ws.demand[j]
    for x in range(nn):
        done[x] = 0
    rows_left = nr
    cols_left = nc
    k = 0
    for q in range(ncell):
        cell = order[q]
        i = cell // nc
        j = cell - i * nc
        if done[i] != 0 or done[nr + j] != 0:
            continue
        x = min(rem[i], rem[nr + j])
        cell_row[k] = i
        cell_col[k] = j
        cell_flow[k] = x
        k += 1
        rem[i] -= x
        rem[nr + j] -= x
        if rows_left == 1 and cols_left == 1:
            break
        if rows_left == 1:
            done[nr + j] = 1
            cols_left -= 1
        elif cols_left == 1:
            done[i] = 1
            rows_left -= 1
        elif rem[i] <= rem[nr + j]:
            done[i] = 1
            rows_left -= 1
        else:
            done[nr + j] = 1
            cols_left -= 1


@jit(nogil=True)
def _tree_flows(ws: Workspace, nr: int, nc: int) -> bool:
    """Flows of the basis ``cell_row``, ``cell_col`` that meet the supplies and demands (leaf
    peeling; some may be < 0). Returns False when the cells do not form a spanning tree."""
    cell_row, cell_col, cell_flow = ws.cell_row, ws.cell_col, ws.cell_flow
    start, incident = ws.start, ws.incident
    rem = ws.residual
    left = ws.open_cells
    queue = ws.leaf_queue
    is_set = ws.cell_set
    nn = nr + nc
    kb = nn - 1
    _build_tree(nr, nn, cell_row, cell_col, ws.degree, start, incident)
    for i in range(nr):
        rem[i] = ws.supply[i]
    for j in range(nc):
        rem[nr + j] = ws.demand[j]
    tail = 0
    for x in range(nn):
        left[x] = start[x + 1] - start[x]
        if left[x] == 0:
            return False
        if left[x] == 1:
            queue[tail] = x
            tail += 1
    for k in range(kb):
        is_set[k] = 0
    head = 0
    placed = 0
    while head < tail:
        x = queue[head]
        head += 1
        if left[x] != 1:
            continue  # the last node (its remaining mass is the rounding residue)
        kk = -1
        for p in range(start[x], start[x + 1]):
            if is_set[incident[p]] == 0:
                kk = incident[p]
                break
        if kk < 0:
            return False
        is_set[kk] = 1
        placed += 1
        cell_flow[kk] = rem[x]
        y = _other_end(cell_row, cell_col, kk, x, nr)
        rem[y] -= rem[x]
        left[x] = 0
        left[y] -= 1
        if left[y] == 1:
            queue[tail] = y
            tail += 1
    return placed == kb


@jit(nogil=True)
def _dual_repair(ws: Workspace, nr: int, nc: int, max_steps: int) -> int:
    """Dual simplex steps until the basis ``cell_*`` is primal feasible.

    Returns the number of steps taken, or -1 when it is not feasible after ``max_steps``.

    Each step takes the most negative flow ``f`` of a cell ``k = (r, c)``, splits the tree at
    ``k`` into the part ``A`` holding row ``r`` and ``B`` holding column ``c``, and brings in the
    cell from a row of ``B`` to a column of ``A`` of least reduced cost (dual-feasibility kept,
    when the basis had it) with ``-f`` moved around its cycle, which empties ``k``.
    """
    cost, pot = ws.cost, ws.pot
    cell_row, cell_col, cell_flow = ws.cell_row, ws.cell_col, ws.cell_flow
    degree, start, incident = ws.degree, ws.start, ws.incident
    bfs_order, parent, depth, side = ws.bfs_order, ws.parent, ws.depth, ws.side
    cycle, cycle_minus = ws.cycle, ws.cycle_minus
    nn = nr + nc
    kb = nn - 1
    for step in range(max_steps):
        k = -1
        fmin = -_FLOW_TOL
        for kk in range(kb):
            if cell_flow[kk] < fmin:
                fmin = cell_flow[kk]
                k = kk
        if k < 0:
            for kk in range(kb):
                cell_flow[kk] = max(cell_flow[kk], 0.0)
            return step
        _root_tree(nr, nc, cost, cell_row, cell_col, pot, degree, start, incident, bfs_order, parent, depth)
        side_a = _split_sides(k, nr, nn, cell_row, cell_col, bfs_order, parent, side)
        ie, je = _entering_across(nr, nc, side_a, cost, pot, side)
        if ie < 0:
            return -1
        length = _trace_cycle(ie, je, nr, cell_row, cell_col, parent, depth, cycle, cycle_minus)
        _augment(length, -fmin, cycle, cycle_minus, cell_flow)
        cell_row[k] = ie
        cell_col[k] = je
        cell_flow[k] = -fmin
    return -1


@jit(nogil=True)
def _primal_simplex(ws: Workspace, nr: int, nc: int, max_pivots: int) -> tuple[float, int, int]:
    """Pivots from the basic feasible solution ``cell_*`` to an optimal one.

    Dantzig's rule for ``max_pivots`` pivots, then Bland's for at most
    ``_BLAND_PIVOTS_PER_CELL * nr * nc + _BLAND_PIVOTS_BASE`` more. Returns ``(total cost,
    status, pivots)``; ``pot`` holds the potentials of the last basis priced.
    """
    cost, pot = ws.cost, ws.pot
    cell_row, cell_col, cell_flow = ws.cell_row, ws.cell_col, ws.cell_flow
    degree, start, incident = ws.degree, ws.start, ws.incident
    bfs_order, parent, depth = ws.bfs_order, ws.parent, ws.depth
    cycle, cycle_minus = ws.cycle, ws.cycle_minus
    kb = nr + nc - 1
    cmax = 0.0
    for i in range(nr):
        for j in range(nc):
            cmax = max(cmax, abs(cost[i, j]))
    tol = _PRICE_TOL * (1.0 + cmax)
    status = STATUS_PIVOT_CAP
    pivots = 0
    for it in range(max_pivots + _BLAND_PIVOTS_PER_CELL * nr * nc + _BLAND_PIVOTS_BASE):
        bland = it >= max_pivots
        _root_tree(nr, nc, cost, cell_row, cell_col, pot, degree, start, incident, bfs_order, parent, depth)
        ie, je = _entering_cell(nr, nc, tol, bland, cost, pot)
        if ie < 0:
            status = STATUS_OK
            break
        pivots += 1
        length = _trace_cycle(ie, je, nr, cell_row, cell_col, parent, depth, cycle, cycle_minus)
        theta, leave = _ratio_test(length, nc, bland, cycle, cycle_minus, cell_row, cell_col, cell_flow)
        if leave < 0:  # no finite flow on the cycle (non-finite input): report as stuck
            break
        _augment(length, theta, cycle, cycle_minus, cell_flow)
        cell_row[leave] = ie
        cell_col[leave] = je
        cell_flow[leave] = theta
    total = 0.0
    for kk in range(kb):
        total += cell_flow[kk] * cost[cell_row[kk], cell_col[kk]]
    return total, status, pivots


# per pivot: plain arrays only, inlined (argument order: sizes and scalars, then arrays)
@jit(nogil=True, inline="always")
def _entering_cell(nr: int, nc: int, tol: float, bland: bool, cost: np.ndarray, pot: np.ndarray) -> tuple[int, int]:
    """Pricing: the cell of most negative reduced cost below ``-tol`` (Dantzig), or with
    ``bland`` the first such cell in row-major order; ``(-1, -1)`` when the basis is optimal."""
    best = -tol
    ie = -1
    je = -1
    for i in range(nr):
        ui = pot[i]
        for j in range(nc):
            red = cost[i, j] - ui - pot[nr + j]
            if red < best:
                best = red
                ie = i
                je = j
                if bland:
                    break
        if bland and ie >= 0:
            break
    return ie, je


@jit(nogil=True, inline="always")
def _entering_across(
    nr: int, nc: int, side_a: int, cost: np.ndarray, pot: np.ndarray, side: np.ndarray
) -> tuple[int, int]:
    """The cell from a row of ``B`` to a column of ``A`` (sides ``!= side_a`` and ``== side_a``)
    of least reduced cost, ``(-1, -1)`` if none is finite."""
    best = np.inf
    ie = -1
    je = -1
    for i in range(nr):
        if side[i] == side_a:
            continue
        ui = pot[i]
        for j in range(nc):
            if side[nr + j] == side_a:
                red = cost[i, j] - ui - pot[nr + j]
                if red < best:
                    best = red
                    ie = i
                    je = j
    return ie, je


@jit(nogil=True, inline="always")
def _root_tree(
    nr: int,
    nc: int,
    cost: np.ndarray,
    cell_row: np.ndarray,
    cell_col: np.ndarray,
    pot: np.ndarray,
    degree: np.ndarray,
    start: np.ndarray,
    incident: np.ndarray,
    bfs_order: np.ndarray,
    parent: np.ndarray,
    depth: np.ndarray,
) -> None:
    """Root the basic tree at row 0: ``pot`` (``u_i + v_j = C_ij``), ``parent``, ``depth`` and
    ``bfs_order`` (and the CSR arrays of :func:`_build_tree`)."""
    nn = nr + nc
    _build_tree(nr, nn, cell_row, cell_col, degree, start, incident)
    for x in range(nn):
        depth[x] = -1
    pot[0] = 0.0
    depth[0] = 0
    parent[0] = -1
    bfs_order[0] = 0
    head = 0
    tail = 1
    while head < tail:
        x = bfs_order[head]
        head += 1
        for p in range(start[x], start[x + 1]):
            kk = incident[p]
            r = cell_row[kk]
            c = nr + cell_col[kk]
            y = c if x == r else r
            if depth[y] < 0:
                depth[y] = depth[x] + 1
                parent[y] = kk
                pot[y] = cost[r, c - nr] - pot[x]
                bfs_order[tail] = y
                tail += 1


@jit(nogil=True, inline="always")
def _build_tree(
    nr: int,
    nn: int,
    cell_row: np.ndarray,
    cell_col: np.ndarray,
    degree: np.ndarray,
    start: np.ndarray,
    incident: np.ndarray,
) -> None:
    """CSR adjacency (``start``, ``incident``) of the ``nn - 1`` basic cells over the tree nodes."""
    for x in range(nn + 1):
        degree[x] = 0
    for k in range(nn - 1):
        degree[cell_row[k]] += 1
        degree[nr + cell_col[k]] += 1
    start[0] = 0
    for x in range(nn):
        start[x + 1] = start[x] + degree[x]
        degree[x] = start[x]  # from here: the next free slot of node x
    for k in range(nn - 1):
        r = cell_row[k]
        c = nr + cell_col[k]
        incident[degree[r]] = k
        degree[r] += 1
        incident[degree[c]] = k
        degree[c] += 1


@jit(nogil=True, inline="always")
def _split_sides(
    k: int,
    nr: int,
    nn: int,
    cell_row: np.ndarray,
    cell_col: np.ndarray,
    bfs_order: np.ndarray,
    parent: np.ndarray,
    side: np.ndarray,
) -> int:
    """``side``: 1 for the nodes below cell ``k`` in the rooted tree, 0 for the others.
    Returns the side of the part ``A`` that holds cell ``k``'s row."""
    for q in range(nn):  # BFS order visits parents first
        x = bfs_order[q]
        if x == 0:
            side[x] = 0
        elif parent[x] == k:
            side[x] = 1
        else:
            side[x] = side[_other_end(cell_row, cell_col, parent[x], x, nr)]
    side_a: int = 1 - side[nr + cell_col[k]]
    return side_a


@jit(nogil=True, inline="always")
def _trace_cycle(
    ie: int,
    je: int,
    nr: int,
    cell_row: np.ndarray,
    cell_col: np.ndarray,
    parent: np.ndarray,
    depth: np.ndarray,
    cycle: np.ndarray,
    cycle_minus: np.ndarray,
) -> int:
    """The cycle that cell ``(ie, je)`` closes on the rooted tree, into ``cycle[:length]``.

    Climbs from row ``ie`` and column ``je`` to their common ancestor (the deeper side first);
    on each side the cells alternate -, +, -, ... from the end, the entering cell itself being
    +: ``cycle_minus`` is 1 on the cells that lose mass. Returns the length.
    """
    x = ie
    y = nr + je
    px = 0
    py = 0
    length = 0
    while x != y:
        if depth[x] >= depth[y]:
            kk = parent[x]
            cycle_minus[length] = px % 2 == 0
            px += 1
            x = _other_end(cell_row, cell_col, kk, x, nr)
        else:
            kk = parent[y]
            cycle_minus[length] = py % 2 == 0
            py += 1
            y = _other_end(cell_row, cell_col, kk, y, nr)
        cycle[length] = kk
        length += 1
    return length


@jit(nogil=True, inline="always")
def _ratio_test(
    length: int,
    nc: int,
    bland: bool,
    cycle: np.ndarray,
    cycle_minus: np.ndarray,
    cell_row: np.ndarray,
    cell_col: np.ndarray,
    cell_flow: np.ndarray,
) -> tuple[float, int]:
    """The largest mass the traced cycle can move, and the cell that leaves: the losing cell of
    least flow (ties: the first in climbing order, or with ``bland`` the smallest cell
    ``row * nc + col``). ``(inf, -1)`` when no losing cell has a finite flow."""
    best = np.inf
    leave = -1
    for q in range(length):
        kk = cycle[q]
        f = cell_flow[kk]
        if cycle_minus[q] and (
            f < best
            or (bland and f == best and cell_row[kk] * nc + cell_col[kk] < cell_row[leave] * nc + cell_col[leave])
        ):
            best = f
            leave = kk
    return best, leave


@jit(nogil=True, inline="always")
def _augment(length: int, theta: float, cycle: np.ndarray, cycle_minus: np.ndarray, cell_flow: np.ndarray) -> None:
    """Moves ``theta`` around the traced cycle (the entering cell's own flow is set by the caller)."""
    for q in range(length):
        kk = cycle[q]
        if cycle_minus[q]:
            cell_flow[kk] -= theta
        else:
            cell_flow[kk] += theta


@jit(nogil=True, inline="always")
def _other_end(cell_row: np.ndarray, cell_col: np.ndarray, k: int, x: int, nr: int) -> int:
    """The tree node at the other end of basic cell ``k`` from node ``x``."""
    r: int = cell_row[k]
    return nr + cell_col[k] if x == r else r
