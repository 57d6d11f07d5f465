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

    # --- start: matrix-minimum rule -------------------------------------------------
    cmax = 0.0
    for i in range(nr):
        for j in range(nc):
            c = cost[i, j]
            keys[i * nc + j] = c
            if abs(c) > cmax:
                cmax = abs(c)
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
    for _ in range(max_pivots):
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
        # pricing (Dantzig)
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
            if minus and flow[kk] < theta:
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


@njit(cache=True, parallel=True)
def apsp_and_measures(w, adj, node_mask, alpha, exp_power):
    """Floyd-Warshall distances and lazy measures of every graph (see ``curvature._measures``)."""
    nb, n, _ = w.shape
    dist = np.empty((nb, n, n))
    meas = np.zeros((nb, n, n))
    for g in prange(nb):
        for i in range(n):
            for j in range(n):
                if adj[g, i, j]:
                    dist[g, i, j] = w[g, i, j]
                else:
                    dist[g, i, j] = np.inf
            if node_mask[g, i]:
                dist[g, i, i] = 0.0
        for k in range(n):
            for i in range(n):
                dik = dist[g, i, k]
                if dik == np.inf:
                    continue
                for j in range(n):
                    v = dik + dist[g, k, j]
                    if v < dist[g, i, j]:
                        dist[g, i, j] = v
        for x in range(n):
            if not node_mask[g, x]:
                continue
            total = 0.0
            deg = 0
            for v in range(n):
                if adj[g, x, v]:
                    deg += 1
                    total += np.exp(-(w[g, x, v] ** exp_power))
            if deg == 0:
                meas[g, x, x] = 1.0
                continue
            for v in range(n):
                if adj[g, x, v]:
                    if total > _WEIGHT_SUM_EPS:
                        meas[g, x, v] = (1.0 - alpha) * (np.exp(-(w[g, x, v] ** exp_power)) / total)
                    else:
                        meas[g, x, v] = (1.0 - alpha) * (1.0 / deg)
            meas[g, x, x] = alpha
    return dist, meas


@njit(cache=True, parallel=True)
def curvature_edges(dist, meas, edges, max_pivots, nchunk):
    """Ollivier-Ricci curvature of every edge ``(g, x, y)`` from distances and measures.

    Kantorovich-Rubinstein: ``W1(m_x, m_y)`` is the transport of the positive part of
    ``m_x - m_y`` onto its negative part; ``kappa = 1 - W1 / d(x, y)``, 0 where
    ``d(x, y) < 1e-7``. Returns ``(E,)`` curvatures, ``(E,)`` statuses.
    """
    nb, n, _ = dist.shape
    ne = edges.shape[0]
    kappa = np.zeros(ne)
    status = np.zeros(ne, dtype=np.int64)
    if ne == 0:
        return kappa, status
    nchunk = max(1, min(ne, nchunk))
    ni = n * n + 16 * n + 8
    nf = n * n + 8 * n + 8
    thr = 8 * np.finfo(np.float64).eps
    for ch in prange(nchunk):
        iw = np.empty(ni, dtype=np.int64)
        fw = np.empty(nf)
        s = np.empty(n)
        d = np.empty(n)
        ri = np.empty(n, dtype=np.int64)
        ci = np.empty(n, dtype=np.int64)
        sub = np.empty((n, n))
        lo = ch * ne // nchunk
        hi = (ch + 1) * ne // nchunk
        for e in range(lo, hi):
            g = edges[e, 0]
            x = edges[e, 1]
            y = edges[e, 2]
            dxy = dist[g, x, y]
            if dxy < _DIST_EPS:
                kappa[e] = 0.0
                continue
            nr = 0
            nc = 0
            mp = 0.0
            mn = 0.0
            for v in range(n):
                diff = meas[g, x, v] - meas[g, y, v]
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
                kappa[e] = 1.0
                continue
            for i in range(nr):
                s[i] /= mp
            for j in range(nc):
                d[j] /= mn
            inv = 1.0 / max(dxy, _DIST_EPS)
            for i in range(nr):
                for j in range(nc):
                    c = dist[g, ri[i], ci[j]]
                    sub[i, j] = c * inv if c < np.inf else 0.0
            w1, status[e] = _simplex(s, d, sub, nr, nc, iw, fw, max_pivots)
            kappa[e] = 1.0 - 0.5 * (mp + mn) * w1
    return kappa, status


def num_chunks() -> int:
    """Chunks of problems per kernel call: a few per numba thread, for load balance."""
    import numba

    return 8 * numba.get_num_threads()
