"""Compiled exact optimal transport for many small problems (numba, float64, CPU).

The kernels here are private: :func:`geograph.functional.emd` and the exact path of
:func:`geograph.functional.ollivier_ricci` / :func:`geograph.functional.ricci_flow` wrap them
with torch tensors at the boundary.

Algorithm: the transportation simplex (MODI / network simplex on the complete bipartite
graph). A basic feasible solution is a spanning tree of ``nr + nc - 1`` cells over the row and
column nodes. A cold start takes the matrix-minimum rule (cells in order of increasing cost,
each allocation retires one row or column, so the cells always form a spanning tree). Each pivot
walks the tree once from row 0 (potentials ``u_i + v_j = C_ij``, parent cells and depths),
prices every cell (Dantzig's rule: the most negative reduced cost enters), closes the cycle by
climbing from both ends of the entering cell to their common ancestor and moves the largest
feasible mass around it. Degenerate pivots (zero mass moved) are allowed; after ``max_pivots``
pivots Bland's rule takes over (it cannot cycle) and a further cap marks the problem that did
not reach optimality (the caller re-solves it with POT).

Warm starts (the flow): the problems of one edge change little from one flow step to the next,
so each edge keeps its optimal basis (in node ids) and potentials from the previous step.
The new problem starts from the cells of that basis whose row and column are still a row and a
column (a forest), completed into a spanning tree by the cells of least reduced cost under
the previous potentials (:func:`_warm_basis`). Its flows are solved on the tree (leaf peeling,
:func:`_tree_flows`); negative ones are removed by dual simplex steps (:func:`_dual_repair`),
and the primal simplex finishes from there (usually at once). Should the repair fail, the
start is the matrix-minimum rule ordered by the previous reduced costs. The optimum does not
depend on the start, only the pivot count does (SciFact query graphs: 1.25 primal pivots and
0.90 dual steps per problem, against 9.7 pivots cold).

All problems of a batch run in parallel (``prange`` over numba's thread pool). The entry
points :func:`emd_batch`, :func:`curvature_batch` and :func:`flow_batch` release the GIL
(``nogil=True``) and run one at a time per process (a lock: each already uses every numba
thread, and numba's ``workqueue`` threading layer cannot run parallel kernels launched from
several threads at once); see :mod:`geograph.functional._numba`. Everything is compiled once
and cached on disk where a writable directory exists (the choice is in
:func:`geograph.functional._numba.cache_info`).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from geograph.functional._numba import jit, locked

# a problem whose simplex did not reach optimality within the pivot cap
STATUS_OK = 0
STATUS_PIVOT_CAP = 1
_DIST_EPS = 1e-7  # GraphRicciCurvature: d(x, y) below this gives curvature 0
_WEIGHT_SUM_EPS = 1e-7  # GraphRicciCurvature: neighbour weight sum at or below this -> uniform
_FLOW_TOL = 1e-12  # a warm tree's flow above -this counts as feasible (clamped to 0)


@jit(nogil=True)
def _build_tree(nr, nn, kb, bi, bj, deg, start, adj):
    """CSR adjacency of the basic tree: node ``i < nr`` is row i, node ``nr + j`` is column j."""
    for x in range(nn + 1):
        deg[x] = 0
    for k in range(kb):
        deg[bi[k]] += 1
        deg[nr + bj[k]] += 1
    start[0] = 0
    for x in range(nn):
        start[x + 1] = start[x] + deg[x]
        deg[x] = start[x]
    for k in range(kb):
        r = bi[k]
        c = nr + bj[k]
        adj[deg[r]] = k
        deg[r] += 1
        adj[deg[c]] = k
        deg[c] += 1


@jit(nogil=True)
def _cold_start(s, d, cost, nr, nc, bi, bj, flow, iw, fw, hu, hv, hint):
    """Matrix-minimum rule: a spanning-tree basic feasible solution in ``bi, bj, flow``.

    With ``hint``, cells are taken in order of their reduced cost ``C_ij - hu_i - hv_j`` under
    the potentials of a nearby problem (its optimal basis has reduced cost 0, so the start
    rebuilds a feasible basis close to it) instead of ``C_ij``.
    """
    nn = nr + nc
    ncell = nr * nc
    keys = fw[:ncell]
    rem = fw[ncell : ncell + nn]
    done = iw[:nn]
    for i in range(nr):
        for j in range(nc):
            keys[i * nc + j] = cost[i, j] - hu[i] - hv[j] if hint else cost[i, j]
    order = np.argsort(keys, kind="quicksort")
    for i in range(nr):
        rem[i] = s[i]
    for j in range(nc):
        rem[nr + j] = d[j]
    for x in range(nn):
        done[x] = 0  # 1 = line retired
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
        bi[k] = i
        bj[k] = j
        flow[k] = x
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
def _tree_flows(s, d, nr, nc, bi, bj, flow, iw, fw):
    """Flows of the basis ``bi, bj`` that meet ``s`` and ``d`` (leaf peeling; some may be < 0).

    Returns False when the cells do not form a spanning tree.
    """
    nn = nr + nc
    kb = nn - 1
    deg, start, adj, queue, left, used, _ = _tree_views(iw, nn)  # left: open cells per node; used: per cell
    rem = fw[:nn]
    _build_tree(nr, nn, kb, bi, bj, deg, start, adj)
    for i in range(nr):
        rem[i] = s[i]
    for j in range(nc):
        rem[nr + j] = d[j]
    tail = 0
    for x in range(nn):
        left[x] = start[x + 1] - start[x]
        if left[x] == 0:
            return False
        if left[x] == 1:
            queue[tail] = x
            tail += 1
    for k in range(kb):
        used[k] = 0
    head = 0
    placed = 0
    while head < tail:
        x = queue[head]
        head += 1
        if left[x] != 1:
            continue  # the last node (its remaining mass is the rounding residue)
        kk = -1
        for p in range(start[x], start[x + 1]):
            if used[adj[p]] == 0:
                kk = adj[p]
                break
        if kk < 0:
            return False
        used[kk] = 1
        placed += 1
        flow[kk] = rem[x]
        r = bi[kk]
        y = nr + bj[kk] if x == r else r
        rem[y] -= rem[x]
        left[x] = 0
        left[y] -= 1
        if left[y] == 1:
            queue[tail] = y
            tail += 1
    return placed == kb


@jit(nogil=True)
def _walk(cost, nr, nc, bi, bj, iw, fw):
    """Root the basic tree at row 0: potentials ``u_i + v_j = C_ij`` (``fw[:nn]``), parent cells,
    depths and the visiting order (views into ``iw``, see :func:`_tree_views`)."""
    nn = nr + nc
    kb = nn - 1
    deg, start, adj, queue, par, depth, mark = _tree_views(iw, nn)
    pot = fw[:nn]
    _build_tree(nr, nn, kb, bi, bj, deg, start, adj)
    for x in range(nn):
        depth[x] = -1
    pot[0] = 0.0
    depth[0] = 0
    par[0] = -1
    queue[0] = 0
    head = 0
    tail = 1
    while head < tail:
        x = queue[head]
        head += 1
        for p in range(start[x], start[x + 1]):
            kk = adj[p]
            r = bi[kk]
            c = nr + bj[kk]
            y = c if x == r else r
            if depth[y] < 0:
                depth[y] = depth[x] + 1
                par[y] = kk
                pot[y] = cost[r, c - nr] - pot[x]
                queue[tail] = y
                tail += 1


@jit(nogil=True)
def _tree_views(iw, nn):
    """The int workspace's tree arrays: degrees, CSR start/adjacency, BFS queue, parent cell,
    depth and a node mark (about ``8 * nn`` entries)."""
    kb = nn - 1
    o = nn + 1
    return (iw[:o], iw[o : 2 * o], iw[2 * o : 2 * o + 2 * kb], iw[2 * o + 2 * kb : 2 * o + 2 * kb + nn],
            iw[2 * o + 2 * kb + nn : 2 * o + 2 * kb + 2 * nn], iw[2 * o + 2 * kb + 2 * nn : 2 * o + 2 * kb + 3 * nn],
            iw[2 * o + 2 * kb + 3 * nn : 2 * o + 2 * kb + 4 * nn])


@jit(nogil=True)
def _cycle(ie, je, theta, nr, nc, bi, bj, flow, par, depth, bland):
    """The cycle that cell ``(ie, je)`` closes on the rooted tree.

    Climbs from row ``ie`` and column ``je`` to their common ancestor; on each side the cells
    alternate -, +, -, ... from the end (the entering cell itself is +). With ``theta < 0`` it
    returns the ratio test ``(largest feasible theta, leaving cell)`` (Bland's tie rule: the
    smallest cell index); otherwise it moves ``theta`` around the cycle and returns it.
    """
    x = ie
    y = nr + je
    px = 0
    py = 0
    best = np.inf
    leave = -1
    while x != y:
        if depth[x] >= depth[y]:
            kk = par[x]
            minus = px % 2 == 0
            px += 1
            r = bi[kk]
            x = nr + bj[kk] if x == r else r
        else:
            kk = par[y]
            minus = py % 2 == 0
            py += 1
            r = bi[kk]
            y = nr + bj[kk] if y == r else r
        if theta < 0.0:
            if minus and (flow[kk] < best or (bland and flow[kk] == best
                                               and bi[kk] * nc + bj[kk] < bi[leave] * nc + bj[leave])):
                best = flow[kk]
                leave = kk
        elif minus:
            flow[kk] -= theta
        else:
            flow[kk] += theta
    return best, leave


@jit(nogil=True)
def _pivot(cost, nr, nc, bi, bj, flow, iw, fw, max_pivots):
    """Transportation simplex from the basic feasible solution ``bi, bj, flow``.

    Returns ``(total cost, status, pivots)``; the optimal basis is left in ``bi, bj, flow`` and
    its potentials in ``fw[:nr + nc]``.
    """
    nn = nr + nc
    kb = nn - 1
    _, _, _, _, par, depth, _ = _tree_views(iw, nn)
    pot = fw[:nn]
    cmax = 0.0
    for i in range(nr):
        for j in range(nc):
            cmax = max(cmax, abs(cost[i, j]))
    tol = 1e-12 * (1.0 + cmax)
    status = STATUS_PIVOT_CAP
    pivots = 0
    for it in range(max_pivots + 50 * nr * nc + 1000):
        bland = it >= max_pivots
        _walk(cost, nr, nc, bi, bj, iw, fw)
        # pricing: Dantzig (most negative reduced cost); under Bland the first negative cell
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
        if ie < 0:
            status = STATUS_OK
            break
        pivots += 1
        theta, leave = _cycle(ie, je, -1.0, nr, nc, bi, bj, flow, par, depth, bland)
        if leave < 0:  # no finite flow on the cycle (non-finite input): report as stuck
            break
        _cycle(ie, je, theta, nr, nc, bi, bj, flow, par, depth, bland)
        bi[leave] = ie
        bj[leave] = je
        flow[leave] = theta
    total = 0.0
    for kk in range(kb):
        total += flow[kk] * cost[bi[kk], bj[kk]]
    return total, status, pivots


@jit(nogil=True)
def _dual_repair(cost, nr, nc, bi, bj, flow, iw, fw, max_steps):
    """Dual simplex steps until the basis ``bi, bj, flow`` is primal feasible.

    Returns the number of steps taken, or -1 when it is not feasible after ``max_steps``.

    Each step takes the most negative flow ``f`` of a cell ``k = (r, c)``, splits the tree at
    ``k`` into the part ``A`` holding row ``r`` and ``B`` holding column ``c``, and brings in the
    cell from a row of ``B`` to a column of ``A`` of least reduced cost (dual-feasibility kept,
    when the basis had it) with ``-f`` moved around its cycle, which empties ``k``.
    """
    nn = nr + nc
    kb = nn - 1
    _, _, _, queue, par, depth, mark = _tree_views(iw, nn)
    pot = fw[:nn]
    for step in range(max_steps):
        k = -1
        fmin = -_FLOW_TOL
        for kk in range(kb):
            if flow[kk] < fmin:
                fmin = flow[kk]
                k = kk
        if k < 0:
            for kk in range(kb):
                flow[kk] = max(flow[kk], 0.0)
            return step
        _walk(cost, nr, nc, bi, bj, iw, fw)
        # the subtree below cell k (BFS order visits parents first)
        for q in range(nn):
            x = queue[q]
            if x == 0:
                mark[x] = 0
            elif par[x] == k:
                mark[x] = 1
            else:
                r = bi[par[x]]
                mark[x] = mark[nr + bj[par[x]] if x == r else r]
        in_a = 1 - mark[nr + bj[k]]  # rows of B and columns of A carry mark != in_a and == in_a
        best = np.inf
        ie = -1
        je = -1
        for i in range(nr):
            if mark[i] == in_a:
                continue
            ui = pot[i]
            for j in range(nc):
                if mark[nr + j] == in_a:
                    red = cost[i, j] - ui - pot[nr + j]
                    if red < best:
                        best = red
                        ie = i
                        je = j
        if ie < 0:
            return -1
        _cycle(ie, je, -fmin, nr, nc, bi, bj, flow, par, depth, False)
        bi[k] = ie
        bj[k] = je
        flow[k] = -fmin
    return -1


@jit(nogil=True)
def _simplex(s, d, cost, nr, nc, bi, bj, flow, iw, fw, max_pivots, warm, hu, hv, hint):
    """Exact min-cost transport of supplies ``s[:nr]`` to demands ``d[:nc]``.

    ``cost`` is at least ``(nr, nc)``; ``bi, bj, flow`` hold at least ``nr + nc - 1`` cells. With
    ``warm`` they hold a spanning tree to start from: its flows are solved and made feasible by
    :func:`_dual_repair`; failing that (or without ``warm``) the start is :func:`_cold_start`,
    ordered by the potentials ``hu, hv`` with ``hint``. ``iw`` / ``fw`` are int64 / float64
    workspaces of at least ``nr * nc + 8 * (nr + nc) + 8`` / ``nr * nc + 2 * (nr + nc) + 8``
    entries. Returns ``(total cost, status, pivots, warm used, dual steps)``; the optimal potentials are left
    in ``fw[:nr + nc]`` (rows then columns).
    """
    if nr == 0 or nc == 0:
        return 0.0, STATUS_OK, 0, False, 0
    if nr == 1 or nc == 1:  # every basic cell is forced; potentials 0 on the single line
        tot = 0.0
        k = 0
        for i in range(nr):
            for j in range(nc):
                f = d[j] if nr == 1 else s[i]
                bi[k] = i
                bj[k] = j
                flow[k] = f
                k += 1
                tot += f * cost[i, j]
                fw[i] = 0.0 if nr == 1 else cost[i, 0]
                fw[nr + j] = cost[0, j] if nr == 1 else 0.0
        return tot, STATUS_OK, 0, False, 0
    dual = -1
    if warm and _tree_flows(s, d, nr, nc, bi, bj, flow, iw, fw):
        dual = _dual_repair(cost, nr, nc, bi, bj, flow, iw, fw, 2 * (nr + nc))
    used = dual >= 0
    if not used:
        _cold_start(s, d, cost, nr, nc, bi, bj, flow, iw, fw, hu, hv, hint)
    total, status, pivots = _pivot(cost, nr, nc, bi, bj, flow, iw, fw, max_pivots)
    return total, status, pivots, used, max(dual, 0)


@jit(parallel=True, nogil=True)
def _emd_batch(a, b, cost, max_pivots, nchunk):
    """Exact OT cost of every problem ``(a[e], b[e], cost[e])``; zero-mass entries are skipped.

    Args: ``a (E, R)``, ``b (E, C)``, ``cost (E, R, C)`` float64, C-contiguous.
    Returns: ``(E,)`` costs and ``(E,)`` int64 statuses.
    """
    ne, rr, cc = cost.shape
    out = np.zeros(ne)
    status = np.zeros(ne, dtype=np.int64)
    if ne == 0:
        return out, status
    nchunk = max(1, min(ne, nchunk))
    for ch in prange(nchunk):
        iw, fw, s, d, ri, ci, sub, _, bi, bj, flow, hu, hv = _scratch(rr + cc)  # rows and columns may overlap
        for e in range(ch * ne // nchunk, (ch + 1) * ne // nchunk):
            nr = 0
            for i in range(rr):
                if a[e, i] > 0:
                    ri[nr] = i
                    s[nr] = a[e, i]
                    nr += 1
            nc = 0
            for j in range(cc):
                if b[e, j] > 0:
                    ci[nc] = j
                    d[nc] = b[e, j]
                    nc += 1
            for i in range(nr):
                for j in range(nc):
                    sub[i, j] = cost[e, ri[i], ci[j]]
            out[e], status[e], _, _, _ = _simplex(s, d, sub, nr, nc, bi, bj, flow, iw, fw, max_pivots, False, hu, hv, False)
    return out, status


@jit(nogil=True)
def _apsp_measures(w, adj, node_mask, alpha, exp_power, dist, meas):
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


@jit(nogil=True)
def _warm_basis(nr, nc, ri, ci, prev, sub, hu, hv, pos, bi, bj, iw):
    """A spanning tree of this problem from the previous basis ``prev`` (in node ids).

    The previous cells whose row and column are still a row and a column here are kept (a
    forest); the tree is completed by the cells of least reduced cost ``sub - hu - hv`` that join
    two of its parts (Kruskal with a union-find in ``iw``). False if no finite cell completes
    it (non-finite hints; the caller then starts cold).
    """
    n = pos.shape[0]
    nn = nr + nc
    for v in range(n):
        pos[v] = -1
    for i in range(nr):
        pos[ri[i]] = i
    for j in range(nc):
        pos[ci[j]] = nr + j
    root = iw[:nn]
    for x in range(nn):
        root[x] = x
    k = 0
    pk = prev[0] + prev[1] - 1
    for q in range(pk):
        a = pos[prev[2 + q]]
        b = pos[prev[2 + pk + q]]
        if a < 0 or a >= nr or b < nr:
            continue
        ra = _find(root, a)
        rb = _find(root, b)
        if ra != rb:
            root[ra] = rb
            bi[k] = a
            bj[k] = b - nr
            k += 1
    while k < nn - 1:
        best = np.inf
        ie = -1
        je = -1
        for i in range(nr):
            ra = _find(root, i)
            for j in range(nc):
                if ra != _find(root, nr + j):
                    red = sub[i, j] - hu[i] - hv[j]
                    if red < best:
                        best = red
                        ie = i
                        je = j
        if ie < 0:
            return False
        root[_find(root, ie)] = _find(root, nr + je)
        bi[k] = ie
        bj[k] = je
        k += 1
    return True


@jit(nogil=True)
def _find(root, x):
    """Union-find root of ``x`` (path halving)."""
    while root[x] != x:
        root[x] = root[root[x]]
        x = root[x]
    return x


@jit(nogil=True)
def _edge_kappa(dist, meas, x, y, iw, fw, s, d, ri, ci, sub, pos, bi, bj, flow, hu, hv, max_pivots, wk, wp, e,
                out_stats):
    """Curvature of edge ``(x, y)`` of one graph: ``1 - W1(m_x, m_y) / d(x, y)`` (KR-compacted).

    Warm starts: row ``e`` of ``wk`` holds the edge's previous optimal basis in node ids
    ``(nr, nc, row ids of its cells..., column ids...)`` (``nr = -1``: none yet) and row ``e`` of
    ``wp`` its optimal potentials per node (NaN off the supports); zero-row arrays keep nothing.
    ``out_stats`` accumulates ``(problems, warm bases used, pivots, dual steps)``.
    """
    n = dist.shape[0]
    dxy = dist[x, y]
    if dxy < _DIST_EPS:
        return 0.0, STATUS_OK
    thr = 8 * np.finfo(np.float64).eps
    nr = 0
    nc = 0
    mp = 0.0
    mn = 0.0
    for v in range(n):
        diff = meas[x, v] - meas[y, v]
        if diff > thr:
            ri[nr] = v
            s[nr] = diff
            mp += diff
            nr += 1
        elif diff < -thr:
            ci[nc] = v
            d[nc] = -diff
            mn -= diff
            nc += 1
    if nr == 0 or nc == 0:
        return 1.0, STATUS_OK
    for i in range(nr):
        s[i] /= mp
    for j in range(nc):
        d[j] /= mn
    inv = 1.0 / max(dxy, _DIST_EPS)
    for i in range(nr):
        for j in range(nc):
            c = dist[ri[i], ci[j]]
            sub[i, j] = c * inv if c < np.inf else 0.0
    kb = nr + nc - 1
    warm = False
    store = wk.shape[0] > 0
    if store and wk[e, 0] >= 0:
        # the previous potentials; a node new to the supports gets the tightest dual-feasible value
        for i in range(nr):
            hu[i] = wp[e, ri[i]]
        for j in range(nc):
            hv[j] = wp[e, ci[j]]
        for i in range(nr):
            if np.isnan(hu[i]):
                u = np.inf
                for j in range(nc):
                    if not np.isnan(hv[j]):
                        u = min(u, sub[i, j] - hv[j])
                hu[i] = u if u < np.inf else 0.0
        for j in range(nc):
            if np.isnan(hv[j]):
                v = np.inf
                for i in range(nr):
                    v = min(v, sub[i, j] - hu[i])
                hv[j] = v
        warm = _warm_basis(nr, nc, ri, ci, wk[e], sub, hu, hv, pos, bi, bj, iw)
    w1, status, pivots, used, dual = _simplex(s, d, sub, nr, nc, bi, bj, flow, iw, fw, max_pivots, warm, hu, hv, warm)
    if store:
        wk[e, 0] = nr
        wk[e, 1] = nc
        for k in range(kb):
            wk[e, 2 + k] = ri[bi[k]]
            wk[e, 2 + kb + k] = ci[bj[k]]
        for v in range(n):
            wp[e, v] = np.nan
        for i in range(nr):  # the potentials of the optimal basis (see _simplex)
            wp[e, ri[i]] = fw[i]
        for j in range(nc):
            wp[e, ci[j]] = fw[nr + j]
    out_stats[0] += 1
    out_stats[1] += used
    out_stats[2] += pivots
    out_stats[3] += dual
    return 1.0 - 0.5 * (mp + mn) * w1, status


@jit(parallel=True, nogil=True)
def _curvature_batch(w, adj, node_mask, edges, alpha, exp_power, max_pivots, nchunk):
    """Ollivier-Ricci curvature of every edge ``(g, x, y)`` of a batch of graphs.

    Kantorovich-Rubinstein: ``W1(m_x, m_y)`` is the transport of the positive part of
    ``m_x - m_y`` onto its negative part; ``kappa = 1 - W1 / d(x, y)``, 0 where
    ``d(x, y) < 1e-7``. Returns ``(E,)`` curvatures and ``(E,)`` statuses.
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
    no_store = np.zeros((0, 0), dtype=np.int64)
    no_pot = np.zeros((0, 0))
    for ch in prange(nchunk):
        iw, fw, s, d, ri, ci, sub, pos, bi, bj, flow, hu, hv = _scratch(n)
        st = np.zeros(4, dtype=np.int64)
        for e in range(ch * ne // nchunk, (ch + 1) * ne // nchunk):
            g = edges[e, 0]
            kappa[e], status[e] = _edge_kappa(dist[g], meas[g], edges[e, 1], edges[e, 2], iw, fw, s, d, ri, ci, sub,
                                              pos, bi, bj, flow, hu, hv, max_pivots, no_store, no_pot, e, st)
    return kappa, status


@jit(nogil=True)
def _scratch(n):
    """Scratch arrays of :func:`_edge_kappa` for graphs of ``n`` nodes: problems with at most
    ``n`` rows and columns together (a graph's KR supports are disjoint), see :func:`_simplex`."""
    return (np.empty(n * n + 12 * n + 8, dtype=np.int64), np.empty(n * n + 4 * n + 8), np.empty(n), np.empty(n),
            np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty((n, n)), np.empty(n, dtype=np.int64),
            np.empty(2 * n, dtype=np.int64), np.empty(2 * n, dtype=np.int64), np.empty(2 * n), np.empty(n), np.empty(n))


@jit(parallel=True, nogil=True)
def _flow_batch(w0, adj, node_mask, alpha, exp_power, iterations, step, delta, max_pivots, warm, nchunk):
    """The whole normalized Ricci flow of every graph (see ``flow.ricci_flow``) in one call.

    Per graph: ``kappa(w)``; then up to ``iterations`` times ``w <- w - step * kappa * w``,
    ``w <- w * |E| / sum(w)``, ``kappa <- kappa(w)``, stopping after the step whose curvature
    spread is below ``delta``. Each step runs the graphs' distances and measures in parallel,
    then every edge of every graph still flowing in parallel (so one graph uses every thread
    too); with ``warm`` each edge's simplex starts from its previous optimal basis.
    Returns lengths ``(B, n, n)``, curvature ``(B, n, n)``, steps ``(B,)``, converged ``(B,)``,
    stuck ``(B,)`` (problems left at the pivot cap) and the solver's counts ``(problems, warm
    starts used, primal pivots, dual steps)``.
    """
    nb, n, _ = w0.shape
    lengths = np.zeros((nb, n, n))
    kappa = np.zeros((nb, n, n))
    steps = np.zeros(nb, dtype=np.int64)
    converged = np.zeros(nb, dtype=np.bool_)
    stuck = np.zeros(nb, dtype=np.int64)
    # the edges of every graph: graph g owns eg_start[g] .. eg_start[g + 1]
    eg_start = np.zeros(nb + 1, dtype=np.int64)
    for g in range(nb):
        cnt = 0
        for i in range(n):
            if node_mask[g, i]:
                for j in range(i + 1, n):
                    if adj[g, i, j] and node_mask[g, j]:
                        cnt += 1
        eg_start[g + 1] = eg_start[g] + cnt
    ne = eg_start[nb]
    eg = np.empty(ne, dtype=np.int64)
    ex = np.empty(ne, dtype=np.int64)
    ey = np.empty(ne, dtype=np.int64)
    w = np.zeros((nb, n, n))
    for g in prange(nb):
        e = eg_start[g]
        for i in range(n):
            if node_mask[g, i]:
                for j in range(i + 1, n):
                    if adj[g, i, j] and node_mask[g, j]:
                        eg[e] = g
                        ex[e] = i
                        ey[e] = j
                        w[g, i, j] = w0[g, i, j]
                        w[g, j, i] = w0[g, i, j]
                        e += 1
    ke = np.zeros(ne)
    est = np.zeros(ne, dtype=np.int64)
    wk = np.full((ne if warm else 0, 2 + 4 * n), -1, dtype=np.int64)
    wp = np.full((ne if warm else 0, n), np.nan)
    dist = np.empty((nb, n, n))
    meas = np.empty((nb, n, n))
    active = np.empty(nb, dtype=np.bool_)
    for g in range(nb):
        active[g] = eg_start[g + 1] > eg_start[g]  # a graph without edges does not flow
    stats = np.zeros((max(1, min(ne, nchunk)), 4), dtype=np.int64)
    for it in range(iterations + 1):
        # (1) per graph: the flow step (after the first solve) and the distances and measures
        for g in prange(nb):
            if not active[g]:
                continue
            if it > 0:
                if it > 1:  # stop after the step whose curvature spread is below delta
                    lo = np.inf
                    hi = -np.inf
                    for e in range(eg_start[g], eg_start[g + 1]):
                        lo = min(lo, ke[e])
                        hi = max(hi, ke[e])
                    if hi - lo < delta:
                        converged[g] = True
                        active[g] = False
                        continue
                total = 0.0
                for e in range(eg_start[g], eg_start[g + 1]):
                    v = w[g, ex[e], ey[e]] - step * ke[e] * w[g, ex[e], ey[e]]
                    w[g, ex[e], ey[e]] = v
                    total += v
                scale = (eg_start[g + 1] - eg_start[g]) / max(total, np.finfo(np.float64).tiny)
                for e in range(eg_start[g], eg_start[g + 1]):
                    v = w[g, ex[e], ey[e]] * scale
                    w[g, ex[e], ey[e]] = v
                    w[g, ey[e], ex[e]] = v
                steps[g] += 1
            _apsp_measures(w[g], adj[g], node_mask[g], alpha, exp_power, dist[g], meas[g])
        # (2) every edge of every active graph
        nch = stats.shape[0]
        for ch in prange(nch):
            iw, fw, s, d, ri, ci, sub, pos, bi, bj, flow, hu, hv = _scratch(n)
            for e in range(ch * ne // nch, (ch + 1) * ne // nch):
                g = eg[e]
                if active[g]:
                    ke[e], st = _edge_kappa(dist[g], meas[g], ex[e], ey[e], iw, fw, s, d, ri, ci, sub, pos, bi, bj,
                                            flow, hu, hv, max_pivots, wk, wp, e, stats[ch])
                    est[e] += st
    for g in prange(nb):
        if active[g] and steps[g] > 0:  # the last step's spread
            lo = np.inf
            hi = -np.inf
            for e in range(eg_start[g], eg_start[g + 1]):
                lo = min(lo, ke[e])
                hi = max(hi, ke[e])
            converged[g] = hi - lo < delta
        for e in range(eg_start[g], eg_start[g + 1]):
            stuck[g] += est[e]
            lengths[g, ex[e], ey[e]] = w[g, ex[e], ey[e]]
            lengths[g, ey[e], ex[e]] = w[g, ex[e], ey[e]]
            kappa[g, ex[e], ey[e]] = ke[e]
            kappa[g, ey[e], ex[e]] = ke[e]
    totals = np.zeros(4, dtype=np.int64)
    for ch in range(stats.shape[0]):
        for q in range(4):
            totals[q] += stats[ch, q]
    return lengths, kappa, steps, converged, stuck, totals


# the Python entry points: the compiled kernels under the process-wide lock
emd_batch = locked(_emd_batch)
curvature_batch = locked(_curvature_batch)
flow_batch = locked(_flow_batch)


def num_chunks() -> int:
    """Chunks of problems per kernel call: a few per numba thread, for load balance."""
    import numba

    return 8 * numba.get_num_threads()
