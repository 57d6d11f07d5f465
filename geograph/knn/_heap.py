"""The compiled kernels of :mod:`geograph.knn.select` (private; imported on first use: numba loads then).

Each list of ``k`` entries ``(value, id)`` has its worst entry at the root (index 0): a lower
value, or an equal value with a higher id (the tie rule: equal values keep the lowest id). Lists of
up to :data:`SORTED_UP_TO` entries are kept sorted worst first, longer ones as min-heaps (a sorted
list is a heap too). A candidate enters only when it beats the root (one comparison when it does
not), replacing it and moving past the entries it beats (:func:`sift`). Empty slots hold ``-inf``
and id ``-1``: a ``-inf`` candidate ties them with a higher id and never enters; NaN fails every
comparison and never enters. The kernels run their lists in parallel (``prange``); the lists a
call touches are distinct, so no two threads write one list.

numba caches the compiled kernels on disk (``cache=True``: the package's ``__pycache__``, or
numba's user cache); where no directory is writable (a read-only install) they compile in memory
once per process. They call no code of another file, so numba's cache key (this file) is enough.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import prange

log = logging.getLogger("geograph.ann")

#: lists of at most this many entries are kept sorted (worst first), longer ones as heaps
SORTED_UP_TO = 32

#: columns of a tile one thread of :func:`cols_kernel` takes at a time (their lists' roots stay in cache)
COL_CHUNK = 64


def _jit(**flags: Any) -> Callable[[Any], Any]:
    def decorate(fn: Any) -> Any:
        try:
            return numba.njit(cache=True, **flags)(fn)
        except RuntimeError:  # "no locator available": no writable cache directory
            log.info("k-NN kernels: no writable numba cache directory; compiling in memory")
            return numba.njit(cache=False, **flags)(fn)

    return decorate


@_jit(inline="always")
def sift(hv: Any, hi: Any, v: Any, j: Any) -> None:  # pragma: no cover - compiled
    """Replace the root (the worst entry) of the list ``(hv, hi)`` by ``(v, j)`` and restore its
    order: a list of at most :data:`SORTED_UP_TO` entries is kept sorted, worst first (a sorted
    list is also a heap), and the new entry moves up past the entries it beats: a candidate that
    just beats the root (most of them) moves one or two places, without the data-dependent
    branches of a heap's sift (about 2x faster at ``k = 10``). Longer lists are heaps."""
    k = hv.shape[0]
    pos = 0
    if k <= SORTED_UP_TO:
        while pos + 1 < k and (hv[pos + 1] < v or (hv[pos + 1] == v and hi[pos + 1] > j)):
            hv[pos] = hv[pos + 1]
            hi[pos] = hi[pos + 1]
            pos += 1
        hv[pos] = v
        hi[pos] = j
        return
    while True:
        c = 2 * pos + 1
        if c >= k:
            break
        if c + 1 < k and (hv[c + 1] < hv[c] or (hv[c + 1] == hv[c] and hi[c + 1] > hi[c])):
            c += 1  # the worse child
        if hv[c] < v or (hv[c] == v and hi[c] > j):
            hv[pos] = hv[c]
            hi[pos] = hi[c]
            pos = c
        else:
            break
    hv[pos] = v
    hi[pos] = j


@_jit(inline="always")
def offer_row(hv: Any, hi: Any, s: Any, r: Any, cols: Any, scale: Any, me: Any) -> None:  # pragma: no cover
    """Tile row ``r`` of ``s`` offers ``s[r, c] (* scale[c])`` with id ``cols[c]`` to the list
    ``(hv, hi)``, skipping id ``me``. The scaled and unscaled scans are separate loops: a branch on
    ``scale`` inside the loop costs about 3x the scan's comparisons."""
    n_c = s.shape[1]
    top_v = hv[0]
    top_i = hi[0]
    if scale.shape[0] > 0:
        for c in range(n_c):
            v = s[r, c] * scale[c]
            if not v >= top_v:  # the common case: below the list's k-th (or NaN)
                continue
            j = cols[c]
            if (v == top_v and j >= top_i) or j == me:
                continue
            sift(hv, hi, v, j)
            top_v = hv[0]
            top_i = hi[0]
    else:
        for c in range(n_c):
            v = s[r, c]
            if not v >= top_v:
                continue
            j = cols[c]
            if (v == top_v and j >= top_i) or j == me:
                continue
            sift(hv, hi, v, j)
            top_v = hv[0]
            top_i = hi[0]


