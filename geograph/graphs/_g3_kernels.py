"""The compiled passes of a G3 update (private; imported on first use: numba loads then).

An update of a :class:`~geograph.G3Graph` touches every row: each row's kept list is re-weighted
under the new penalties, merged with the new columns it met, certified or not, and its edges of
``T`` written again. The torch path (``_certified_torch`` and ``_set_t`` of
:mod:`geograph.graphs.g3_updates`) does this by
whole-array passes over the ``(N, K')`` lists (a merge, two stable sorts, gathers, an ``(N, d)``
sort of the old edges to tell which rows changed); the kernels here do each row in one pass, in
parallel over the rows, and give the same lists, cuts, edges and weights bit for bit
(``tests/test_g3_updates_compiled.py`` checks both paths against each other). The lists are
sorted best first by weight before the update and a weight moves by its column's penalty ratio
only, so a row arrives nearly sorted: an insertion sort moves an entry only past the entries
whose order the change swapped.

Cached on disk as the other kernels (:mod:`geograph.knn._heap`); no code of another file is
compiled in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import prange

from geograph.knn._heap import _jit


@_jit(parallel=True)
def certify_kernel(
    fvals: Any,
    ids: Any,
    src: Any,
    renum: Any,
    penalty: Any,
    eptr: Any,
    ew: Any,
    ei: Any,
    ef: Any,
    lim: Any,
    limit: Any,
    need: Any,
    n_all: Any,
    chunks: Any,
    new_f: Any,
    new_i: Any,
    new_cut: Any,
    ok: Any,
) -> None:  # pragma: no cover - compiled
    """Row ``r`` reads the kept list ``src[r]`` of ``(fvals, ids)`` (columns renumbered by ``renum``
    where it is not empty, ``-1`` = removed), weighs it by ``penalty``, adds its new columns (the
    CSR rows ``eptr[r] .. eptr[r + 1]`` of ``(ew, ei, ef)``: weights, columns, ``f``) and sorts the
    lot; the entries above ``lim[r]`` (and 0) are proven and kept in ``(new_f, new_i)``, the next
    weight sets ``new_cut[r]`` (at least ``limit[r]``), and ``ok[r]`` says whether ``need`` of them
    were proven (or nothing outside the list weighs anything: ``limit[r] == 0``)."""
    width = fvals.shape[1]
    renumber = renum.shape[0] > 0
    n_rows = src.shape[0]
    step = (n_rows + chunks - 1) // chunks
    most = width
    for r in range(n_rows):
        most = max(most, width + eptr[r + 1] - eptr[r])
    shift = 1
    while (1 << shift) <= most:
        shift += 1
    low = (1 << shift) - 1
    for ch in prange(chunks):
        cv = np.empty(most, dtype=fvals.dtype)  # one row's candidates at a time, per thread
        ck = np.empty(most, dtype=np.int64)  # their column and slot in one key: ties by column, then slot
        for r in range(ch * step, min(n_rows, (ch + 1) * step)):
            s_row = src[r]
            e0 = eptr[r]
            c = width + eptr[r + 1] - e0
            for t in range(c):
                if t < width:
                    j = ids[s_row, t]
                    if j >= 0 and renumber:
                        j = renum[j]
                    v = fvals[s_row, t] * penalty[j] if j >= 0 else -np.inf
                else:
                    v = ew[e0 + t - width]
                    j = ei[e0 + t - width]
                if not np.isfinite(v):
                    j = n_all
                key = (j << shift) | t
                # insertion: the list part arrives nearly sorted
                p = t
                while p > 0 and (cv[p - 1] < v or (cv[p - 1] == v and ck[p - 1] > key)):
                    cv[p] = cv[p - 1]
                    ck[p] = ck[p - 1]
                    p -= 1
                cv[p] = v
                ck[p] = key
            bar = lim[r]
            count = 0
            top = min(width, c)
            while count < top and cv[count] > bar and cv[count] > 0:
                count += 1
            ok[r] = count >= need or limit[r] == 0.0
            nxt = 0.0
            if count < c and cv[count] > 0:
                nxt = float(cv[count])
            new_cut[r] = max(limit[r], nxt)
            for t in range(width):
                if t < count:
                    slot = ck[t] & low
                    new_i[r, t] = ck[t] >> shift
                    new_f[r, t] = fvals[s_row, slot] if slot < width else ef[e0 + slot - width]
                else:
                    new_i[r, t] = -1
                    new_f[r, t] = 0


@_jit(parallel=True)
def edge_counts_kernel(fvals: Any, ids: Any, penalty: Any, k: Any, counts: Any) -> None:  # pragma: no cover
    """``counts[r]``: the positive weights among the first ``k`` entries of row ``r``'s list."""
    for r in prange(ids.shape[0]):
        n = 0
        for t in range(k):
            j = ids[r, t]
            if j >= 0 and fvals[r, t] * penalty[j] > 0:
                n += 1
        counts[r] = n


