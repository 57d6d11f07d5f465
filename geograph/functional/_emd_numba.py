"""Compiled exact optimal transport for many small problems (numba, float64, CPU).

The kernels here are private: :func:`geograph.functional.emd` and the exact path of
:func:`geograph.functional.ollivier_ricci` wrap them with torch tensors at the boundary.

Algorithm: the transportation simplex (MODI / network simplex on the complete bipartite
graph). A basic feasible solution is a spanning tree of ``nr + nc - 1`` cells over the row and
column nodes; the start is the matrix-minimum rule (cells in order of increasing cost, each
allocation retires one row or column, so the cells always form a spanning tree). Each pivot
computes the potentials ``u_i + v_j = C_ij`` on the tree, prices every cell (Dantzig's rule:
the most negative reduced cost enters), walks the tree path that closes the cycle and moves the
largest feasible mass around it. Degenerate pivots (zero mass moved) are allowed; a pivot cap
marks the rare problem that did not reach optimality (the caller re-solves it with POT).

All problems of a batch run in parallel (``prange`` over chunks of problems, one workspace per
chunk); the kernels release the GIL and use numba's thread pool. Everything is compiled once
and cached on disk (``cache=True``).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

# a problem whose simplex did not reach optimality within the pivot cap
STATUS_OK = 0
STATUS_PIVOT_CAP = 1
_DIST_EPS = 1e-7  # GraphRicciCurvature: d(x, y) below this gives curvature 0
_WEIGHT_SUM_EPS = 1e-7  # GraphRicciCurvature: neighbour weight sum at or below this -> uniform


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def _simplex(s, d, cost, nr, nc, iw, fw, max_pivots):
    """Exact min-cost transport of supplies ``s[:nr]`` to demands ``d[:nc]``.

    ``cost`` is at least ``(nr, nc)``; ``iw`` / ``fw`` are int64 / float64 workspaces of at
    least ``nr * nc + 8 * (nr + nc) + 8`` entries. Returns ``(total cost, status)``.
    """
    if nr == 0 or nc == 0:
        return 0.0, STATUS_OK
    if nr == 1:
        tot = 0.0
        for j in range(nc):
            tot += d[j] * cost[0, j]
        return tot, STATUS_OK
    if nc == 1:
        tot = 0.0
        for i in range(nr):
            tot += s[i] * cost[i, 0]
        return tot, STATUS_OK
    nn = nr + nc
    kb = nn - 1
    ncell = nr * nc
    # int workspace layout
    o = 0
    order = iw[o : o + ncell]
    o += ncell
    bi = iw[o : o + kb]
    o += kb
    bj = iw[o : o + kb]
    o += kb
    deg = iw[o : o + nn + 1]
    o += nn + 1
    start = iw[o : o + nn + 1]
    o += nn + 1
    adj = iw[o : o + 2 * kb]
    o += 2 * kb
    queue = iw[o : o + nn]
    o += nn
    par = iw[o : o + nn]
    o += nn
    # float workspace layout
    rem = fw[0:nn]
    flow = fw[nn : nn + kb]
    pot = fw[nn + kb : 2 * nn + kb]
    seen = fw[2 * nn + kb : 3 * nn + kb]
    keys = fw[3 * nn + kb : 3 * nn + kb + ncell]

    cmax = 0.0
    for i in range(nr):
        for j in range(nc):
            c = cost[i, j]
            keys[i * nc + j] = c
            if abs(c) > cmax:
                cmax = abs(c)
    # --- start: matrix-minimum rule ------------------------------------------------
    srt = np.argsort(keys[:ncell], kind="quicksort")
    for q in range(ncell):
        order[q] = srt[q]
    for i in range(nr):
        rem[i] = s[i]
    for j in range(nc):
        rem[nr + j] = d[j]
    for x in range(nn):
        seen[x] = 0.0  # 1 = line retired
    rows_left = nr
    cols_left = nc
    k = 0
    for q in range(ncell):
        cell = order[q]
        i = cell // nc
        j = cell - i * nc
        if seen[i] != 0.0 or seen[nr + j] != 0.0:
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
            seen[nr + j] = 1.0
            cols_left -= 1
        elif cols_left == 1:
            seen[i] = 1.0
            rows_left -= 1
        elif rem[i] <= rem[nr + j]:
            seen[i] = 1.0
            rows_left -= 1
        else:
            seen[nr + j] = 1.0
            cols_left -= 1
    tol = 1e-12 * (1.0 + cmax)

    # --- pivots ----------------------------------------------------------------------
    status = STATUS_PIVOT_CAP
    for it in range(max_pivots + 50 * ncell + 1000):
        bland = it >= max_pivots
        _build_tree(nr, nn, kb, bi, bj, deg, start, adj)
        # potentials by BFS from row 0: u_i + v_j = C_ij on every basic cell
        for x in range(nn):
            seen[x] = 0.0
        pot[0] = 0.0
        seen[0] = 1.0
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
                if seen[y] == 0.0:
                    seen[y] = 1.0
                    pot[y] = cost[r, c - nr] - pot[x]
                    queue[tail] = y
                    tail += 1
        # pricing: Dantzig (most negative reduced cost); after max_pivots pivots Bland's rule
        # (first negative cell, smallest-index leaving cell), which cannot cycle
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
        # tree path from row ie to column je (BFS with parent edges)
        for x in range(nn):
            seen[x] = 0.0
        seen[ie] = 1.0
        queue[0] = ie
        par[ie] = -1
        head = 0
        tail = 1
        target = nr + je
        while head < tail and seen[target] == 0.0:
            x = queue[head]
            head += 1
            for p in range(start[x], start[x + 1]):
                kk = adj[p]
                r = bi[kk]
                c = nr + bj[kk]
                y = c if x == r else r
                if seen[y] == 0.0:
                    seen[y] = 1.0
                    par[y] = kk
                    queue[tail] = y
                    tail += 1
        # walk back from the column: edges alternate -, +, -, ... (the entering cell is +)
        theta = np.inf
        leave = -1
        x = target
        minus = True
        while x != ie:
            kk = par[x]
            if minus and (flow[kk] < theta or (bland and flow[kk] == theta and bi[kk] * nc + bj[kk] < bi[leave] * nc + bj[leave])):
                theta = flow[kk]
                leave = kk
            r = bi[kk]
            x = r if x != r else nr + bj[kk]
            minus = not minus
        x = target
        minus = True
        while x != ie:
            kk = par[x]
            if minus:
                flow[kk] -= theta
            else:
                flow[kk] += theta
            r = bi[kk]
            x = r if x != r else nr + bj[kk]
            minus = not minus
        bi[leave] = ie
        bj[leave] = je
        flow[leave] = theta
    total = 0.0
    for kk in range(kb):
        total += flow[kk] * cost[bi[kk], bj[kk]]
    return total, status


def _work_sizes(r: int, c: int) -> tuple[int, int]:
    nn = r + c
    return r * c + 8 * nn + 8, r * c + 4 * nn + 8


@njit(cache=True, parallel=True)
def emd_batch(a, b, cost, max_pivots, nchunk):
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
    ni = rr * cc + 8 * (rr + cc) + 8
    nf = rr * cc + 4 * (rr + cc) + 8
    for ch in prange(nchunk):
        iw = np.empty(ni, dtype=np.int64)
        fw = np.empty(nf)
        s = np.empty(rr)
        d = np.empty(cc)
        ri = np.empty(rr, dtype=np.int64)
        ci = np.empty(cc, dtype=np.int64)
        sub = np.empty((rr, cc))
        lo = ch * ne // nchunk
        hi = (ch + 1) * ne // nchunk
        for e in range(lo, hi):
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
            out[e], status[e] = _simplex(s, d, sub, nr, nc, iw, fw, max_pivots)
    return out, status


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def _edge_kappa(dist, meas, x, y, iw, fw, s, d, ri, ci, sub, max_pivots):
    """Curvature of edge ``(x, y)`` of one graph: ``1 - W1(m_x, m_y) / d(x, y)`` (KR-compacted)."""
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
    w1, status = _simplex(s, d, sub, nr, nc, iw, fw, max_pivots)
    return 1.0 - 0.5 * (mp + mn) * w1, status


@njit(cache=True, parallel=True)
def curvature_batch(w, adj, node_mask, edges, alpha, exp_power, max_pivots, nchunk):
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
    for ch in prange(nchunk):
        iw = np.empty(n * n + 16 * n + 8, dtype=np.int64)
        fw = np.empty(n * n + 8 * n + 8)
        s = np.empty(n)
        d = np.empty(n)
        ri = np.empty(n, dtype=np.int64)
        ci = np.empty(n, dtype=np.int64)
        sub = np.empty((n, n))
        for e in range(ch * ne // nchunk, (ch + 1) * ne // nchunk):
            g = edges[e, 0]
            kappa[e], status[e] = _edge_kappa(dist[g], meas[g], edges[e, 1], edges[e, 2], iw, fw, s, d, ri, ci, sub, max_pivots)
    return kappa, status


@njit(cache=True, parallel=True)
def flow_batch(w0, adj, node_mask, alpha, exp_power, iterations, step, delta, max_pivots):
    """The whole normalized Ricci flow of every graph (see ``flow.ricci_flow``), graphs in parallel.

    Per graph: ``kappa(w)``; then up to ``iterations`` times ``w <- w - step * kappa * w``,
    ``w <- w * |E| / sum(w)``, ``kappa <- kappa(w)``, stopping after the step whose curvature
    spread is below ``delta``. Returns lengths ``(B, n, n)``, curvature ``(B, n, n)``, steps
    ``(B,)``, converged ``(B,)`` and stuck ``(B,)`` (problems left at the pivot cap).
    """
    nb, n, _ = w0.shape
    lengths = np.zeros((nb, n, n))
    kappa = np.zeros((nb, n, n))
    steps = np.zeros(nb, dtype=np.int64)
    converged = np.zeros(nb, dtype=np.bool_)
    stuck = np.zeros(nb, dtype=np.int64)
    for g in prange(nb):
        iw = np.empty(n * n + 16 * n + 8, dtype=np.int64)
        fw = np.empty(n * n + 8 * n + 8)
        s = np.empty(n)
        d = np.empty(n)
        ri = np.empty(n, dtype=np.int64)
        ci = np.empty(n, dtype=np.int64)
        sub = np.empty((n, n))
        dist = np.empty((n, n))
        meas = np.empty((n, n))
        ex = np.empty(n * n, dtype=np.int64)
        ey = np.empty(n * n, dtype=np.int64)
        w = np.zeros((n, n))
        ke = np.zeros(n * n)
        ne = 0
        for i in range(n):
            for j in range(i + 1, n):
                if adj[g, i, j] and node_mask[g, i] and node_mask[g, j]:
                    ex[ne] = i
                    ey[ne] = j
                    w[i, j] = w0[g, i, j]
                    w[j, i] = w0[g, i, j]
                    ne += 1
        a_g = adj[g]
        m_g = node_mask[g]
        for e in range(ne):
            ke[e], st = _edge_kappa_graph(w, a_g, m_g, alpha, exp_power, dist, meas, e, ex, ey, iw, fw, s, d, ri, ci, sub, max_pivots)
            stuck[g] += st
        for it in range(iterations if ne > 0 else 0):
            total = 0.0
            for e in range(ne):
                v = w[ex[e], ey[e]] - step * ke[e] * w[ex[e], ey[e]]
                w[ex[e], ey[e]] = v
                total += v
            scale = ne / max(total, np.finfo(np.float64).tiny)
            for e in range(ne):
                v = w[ex[e], ey[e]] * scale
                w[ex[e], ey[e]] = v
                w[ey[e], ex[e]] = v
            for e in range(ne):
                ke[e], st = _edge_kappa_graph(w, a_g, m_g, alpha, exp_power, dist, meas, e, ex, ey, iw, fw, s, d, ri, ci, sub, max_pivots)
                stuck[g] += st
            steps[g] += 1
            lo = np.inf
            hi = -np.inf
            for e in range(ne):
                lo = min(lo, ke[e])
                hi = max(hi, ke[e])
            if hi - lo < delta:
                converged[g] = True
                break
        for e in range(ne):
            lengths[g, ex[e], ey[e]] = w[ex[e], ey[e]]
            lengths[g, ey[e], ex[e]] = w[ex[e], ey[e]]
            kappa[g, ex[e], ey[e]] = ke[e]
            kappa[g, ey[e], ex[e]] = ke[e]
    return lengths, kappa, steps, converged, stuck


@njit(cache=True, nogil=True)
def _edge_kappa_graph(w, adj, node_mask, alpha, exp_power, dist, meas, e, ex, ey, iw, fw, s, d, ri, ci, sub, max_pivots):
    """``_edge_kappa`` of edge ``e``; recomputes the distances and measures at ``e == 0``."""
    if e == 0:
        _apsp_measures(w, adj, node_mask, alpha, exp_power, dist, meas)
    return _edge_kappa(dist, meas, ex[e], ey[e], iw, fw, s, d, ri, ci, sub, max_pivots)


def num_chunks() -> int:
    """Chunks of problems per kernel call: a few per numba thread, for load balance."""
    import numba

    return 8 * numba.get_num_threads()
