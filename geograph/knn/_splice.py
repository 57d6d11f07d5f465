"""The compiled splice of :func:`geograph.knn.update.union_update` (private; imported on first use: numba loads then).

An update of a k-NN graph's union graph keeps most rows' segments of the old edge list and makes a
few rows again. The torch path gathers the new edge list through several arrays of the edge count
(the spans' indices, the targets, the row ids, then a stack); the kernel writes each row's slots of
the result once, in parallel over the rows, with no array but the result. Cached on disk as the
other kernels (:mod:`geograph.knn._heap`).
"""

from __future__ import annotations

from typing import Any

from numba import prange

from geograph.knn._heap import _jit


@_jit(parallel=True)
def splice_kernel(
    old_dst: Any, pos: Any, a_dst: Any, start: Any, counts: Any, ptr: Any, out_src: Any, out_dst: Any
) -> None:  # pragma: no cover - compiled
    """Row ``r`` of the result takes the ``counts[r]`` targets that start at ``start[r]`` in the old
    targets ``old_dst`` followed by ``a_dst`` (the rows made again), renumbered by ``pos`` where
    ``pos`` is not empty (old targets only: ``a_dst`` is numbered already), into slots
    ``ptr[r] ..`` of ``out_dst``, and ``r`` into the same slots of ``out_src``."""
    e_old = old_dst.shape[0]
    renumber = pos.shape[0] > 0
    for r in prange(counts.shape[0]):
        o = ptr[r]
        s = start[r]
        for t in range(counts[r]):
            j = s + t
            if j >= e_old:
                v = a_dst[j - e_old]
            elif renumber:
                v = pos[old_dst[j]]
            else:
                v = old_dst[j]
            out_src[o + t] = r
            out_dst[o + t] = v