@_jit(inline="always")
def offer_columns(s: Any, pick: Any, ids: Any, scale: Any, lv: Any, li: Any, owners: Any) -> None:  # pragma: no cover
    """Tile column ``pick[p]`` offers ``s[r, pick[p]] (* scale[r])`` with id ``ids[r]`` to list
    ``owners[p]``, for every tile row ``r`` (the lists' roots read once and kept current)."""
    n_r = s.shape[0]
    n_p = pick.shape[0]
    top_v = np.empty(n_p, lv.dtype)
    top_i = np.empty(n_p, li.dtype)
    for p in range(n_p):
        top_v[p] = lv[owners[p], 0]
        top_i[p] = li[owners[p], 0]
    scaled = scale.shape[0] > 0
    for r in range(n_r):
        j = ids[r]
        if scaled:
            f = scale[r]
            for p in range(n_p):
                v = s[r, pick[p]] * f
                if not v >= top_v[p] or (v == top_v[p] and j >= top_i[p]):
                    continue
                o = owners[p]
                sift(lv[o], li[o], v, j)
                top_v[p] = lv[o, 0]
                top_i[p] = li[o, 0]
        else:
            for p in range(n_p):
                v = s[r, pick[p]]
                if not v >= top_v[p] or (v == top_v[p] and j >= top_i[p]):
                    continue
                o = owners[p]
                sift(lv[o], li[o], v, j)
                top_v[p] = lv[o, 0]
                top_i[p] = li[o, 0]


@_jit(nogil=True, parallel=True)
def rows_kernel(s: Any, cols: Any, scale: Any, lv: Any, li: Any, rows: Any, excl: Any) -> None:  # pragma: no cover
    """Tile row ``r`` offers ``s[r, c] (* scale[c])`` with id ``cols[c]`` to list ``rows[r]``, skipping ``excl[r]``."""
    for r in prange(s.shape[0]):
        offer_row(lv[rows[r]], li[rows[r]], s, r, cols, scale, excl[r])


@_jit(nogil=True, parallel=True)
def cols_kernel(s: Any, pick: Any, ids: Any, scale: Any, lv: Any, li: Any, owners: Any) -> None:  # pragma: no cover
    """Tile column ``pick[p]`` offers ``s[r, pick[p]] (* scale[r])`` with id ``ids[r]`` to list
    ``owners[p]``: chunks of :data:`COL_CHUNK` columns in parallel."""
    n_p = pick.shape[0]
    for chunk in prange((n_p + COL_CHUNK - 1) // COL_CHUNK):
        p0 = chunk * COL_CHUNK
        p1 = min(n_p, p0 + COL_CHUNK)
        offer_columns(s, pick[p0:p1], ids, scale, lv, li, owners[p0:p1])


@_jit(nogil=True, parallel=True)
def tile_kernel(
    s: Any, rows: Any, cols: Any, col_scale: Any, row_scale: Any, c0: Any, excl: Any, lv: Any, li: Any, threads: Any
) -> None:  # pragma: no cover
    """Both sides of one tile of a symmetric join in one parallel region: tile row ``r`` offers
    ``s[r, c] (* col_scale[c])`` with id ``cols[c]`` to list ``rows[r]`` for every column (skipping
    its own id when ``excl``), and each column ``c >= c0`` offers ``s[r, c] (* row_scale[r])`` with
    id ``rows[r]`` to list ``cols[c]`` for every row. The lists of ``rows`` and of ``cols[c0:]``
    must be distinct. The threads split the work by its size: column chunks of
    :data:`COL_CHUNK` dealt in turn, rows in contiguous ranges filling each thread up to an equal
    share of ``threads`` (the split is fixed by the shapes: the same lists whatever the timing)."""
    n_r, n_c = s.shape
    n_ch = (n_c - c0 + COL_CHUNK - 1) // COL_CHUNK
    nt = max(1, min(threads, n_r + n_ch))
    chunk_work = np.zeros(nt, np.float64)
    for ch in range(n_ch):
        chunk_work[ch % nt] += float(n_r) * float(min(n_c, c0 + (ch + 1) * COL_CHUNK) - (c0 + ch * COL_CHUNK))
    share = (float(n_r) * float(n_c) + chunk_work.sum()) / nt
    quota = np.maximum(share - chunk_work, 0.0)
    cum = np.zeros(nt + 1, np.float64)
    for t in range(nt):
        cum[t + 1] = cum[t] + quota[t]
    pick = np.arange(n_c)
    for t in prange(nt):
        r_lo = int(n_r * cum[t] / cum[nt] + 0.5) if cum[nt] > 0 else 0
        r_hi = int(n_r * cum[t + 1] / cum[nt] + 0.5) if cum[nt] > 0 else 0
        if t == nt - 1:
            r_hi = n_r
        for r in range(r_lo, r_hi):
            offer_row(lv[rows[r]], li[rows[r]], s, r, cols, col_scale, rows[r] if excl else -1)
        for ch in range(t, n_ch, nt):
            lo = c0 + ch * COL_CHUNK
            hi = min(n_c, lo + COL_CHUNK)
            offer_columns(s, pick[lo:hi], rows, row_scale, lv, li, cols[lo:hi])


@_jit(nogil=True, parallel=True)
def lists_kernel(values: Any, ids: Any, lv: Any, li: Any, rows: Any) -> None:  # pragma: no cover
    """List ``rows[r]`` is offered the entries ``(values[r, c], ids[r, c])`` (id ``-1``: none)."""
    n_r, n_c = values.shape
    for r in prange(n_r):
        hv = lv[rows[r]]
        hi = li[rows[r]]
        for c in range(n_c):
            v = values[r, c]
            j = ids[r, c]
            if j < 0 or not v >= hv[0] or (v == hv[0] and j >= hi[0]):
                continue
            sift(hv, hi, v, j)