@_jit(parallel=True)
def edges_kernel(
    fvals: Any,
    ids: Any,
    penalty: Any,
    k: Any,
    crow: Any,
    col: Any,
    val: Any,
    old_crow: Any,
    old_col: Any,
    src: Any,
    renum: Any,
    chunks: Any,
    changed: Any,
) -> None:  # pragma: no cover - compiled
    """Row ``r``'s edges of ``T`` (the positive weights of its list's first ``k`` entries, by
    ascending column, divided by their sum taken in that order) into ``col`` / ``val`` from
    ``crow[r]``; for the rows that had edges before (``r < src.shape[0]``), ``changed[r]``: whether
    the columns differ from the old row ``src[r]``'s (``old_col`` renumbered by ``renum`` where it
    is not empty, removed columns dropped).

    A row's new columns are mostly its old ones: they are found in the old row's (ascending)
    order through a per-thread mark of every column (``chunks`` of rows, one mark each), and only
    the columns it did not have are sorted and merged in."""
    renumber = renum.shape[0] > 0
    n_rows = ids.shape[0]
    n_cols = penalty.shape[0]
    step = (n_rows + chunks - 1) // chunks
    shift = 1
    while (1 << shift) <= k:
        shift += 1
    low = (1 << shift) - 1
    for ch in prange(chunks):
        mark = np.zeros(n_cols, dtype=np.int64)  # column -> 1 + its entry in the row, 0 = none
        cols = np.empty(k, dtype=np.int64)
        vals = np.empty(k, dtype=val.dtype)
        order = np.empty(k, dtype=np.int64)
        extra = np.empty(k, dtype=np.int64)
        for r in range(ch * step, min(n_rows, (ch + 1) * step)):
            o = crow[r]
            m = crow[r + 1] - o
            n = 0
            for t in range(k):
                j = ids[r, t]
                if j >= 0:
                    w = fvals[r, t] * penalty[j]
                    if w > 0:
                        cols[n] = j
                        vals[n] = w
                        mark[j] = n + 1
                        n += 1
            # the entries in the old row's column order, then the others (sorted), merged
            found = 0
            had = 0
            if r < src.shape[0]:
                s = src[r]
                for e in range(old_crow[s], old_crow[s + 1]):
                    j = old_col[e]
                    if renumber:
                        j = renum[j]
                        if j < 0:
                            continue
                    had += 1
                    if mark[j] > 0:
                        order[found] = mark[j] - 1
                        mark[j] = 0
                        found += 1
            n_extra = 0
            for e in range(m):
                if mark[cols[e]] > 0:
                    extra[n_extra] = (cols[e] << shift) | e  # column and entry in one key: one sort
                    mark[cols[e]] = 0
                    n_extra += 1
            if n_extra:
                part = extra[:n_extra]
                part.sort()
                for e in range(n_extra):
                    part[e] = part[e] & low
            # merge the two ascending runs: order[:found] and extra[:n_extra]
            a = 0
            b = 0
            total = val.dtype.type(0)
            for e in range(m):
                if b >= n_extra or (a < found and cols[order[a]] < cols[extra[b]]):
                    x = order[a]
                    a += 1
                else:
                    x = extra[b]
                    b += 1
                col[o + e] = cols[x]
                val[o + e] = vals[x]
                total += vals[x]
            for e in range(m):
                val[o + e] = val[o + e] / total
            if r < src.shape[0]:
                changed[r] = n_extra > 0 or found != had
